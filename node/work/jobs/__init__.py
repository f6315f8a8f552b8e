"""Jobs: `node.db`'s work tables, the owner's durable record of its work.

A job is what a user submitted; a unit is one piece of it given to one worker (the
attempt of a single job, a round's share, a trial, a replica). Every state change is
a compare-and-set that names the states it starts from, checked against the tables
of `states`, so no code path can revive a finished job or undo a change another task
made. SQLite only: this package imports nothing else of `node`, so every part of
`node/work` may use it. `python -m node.work.jobs` writes docs/design/states.md.

- `states`: the states of jobs and units and the changes allowed between them, as data.
- `store`: jobs, units and receipts (`JobStore`): compare-and-set transitions, `new_id`.
- `rounds`: an elastic job's rounds: where each started, who contributed, what it cost.
- `trials`: a sweep job's trials: what each tried, where it ran, how it ended.
- `unit_keys`: unit keys kept across restarts, sealed at rest.
"""

from node.work.jobs.rounds import Round, RoundStore
from node.work.jobs.states import (
    FINAL_STATES,
    JOB_STATES,
    JOB_TRANSITIONS,
    LIVE_UNIT_STATES,
    UNIT_STATES,
    UNIT_TRANSITIONS,
    IllegalTransition,
)
from node.work.jobs.store import Job, JobStore, StaleJob, Unit, data_shas, new_id, sharded
from node.work.jobs.trials import Trial, TrialStore
from node.work.jobs.unit_keys import UnitKeys

__all__ = [
    "FINAL_STATES",
    "IllegalTransition",
    "JOB_STATES",
    "JOB_TRANSITIONS",
    "Job",
    "JobStore",
    "LIVE_UNIT_STATES",
    "Round",
    "RoundStore",
    "StaleJob",
    "Trial",
    "TrialStore",
    "UNIT_STATES",
    "UNIT_TRANSITIONS",
    "Unit",
    "UnitKeys",
    "data_shas",
    "new_id",
    "sharded",
]
