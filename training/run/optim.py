"""Optimizer, learning-rate schedule and loss from the spec's `[optim]` table.

Schedules are a factor on `optim.lr` for step s (0-based) of n:
- constant: 1.
- warmup: (s + 1) / warmup_steps for the first warmup_steps steps, then 1.
- cosine: the same warmup (if any), then 0.5 x (1 + cos(pi x t)), where t runs from 0
  at the end of warmup to 1 at step n, so the rate decays to 0 over the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from training.run.no_dynamo import skip_dynamo_wrappers
from training.spec.optim import OptimSpec

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_optimizer(spec: OptimSpec, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The spec's optimizer over the parameters that train (`model.trainable`); step it
    with `training.run.no_dynamo.optimizer_step`."""
    skip_dynamo_wrappers()
    params = [p for p in params if p.requires_grad]
    if spec.name == "sgd":
        return torch.optim.SGD(
            params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    if spec.name == "adam":
        return torch.optim.Adam(params, lr=spec.lr, weight_decay=spec.weight_decay)
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay)


def lr_factor(spec: OptimSpec, step: int, total: int) -> float:
    """The schedule's multiplier on `optim.lr` at 0-based `step` of `total`."""
    warmup = spec.warmup_steps if spec.schedule != "constant" else 0
    if step < warmup:
        return (step + 1) / warmup
    if spec.schedule == "cosine":
        progress = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def make_schedule(
    spec: OptimSpec, optimizer: torch.optim.Optimizer, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(spec, step, total))


def make_loss(name: str, task: str) -> LossFn:
    """A loss over model outputs and targets, shaped for the task.

    classification: logits (B, K) vs labels (B,); lm: logits (B, C, V) vs ids (B, C);
    regression: outputs (B, 1) or (B, k) vs targets (B,) or (B, k).
    """
    if task == "lm":

        def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

        return lm_loss
    if name == "cross_entropy":
        return nn.functional.cross_entropy
    base = nn.functional.mse_loss if name == "mse" else nn.functional.l1_loss

    def regression_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return base(out.reshape(y.shape), y)

    return regression_loss
