"""Training: a job spec to trained weights, run by a node in a sandboxed subprocess.

`training` imports `protocol` and never `node`. Its packages' `__init__` files are
maps and import nothing, because their modules are entry points run with `python -m`
(`training.run.runner`, `training.run.forkserver`, `training.evidence.check_weights`)
that must load only what their task needs, and because the daemon, which reads specs
and checks results, must not load a module that builds a model. (`program/` and
`ops/` are libraries and re-export their API.)

What the rest of meshminer calls:
- `training.spec.job`: `load_spec`, `parse_spec`, `spec_to_plain`, `SpecError`.
- `training.budget`: `validate_for_submit`: a spec's summary and its limits.
- `training.run.runner`: `python -m training.run.runner`, the sandboxed subprocess.
- `training.run.local`: `train_local` (`meshminer train-local`).
- `training.program`: `check_pt2` (`meshminer.export`) and `convert_pt2`.

The map:
- `budget`: how big and how costly a job is, and the limits it must stay under.
- `errors`: `SpecError` (the job is wrong) and `TrainingError` (a valid job failed).
- `spec/`: the job spec, read from TOML and checked, with no torch.
- `model/`: a spec's model: planned and counted before any tensor exists, then built;
  weights as deterministic safetensors.
- `data/`: data sources, readers that run no code, the split and the batches.
- `run/`: the runner subprocess, its isolation, the train loop, the fork server,
  `train-local`.
- `elastic/`: DiLoCo rounds: the arithmetic and the runner's tasks.
- `sweep/`: a sweep's Optuna study and its trials.
- `evidence/`: checkpoints, replays and result checks, for spot checks.
- `program/`: users' own PyTorch models, as checked graphs.
- `ops/`: GPU kernels (Triton), each with a pure-torch reference.

docs/jobspec.md is the spec's reference; docs/architecture.md shows how a node uses
all of this.
"""
