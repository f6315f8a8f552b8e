"""Checkpoints as evidence: the full training state every k steps, and its replay.

A worker commits to the sha256 of its training state at the end of every segment of
k steps (`steps.checkpoint_steps`), in its heartbeats as it writes each (`writer`) and
again signed inside its result, and keeps only the files its owner still needs
(`node/work/trust/commitments.py`). The owner draws each segment once both its ends
are committed, fetches the state at a chosen segment's start and replays its steps
(`advance`): on one determinism class the
replayed state's file has the same sha256 as the worker's, bit for bit, because the
state file holds everything the next steps depend on (weights, optimizer state, the
RNG) and `training.model.weights` writes equal tensors as equal bytes. What is *not* in
the file is rebuilt from the spec: the order of batches (a seeded permutation per
epoch, skipped forward to the step) and the learning rate (the schedule at the step).
An elastic round's share is a chain of its own (`Course`): H steps, batches of its
data slot's seed, and a schedule over those H steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from training.budget import SpecSummary
from training.data.batches import Dataset
from training.errors import TrainingError
from training.model.modules import build_model
from training.model.plan import ModelPlan
from training.model.start import frozen_names
from training.model.weights import stream_weights
from training.run.loop import batches, train_step
from training.run.optim import lr_factor, make_loss, make_optimizer, make_schedule
from training.spec.job import JobSpec

CHECKPOINT_FORMAT = "meshminer.checkpoint/1"


class Prepared(Protocol):
    """What a checkpoint needs of a prepared run (`training.run.execute.Prepared`, which
    imports this module: hence the protocol, not the class)."""

    spec: JobSpec
    plan: ModelPlan
    summary: SpecSummary
    data: Dataset
    device: torch.device


_MODEL, _OPTIM, _RNG = "model.", "optim.", "rng."


@dataclass(frozen=True)
class Course:
    """What a chain of checkpoints trains through: its steps, and the seed of its
    batches. A single run's is the spec's (`course_of`); an elastic share's is the
    round's H inner steps on its data slot (`training.elastic.rounds.share_course`)."""

    total_steps: int
    batch_seed: int


def course_of(run: Prepared) -> Course:
    return Course(run.summary.total_steps, run.spec.seed)


def checkpoint_file(step: int) -> str:
    return f"checkpoint-{step:08d}.safetensors"


@dataclass
class TrainState:
    """Everything a training step reads and changes, at `step`."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    step: int


def state_tensors(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> dict[str, torch.Tensor]:
    """The flat, named tensors of a training state (what a checkpoint file holds): frozen
    parameters are left out, since they are the spec's init at every step."""
    frozen = frozen_names(model)
    tensors = {_MODEL + n: t for n, t in model.state_dict().items() if n not in frozen}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if value is None:
                continue
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            tensors[f"{_OPTIM}{index}.{key}"] = value
    tensors[_RNG + "cpu"] = torch.get_rng_state()
    if device.type == "cuda":
        tensors[_RNG + "cuda"] = torch.cuda.get_rng_state(device)
    return tensors


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, device: torch.device
) -> str:
    """Write the state at `step` (deterministic bytes); return the file's sha256.

    Not synced to disk: a checkpoint is read only after its runner has exited, and a
    crash loses the unit anyway; an fsync per checkpoint doubled a small unit's time."""
    return stream_weights(path, state_tensors(model, optimizer, device), checkpoint_metadata(step))


def checkpoint_metadata(step: int) -> dict[str, str]:
    return {"format": CHECKPOINT_FORMAT, "step": str(step)}


def initial_state(run: Prepared, course: Course | None = None) -> TrainState:
    """The state before step 1, as a fresh run of the spec builds it (call inside
    `training.run.execute.deterministic(spec.seed)`)."""
    course = course or course_of(run)
    model = build_model(run.plan).to(run.device)
    optimizer = make_optimizer(run.spec.optim, model.parameters())
    schedule = make_schedule(run.spec.optim, optimizer, course.total_steps)
    model.train()
    return TrainState(model, optimizer, schedule, 0)


