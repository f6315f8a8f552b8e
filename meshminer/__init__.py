"""meshminer's Python API: train on the network from a script or a notebook.

It talks to your own node's HTTP API (`meshminer node run` starts one), found as the
CLI finds it: `api=` or $MESHMINER_API (default http://127.0.0.1:8470), and its token
from `token=`, $MESHMINER_TOKEN or, for a node on this machine, its data dir.

    import meshminer
    job = meshminer.submit(model, batch, data="train.npz", mode="elastic",
                           elastic__workers=3)     # a module: exported, checked, uploaded
    job.wait()                                     # a progress bar until it completes
    job.load_into(model)                           # the trained weights

The map:

- `export(model, example_batch)` -> `Exported`: the module as the `torch.export`
  programs a node trains (train and eval mode), checked with the node's own rules
  (meshminer/exporting.py).
- `submit(model_or_exported_or_dict, ..., data=..., **spec_keys)` -> `Job`: a job spec
  built from arguments (meshminer/submission.py, meshminer/spec.py, written as TOML
  by meshminer/toml.py) and uploaded with its files (meshminer/multipart.py).
- `Job`, `job(id)`, `jobs()`: follow a job, read its rounds, trials and metrics, fetch
  its weights (meshminer/jobs.py; the progress bar in meshminer/progress.py).
- Errors, all `MeshminerError`: `NodeUnreachable` (no node answers), `NodeError` (the
  node refused; its message names the key), `JobFailed`, `ProgramRefused`
  (meshminer/errors.py). URL, token and HTTP: meshminer/connection.py.
"""

from meshminer.errors import (
    JobFailed,
    MeshminerError,
    NodeError,
    NodeUnreachable,
    ProgramRefused,
)
from meshminer.exporting import Exported, export
from meshminer.jobs import Job, job, jobs
from meshminer.submission import submit

__all__ = [
    "Exported",
    "Job",
    "JobFailed",
    "MeshminerError",
    "NodeError",
    "NodeUnreachable",
    "ProgramRefused",
    "export",
    "job",
    "jobs",
    "submit",
]
