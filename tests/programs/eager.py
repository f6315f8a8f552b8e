"""An eager module trained through meshminer's own loop, as a runner trains a program:
the same prepared data, seed, batches, optimizer and schedule. What a program's weights
are compared with, bit for bit. Its dropout draws the portable masks a program's
interpreter draws (`portable_draws`), as a user's module would after the same swap."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from training.model import dropout as portable
from training.run.execute import deterministic, prepare
from training.run.loop import train
from training.spec.job import JobSpec


def train_eager(spec: JobSpec, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Train `module` in place on `spec` (converted and bound); returns its state dict."""
    run = prepare(spec, None)
    with deterministic(spec.seed), portable_draws():
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


@contextmanager
def portable_draws() -> Iterator[None]:
    """torch's dropout and attention replaced, for this block, by the interpreter's."""
    saved = F.dropout, F.scaled_dot_product_attention
    F.dropout = lambda x, p=0.5, training=True, inplace=False: portable.dropout(x, p, training)
    F.scaled_dot_product_attention = portable.scaled_dot_product_attention
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = saved
