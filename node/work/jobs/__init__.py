"""PACKAGE node.work.jobs.

Modules:

    rounds            An elastic job's rounds in node.db: where each started, who
                      contributed, what it cost.
    store             Jobs, their units and receipts in `node.db`: the owner's durable
                      record of work.
    trials            A sweep job's trials in node.db: what each tried, where it ran,
                      how it ended.
    unit_keys         Unit keys kept across restarts, sealed at rest.
"""

from node.work.jobs.rounds import Round, RoundStore
from node.work.jobs.store import (
    FINAL_STATES,
    LIVE_UNIT_STATES,
    Job,
    JobStore,
    StaleJob,
    Unit,
    new_id,
)
from node.work.jobs.trials import Trial, TrialStore
from node.work.jobs.unit_keys import UnitKeys

__all__ = [
    "FINAL_STATES",
    "Job",
    "JobStore",
    "LIVE_UNIT_STATES",
    "Round",
    "RoundStore",
    "StaleJob",
    "Trial",
    "TrialStore",
    "Unit",
    "UnitKeys",
    "new_id",
]
