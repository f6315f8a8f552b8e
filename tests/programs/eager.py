"""An eager module trained through meshminer's own loop, as a runner trains a program:
the same prepared data, seed, batches, optimizer and schedule. What a program's weights
are compared with, bit for bit."""

from __future__ import annotations

import torch

from training.run.execute import deterministic, prepare
from training.run.loop import train
from training.spec.job import JobSpec


def train_eager(spec: JobSpec, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Train `module` in place on `spec` (converted and bound); returns its state dict."""
    run = prepare(spec, None)
    with deterministic(spec.seed):
        train(
            module,
            run.data,
            spec,
            loss_name=run.summary.loss,
            batch=run.summary.batch_size,
            total_steps=run.summary.total_steps,
            device=run.device,
            emit=lambda event: None,
        )
    return module.state_dict()
