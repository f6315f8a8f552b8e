"""PACKAGE node.work.run.

Modules:

    availability      Whether this node may train now, by its volunteer's preferences
                      (`node.preferences`).
    executor          Running one unit of training in its own subprocess (`python -m
                      training.run.runner`).
    forks             The node's side of `training.run.forkserver`: a warm parent that
                      forks runners.
    unit_folders      Finished units' folders are removed after a while.
"""

from node.work.run.availability import Availability, TrainingDays, keep_checking
from node.work.run.executor import UnitFailed, run_training, runner_env
from node.work.run.unit_folders import keep_sweeping, sweep

__all__ = [
    "Availability",
    "TrainingDays",
    "UnitFailed",
    "keep_checking",
    "keep_sweeping",
    "run_training",
    "runner_env",
    "sweep",
]
