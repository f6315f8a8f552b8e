"""PACKAGE training.sweep.

Modules:

    local             `train-local` of a sweep: the owner's study, trial after trial, in
                      this process.
    study             A sweep job's Optuna study: one file per job, driven ask-and-tell
                      by its owner only (`node/work/owner/modes/sweep.py`), or in memory
                      by `train-local` (`training/sweep/local.py`).
    trials            One trial of a sweep as the `JobSpec` a worker trains (see
                      `training.spec.sweep`).
"""
