"""Workers that cheat at training, built from our own training modules.

Each cheat trains (or does not) in the test process and produces what an honest
runner produces: a weights file and a checkpoint chain at the spec's checkpoint
steps, whose sha256 it then signs in its result. `benchmarks/trust.py` uses them
too."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from protocol.rounds import encode_round_delta
from training.elastic.rounds import round_delta, share_checkpoints, share_course
from training.evidence.checkpoints import (
    Course,
    TrainState,
    advance,
    checkpoint_file,
    course_of,
    initial_state,
    save_checkpoint,
)
from training.evidence.steps import checkpoint_steps
from training.model.weights import write_weights
from training.run.execute import Prepared, deterministic, prepare
from training.spec.job import JobSpec


@dataclass(frozen=True)
class Claim:
    weights: Path
    checkpoints: list[Path]  # in step order
    trained_steps: int


def train_claiming(spec: JobSpec, folder: Path, trains: Callable[[int], bool]) -> Claim:
    """Run `spec`'s steps, training only step s where `trains(s)` (1-based), and
    write the checkpoints an honest worker would claim for all of them."""
    run = prepare(spec, None, "cpu")
    course = course_of(run)
    wanted = checkpoint_steps(course.total_steps, spec.trust.checkpoints, spec.optim.validate_every)
    with deterministic(spec.seed):
        state = initial_state(run)
        files, trained = _chain(run, state, course, wanted, folder, trains)
        weights = folder / "weights.safetensors"
        write_weights(weights, state.model.state_dict(), run.metadata)
    return Claim(weights, files, trained)


def _chain(
    run: Prepared,
    state: TrainState,
    course: Course,
    wanted: list[int],
    folder: Path,
    trains: Callable[[int], bool],
) -> tuple[list[Path], int]:
    """Take `state` through `course`, training only where `trains(step)`, and write a
    checkpoint at each of the `wanted` steps; the files and the steps trained."""
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    trained = 0
    for step in range(course.total_steps + 1):
        if step and trains(step):
            state.step = step - 1  # the batch and schedule of this step
            advance(run, state, step, course)
            trained += 1
        if step in wanted:
            path = folder / checkpoint_file(step)
            save_checkpoint(path, state.model, state.optimizer, step, run.device)
            files.append(path)
    return files, trained


def lazy_share(
    spec: JobSpec, folder: Path, job_id: str, round_: int, slot: int, weights: Path
) -> Claim:
    """One share of an elastic round from the round's global `weights` (a worker new
    to the job: a fresh inner optimizer), training 10% of its H steps and claiming
    all; its `weights` is the `RoundDelta` file it sends."""
    run = prepare(spec, None, "cpu")
    course = share_course(run, slot, round_)
    with deterministic(spec.seed):
        state = initial_state(run, course)
        state.model.load_state_dict(load_file(str(weights)))
        torch.manual_seed(course.batch_seed)  # as the share's runner seeds its steps
        files, trained = _chain(
            run, state, course, share_checkpoints(run), folder, lambda s: s % 10 == 0
        )
    delta = round_delta(
        run,
        job_id=job_id,
        round_=round_,
        slot=slot,
        weights=weights,
        trained=state.model.state_dict(),
    )
    out = folder / "delta.bin"
    out.write_bytes(encode_round_delta(delta))
    return Claim(out, files, trained)


def honest(spec: JobSpec, folder: Path) -> Claim:
    return train_claiming(spec, folder, lambda step: True)


def lazy(spec: JobSpec, folder: Path, share: float = 0.1) -> Claim:
    """Trains `share` of the steps, spread evenly, and claims all."""
    every = round(1 / share)
    return train_claiming(spec, folder, lambda step: step % every == 0)


def initial_weights(spec: JobSpec, folder: Path) -> Claim:
    return train_claiming(spec, folder, lambda step: False)


def other_seed(spec: JobSpec, folder: Path) -> Claim:
    """Trains every step, correctly, of the same spec with another seed."""
    return honest(replace(spec, seed=spec.seed + 1), folder)


def skipping(
    spec: JobSpec, folder: Path, fraction: float, together: bool, rng: random.Random
) -> Claim:
    """Skips `fraction` of the steps: in one run of consecutive steps at a random
    place (`together`), or spread at random over the unit."""
    total = prepare(spec, None, "cpu").summary.total_steps
    count = max(1, round(fraction * total))
    if together:
        first = rng.randrange(1, total - count + 2)
        skipped = set(range(first, first + count))
    else:
        skipped = set(rng.sample(range(1, total + 1), count))
    return train_claiming(spec, folder, lambda step: step not in skipped)