def load_checkpoint(run: Prepared, path: Path, course: Course | None = None) -> TrainState:
    """The state a checkpoint file holds, ready to `advance`. Raises `TrainingError`
    when the file does not fit the spec's model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise TrainingError(f"checkpoint {path.name} is not readable: {exc}") from exc
    if metadata.get("format") != CHECKPOINT_FORMAT or not metadata.get("step", "").isdigit():
        raise TrainingError(f"checkpoint {path.name} is not a {CHECKPOINT_FORMAT} file")
    step = int(metadata["step"])
    course = course or course_of(run)
    state = initial_state(run, course)
    weights = {k[len(_MODEL) :]: v for k, v in tensors.items() if k.startswith(_MODEL)}
    try:
        missing, unexpected = state.model.load_state_dict(weights, strict=False)
        if unexpected or set(missing) - frozen_names(state.model):
            raise KeyError(f"tensors {sorted(unexpected)[:3]} extra, {sorted(missing)[:3]} missing")
        optim: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith(_OPTIM):
                index, name = key[len(_OPTIM) :].split(".", 1)
                optim.setdefault(int(index), {})[name] = value
        saved = state.optimizer.state_dict()
        state.optimizer.load_state_dict({"state": optim, "param_groups": saved["param_groups"]})
        torch.set_rng_state(tensors[_RNG + "cpu"])
        if run.device.type == "cuda" and _RNG + "cuda" in tensors:
            torch.cuda.set_rng_state(tensors[_RNG + "cuda"], run.device)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise TrainingError(f"checkpoint {path.name} does not fit this job's model: {exc}") from exc
    _move_schedule(state, run, step, course.total_steps)
    return state


def _move_schedule(state: TrainState, run: Prepared, step: int, total: int) -> None:
    """Put the learning-rate schedule where it stands after `step` steps, computed
    as `LambdaLR` computes it (the same floats)."""
    schedule = state.schedule
    schedule.last_epoch = step
    for group, base in zip(state.optimizer.param_groups, schedule.base_lrs, strict=True):
        group["lr"] = base * lr_factor(run.spec.optim, step, total)
    schedule._last_lr = [group["lr"] for group in state.optimizer.param_groups]  # type: ignore[attr-defined]
    state.step = step


def advance(run: Prepared, state: TrainState, to_step: int, course: Course | None = None) -> None:
    """Train `state` on from its step to `to_step`, as the training loop did."""
    course = course or course_of(run)
    if not state.step <= to_step <= course.total_steps:
        raise TrainingError(f"cannot advance from step {state.step} to {to_step}")
    spec = run.spec
    loss_fn = make_loss(run.summary.loss, run.data.info.task)
    index_batches = batches(len(run.data.train), run.summary.batch_size, course.batch_seed)
    for _ in range(state.step):  # the batches before this step: permutations only
        next(index_batches)
    state.model.train()
    for _ in range(state.step, to_step):
        x, y = run.data.train.batch(next(index_batches))
        x, y = x.to(run.device), y.to(run.device)
        train_step(state.model, loss_fn, state.optimizer, state.schedule, x, y, spec)
    state.step = to_step


def relative_distance(a: TrainState, b: TrainState) -> float:
    """The largest relative L2 distance between two states' weight tensors: what a
    check across determinism classes compares against its tolerance."""
    worst = 0.0
    theirs = b.model.state_dict()
    for name, mine in a.model.state_dict().items():
        if not mine.is_floating_point():
            continue
        other = theirs[name].to(mine.device, mine.dtype)
        scale = max(float(other.norm()), 1e-12)
        worst = max(worst, float((mine - other).norm()) / scale)
    return worst


def step_ratio(
    replayed: TrainState, before_last: dict[str, torch.Tensor], claimed: TrainState
) -> float:
    """The largest, over weight tensors, of |replayed - claimed| / |replayed - the state
    one step before|: how many of its own last steps the replay is from the claim. A
    tensor the last step left alone must be equal (else: inf)."""
    worst = 0.0
    theirs = claimed.model.state_dict()
    for name, mine in replayed.model.state_dict().items():
        if not mine.is_floating_point():
            continue
        off = float((mine - theirs[name].to(mine.device, mine.dtype)).norm())
        moved = float((mine - before_last[name]).norm())
        if off:
            worst = max(worst, off / moved if moved else math.inf)
    return worst
