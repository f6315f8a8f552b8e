"""Sweep: a sweep job's Optuna study, and its trials as specs.

Volunteers never see the study: the owner's driver (`node/work/owner/modes/sweep.py`)
asks it for trials, reports the validation values workers' heartbeats carry and tells
it how each trial ended; a trial reaches a worker as an ordinary single-job spec.
`study` and `trials` import no torch. docs/design/sweeps.md.

- `study`: the study, one journal file per job: samplers, pruners, ask, report, tell,
  importances.
- `trials`: one trial as the `JobSpec` a worker trains.
- `local`: `train-local` of a sweep: every trial in this process, with the same study.
"""
