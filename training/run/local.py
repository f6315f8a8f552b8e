"""Train a spec on this machine, with no network: `meshminer train-local JOB.toml`.

Files are read where the spec names them (no blobs). The code path is the runner's
(`training.run.execute`), so the weights are bitwise equal to what a worker's runner
produces for the same spec and data bytes on the same kind of device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.run.loop import Emit
from training.spec.job import JobSpec


def train_local(
    spec: JobSpec, out: Path, emit: Emit | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Train `spec` here and write its weights to `out`; returns the result.

    `emit` receives the runner's events (`started`, `progress`, `result`). The device
    defaults to CPU, which is what makes the result reproducible by any CPU worker.
    An elastic spec is simulated (`training.elastic.simulate`): its result adds
    `rounds`, and the weights equal a network run's with a fixed set of workers. A
    sweep runs its trials one after another (`training.sweep.local.run_sweep`): its
    result adds `trials` and `best`, and `out` holds the best trial's weights.
    """
    from training.model.bind import bind_trainable
    from training.program.job import bind_local

    spec = bind_trainable(bind_local(spec))  # converted and counted, as the owner's node does
    if spec.mode == "sweep":
        from training.sweep.local import run_sweep

        return run_sweep(spec, Path(out), emit=emit, device=device)
    if spec.mode == "elastic":  # every worker of every round, in this process
        from training.elastic.simulate import simulate

        return simulate(spec, Path(out), device=device, emit=emit)
    from training.run.execute import run_job

    return run_job(spec, None, Path(out), device=device, emit=emit)
