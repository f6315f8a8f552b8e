"""The train loop: seeded, deterministic, throttled progress, evaluation at the end
(and every `optim.validate_every` steps, reported with the progress).

Batches come from a `torch.Generator` seeded from the job's seed: each epoch is a
fresh permutation of the training split cut into full batches (the remainder is
skipped), so the sequence of batches depends on nothing but the seed and the data.
Reported figures:
- `train_loss`: the mean training-batch loss over the last 10% of steps (at least 1);
- `val_loss` (and `val_accuracy` for classification): one pass over the validation
  split in eval mode after the last step (for text: its non-overlapping windows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.data.batches import Dataset, Split
from training.errors import TrainingError
from training.run.no_dynamo import optimizer_step
from training.run.optim import LossFn, make_loss, make_optimizer, make_schedule
from training.spec.job import JobSpec

Emit = Callable[[dict[str, Any]], None]
OnStep = Callable[[int, torch.optim.Optimizer], None]
PROGRESS_INTERVAL_S = 0.25
SHUFFLE_SEED_OFFSET = 1  # the split uses the seed itself; shuffling the next one


@dataclass(frozen=True)
class LoopResult:
    steps: int
    samples: int
    metrics: dict[str, float]


def batches(n: int, batch: int, seed: int) -> Any:
    """Endless index batches: a seeded permutation per epoch, cut into full batches.
    (`seed` is the job's seed; the shuffle is seeded with the next number.)"""
    generator = torch.Generator().manual_seed(seed + SHUFFLE_SEED_OFFSET)
    per_epoch = n // batch
    while True:
        order = torch.randperm(n, generator=generator)
        for i in range(per_epoch):
            yield order[i * batch : (i + 1) * batch]


def train(
    model: nn.Module,
    data: Dataset,
    spec: JobSpec,
    *,
    loss_name: str,
    batch: int,
    total_steps: int,
    device: torch.device,
    emit: Emit,
    optimizer: torch.optim.Optimizer | None = None,
    batch_seed: int | None = None,
    validate: bool = True,
    on_step: OnStep | None = None,
    start_step: int = 0,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    final_validation: bool = True,
) -> LoopResult:
    """Train `model` in place for `total_steps` steps; emits `progress` events.

    An elastic round passes its own `optimizer` (the inner state a worker keeps from
    round to round), the `batch_seed` of its data slot, and `validate=False` (the
    owner validates the global weights after its outer step). `on_step(step,
    optimizer)` is called before the first step (step 0) and after every step: the
    checkpoints a worker keeps as evidence (`training.evidence.checkpoints`) are written there.
    A unit resumed from a state passes its `optimizer`, its `schedule` and the
    `start_step` it holds (`training.evidence.checkpoints.load_checkpoint`): the
    steps after it are those an uninterrupted run takes, bit for bit. Without
    `final_validation` the trained weights are not evaluated at the end (the owner of
    a spot-checked unit evaluates them itself)."""
    loss_fn = make_loss(loss_name, data.info.task)
    if optimizer is None:
        optimizer = make_optimizer(spec.optim, model.parameters())
    if schedule is None:
        schedule = make_schedule(spec.optim, optimizer, total_steps)
    deadline = time.monotonic() + spec.requirements.max_hours * 3600
    tail_from = total_steps - max(1, total_steps // 10)
    tail_sum = torch.zeros((), device=device)
    start = last_report = time.monotonic()
    model.train()
    index_batches = batches(len(data.train), batch, spec.seed if batch_seed is None else batch_seed)
    for _ in range(start_step):  # the batches before a resumed state: permutations only
        next(index_batches)
    if on_step is not None:
        on_step(start_step, optimizer)
    for step in range(start_step + 1, total_steps + 1):
        x, y = data.train.batch(next(index_batches))
        loss = train_step(model, loss_fn, optimizer, schedule, x.to(device), y.to(device), spec)
        if on_step is not None:
            on_step(step, optimizer)
        if step > tail_from:
            tail_sum += loss.detach()
        now = time.monotonic()
        every = spec.optim.validate_every
        checkpoint = validate and every and step % every == 0 and step < total_steps
        if now - last_report >= PROGRESS_INTERVAL_S or step == total_steps or checkpoint:
            last_report = now
            event = {
                "event": "progress",
                "step": step,
                "total_steps": total_steps,
                "loss": _finite(loss.item(), step),
                "samples_per_s": (step - start_step) * batch / max(now - start, 1e-9),
                "samples": (step - start_step) * batch,
            }
            if checkpoint and data.val is not None:  # eval mode draws no random numbers
                found = evaluate(
                    model, data.val, loss_fn, batch, device, data.info.task, spec.optim.precision
                )
                model.train()
                event |= {"val_step": step, **found}
            emit(event)
        if now > deadline:
            raise TrainingError(
                f"stopped at step {step} of {total_steps}: the job ran past "
                f"requirements.max_hours ({spec.requirements.max_hours:g})"
            )
    tail = total_steps - max(tail_from, start_step)
    metrics = {"train_loss": _finite(tail_sum.item() / max(tail, 1), total_steps)}
    if validate and final_validation and data.val is not None:
        metrics.update(
            evaluate(model, data.val, loss_fn, batch, device, data.info.task, spec.optim.precision)
        )
    trained = total_steps - start_step
    return LoopResult(trained, trained * batch, metrics)


def train_step(
    model: nn.Module,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: JobSpec,
) -> torch.Tensor:
    """One optimizer step on one batch; the same code for training and for a replay
    of it (`training.evidence.checkpoints.advance`), so both give the same bits."""
    with autocast(spec.optim.precision, x.device):
        loss = forward_loss(model, loss_fn, x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if spec.optim.grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), spec.optim.grad_clip)
    optimizer_step(optimizer)
    schedule.step()
    return loss


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """`optim.precision`: bf16 runs the forward and the loss under autocast (matrix
    products and convolutions in bfloat16, reductions and the weights in float32)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def forward_loss(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor) -> Any:
    """The batch's loss: the model's output scored by `loss_fn`, or, for a program that
    returns its own loss (`model.output = "loss"`), the model's output itself."""
    if getattr(model, "returns_loss", False):
        return model(x, y)
    return loss_fn(model(x), y)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: Split,
    loss_fn: LossFn,
    batch: int,
    device: torch.device,
    task: str,
    precision: str = "fp32",
) -> dict[str, float]:
    """Mean loss (and accuracy for classification) over `split`, in eval mode.

    A program exported with a fixed batch size is evaluated on full batches only."""
    model.eval()
    total_loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    order = split.eval_index()
    fixed = getattr(model, "fixed_batch", 0)
    if fixed:
        order = order[: order.shape[0] - order.shape[0] % batch]
    n = order.shape[0]
    if n == 0:
        raise TrainingError(f"the validation split has fewer samples than the batch ({batch})")
    own_loss = getattr(model, "returns_loss", False)
    for begin in range(0, n, batch):
        index = order[begin : begin + batch]
        x, y = split.batch(index)
        x, y = x.to(device), y.to(device)
        with autocast(precision, device):
            out = model(x, y) if own_loss else model(x)
            loss = out if own_loss else loss_fn(out, y)
        total_loss += loss.double() * index.shape[0]
        if task == "classification" and not own_loss:
            correct += (out.argmax(dim=-1) == y).sum()
    model.train()
    metrics = {"val_loss": _finite(total_loss.item() / n, -1)}
    if task == "classification" and not own_loss:
        metrics["val_accuracy"] = correct.item() / n
    return metrics


def _finite(value: float, step: int) -> float:
    if not math.isfinite(value):
        where = f"by step {step}" if step >= 0 else "on the validation split"
        raise TrainingError(
            f"the loss became {value} {where}; lower optim.lr or set optim.grad_clip"
        )
    return value
