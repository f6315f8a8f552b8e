"""Job modes: what a job of each kind does with its units, behind one interface.

The owner's engine (`node/work/owner/`) asks a job's mode whenever what happens
depends on the kind of job: how to drive it, what a unit's end, a heartbeat or a
checked result means, what a unit trains and earns, what survives a restart, what
the API shows. Nothing outside this package tests a unit's round or trial, or the
spec's `mode`. A new mode is one module with a `JobMode` subclass, added to `MODES`.

    mode      `JobMode` (every hook, with the `single` behaviour as its default),
              `ManyUnits` (units run by the job's own driver), `OwnerParts`
    single    one unit trains the whole job: placed, queued again when lost
    elastic   DiLoCo rounds: shares offered per data slot, deltas, the outer step
    round_tasks  an elastic job's runner tasks on its owner: first weights, outer
              step, evaluation
    early_weights  a round's next weights before its close: the early outer step,
              and the answers to the shares that take them on their way
    sweep     an Optuna study asked and told: each trial is a unit on a peer
"""

from node.work.owner.modes.elastic import ADAPTIVE_FACTOR, FIRST_ROUND_TIMEOUT_S, ElasticRounds
from node.work.owner.modes.mode import JobMode, ManyUnits, OwnerParts, credit_of
from node.work.owner.modes.single import MAX_ATTEMPTS, SingleJob, result_metrics
from node.work.owner.modes.sweep import SweepTrials, best_trial

#: the modes an owner runs, by default
MODES = (SingleJob, ElasticRounds, SweepTrials)

__all__ = [
    "ADAPTIVE_FACTOR",
    "FIRST_ROUND_TIMEOUT_S",
    "MAX_ATTEMPTS",
    "MODES",
    "ElasticRounds",
    "JobMode",
    "ManyUnits",
    "OwnerParts",
    "SingleJob",
    "SweepTrials",
    "best_trial",
    "credit_of",
    "result_metrics",
]
