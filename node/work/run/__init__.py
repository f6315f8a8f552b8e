"""Run: one task of training, in a subprocess of its own.

The daemon never trains: it writes one request (`request`) to a runner subprocess,
`python -m training.run.runner`, watches it (`executor`: the time limit, the
volunteer's duty cycle and pauses, the disk quota) and reads its JSON lines. A crash
or a hostile spec ends the subprocess, never the daemon. Imports nothing else of
`node/work`, so the worker's training and the owner's replays and outer steps share it.

- `request`: the request a runner reads, typed (`RunnerRequest`).
- `executor`: running one task in its own subprocess (`run_training`), forked from a
  warm server (`warm_runners`).
- `forks`: the node's side of `training.run.forkserver`, a warm parent that forks runners.
- `checks`: the owner's checks of a peer's file, forked by that server (`check_forked`).
- `availability`: whether this node may train now, by its volunteer's preferences.
- `guards`: the machine guards among them: hot, on battery, short of memory, a named
  program running; each with a margin before it lets training go on.
- `unit_folders`: a unit's folder, an elastic slot's kept inner state, and the removal
  of finished units' folders after a while.
"""

from node.work.run.availability import Availability, TrainingDays, keep_checking
from node.work.run.checks import check_forked
from node.work.run.executor import UnitFailed, run_training, runner_env, warm_runners
from node.work.run.request import (
    REBUILT_WEIGHTS,
    TAKEN_WEIGHTS,
    TAKES_NOTICE,
    RequestBuilder,
    RunnerRequest,
    share_request,
)
from node.work.run.unit_folders import (
    inner_state_for,
    keep_inner_state,
    keep_removing_old_folders,
    remove_old_unit_folders,
)

__all__ = [
    "REBUILT_WEIGHTS",
    "TAKEN_WEIGHTS",
    "TAKES_NOTICE",
    "Availability",
    "RequestBuilder",
    "RunnerRequest",
    "TrainingDays",
    "UnitFailed",
    "check_forked",
    "keep_checking",
    "keep_removing_old_folders",
    "inner_state_for",
    "keep_inner_state",
    "remove_old_unit_folders",
    "share_request",
    "run_training",
    "runner_env",
    "warm_runners",
]
