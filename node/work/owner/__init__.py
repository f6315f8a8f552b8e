"""The owner: what a node does for the jobs submitted to it.

`OwnerRole` (role) is the engine: it drives each queued job through its mode
(`modes/`), keeps the leases of the units out on workers, and answers their results.
Every unit and job change is a compare-and-set through the lifecycle, in the states
`node/work/jobs/states.py` allows. The modes are the only code that knows what kind
of job it runs; the engine's parts ask them.

    role            `OwnerRole`: the engine, training on this node, its guard
    lifecycle       what a unit's start or end does to its job, asked of its mode
    placement       the one offer path: candidates, offers, backoff, what an answer means
    worker_choice   choosing the one worker of a `single` job's unit (a pure function)
    leases          heartbeats, expiry, the `max_hours` deadline, restart recovery
    results         a worker's result: checked, fetched, spot-checked, then accepted
    result_files    a result's weights (or a share's delta) fetched and checked
    submission      what a submission's uploads become before its job exists
    modes/          `single`, `elastic`, `sweep` behind `JobMode`
"""

from node.work.owner.leases import Leases
from node.work.owner.lifecycle import Lifecycle, round_closed_reason
from node.work.owner.modes import MAX_ATTEMPTS, JobMode, best_trial
from node.work.owner.placement import BACKOFF_MAX_S, Backoff
from node.work.owner.role import OwnerRole
from node.work.owner.submission import SubmitError, with_uploaded_data, with_uploaded_model
from node.work.owner.worker_choice import SELF, choose_worker

__all__ = [
    "BACKOFF_MAX_S",
    "MAX_ATTEMPTS",
    "SELF",
    "Backoff",
    "JobMode",
    "Leases",
    "Lifecycle",
    "OwnerRole",
    "SubmitError",
    "best_trial",
    "choose_worker",
    "round_closed_reason",
    "with_uploaded_data",
    "with_uploaded_model",
]
