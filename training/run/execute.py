"""One job from spec to weights file: the path shared by the runner and `train_local`.

Order matters: the data is probed and the budget checked before torch allocates
anything, and everything random is seeded from the spec, so the same spec and the
same data bytes give bitwise-identical weights on the same device type and torch
build (CPU: also the same thread count).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.budget import SpecSummary, summarize
from training.data.batches import Dataset, load_dataset
from training.data.info import DataFiles, data_ref, probe
from training.errors import SpecError, TrainingError
from training.evidence.steps import checkpoint_steps
from training.evidence.writer import NO_BOUND, Hold, checkpoints_written
from training.model.modules import build_model
from training.model.plan import ModelPlan, plan_model
from training.model.weights import write_weights
from training.run.loop import Emit, LoopResult, OnStep, evaluate, train
from training.run.optim import make_loss
from training.spec.job import JobSpec

WEIGHTS_FORMAT = "meshminer.weights/1"
Locate = Callable[[str], Path]  # a blob's sha256 -> its file


def resolve_device(name: str) -> torch.device:
    """ "auto" is CUDA when available, else CPU; "cuda" without a GPU is an error."""
    if name not in ("auto", "cpu", "cuda"):
        raise SpecError(f"device must be auto, cpu or cuda; got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("device cuda was asked for, but torch sees no CUDA device")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


@contextlib.contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """Seed torch and demand deterministic kernels; restore the old setting afterwards."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it to be
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    _deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's CPU RNG state comes back
            torch.manual_seed(seed)
            yield
    finally:
        _deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark


def _deterministic_algorithms(mode: bool, warn_only: bool = False) -> None:
    """`torch.use_deterministic_algorithms`, without importing torch._inductor.

    The public call also sets inductor's `deterministic` flag, and importing inductor
    for that costs 1.5-2.5 s of CPU in every fresh runner. Training here never
    compiles, so the flag matters only where inductor is loaded already."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public call
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        return
    setter(mode, warn_only=warn_only)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = mode  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Prepared:
    """A spec's data loaded and its model planned and budgeted: what every kind of
    run (a single job, an elastic round's share, the owner's outer step) starts from."""

    spec: JobSpec
    plan: ModelPlan
    summary: SpecSummary
    data: Dataset
    device: torch.device
    metadata: dict[str, str]  # written into every weights file of the job
    frozen: frozenset[str] = frozenset()  # parameters model.trainable leaves out


def prepare(
    spec: JobSpec, data_file: DataFiles, device: str = "cpu", locate: Locate | None = None
) -> Prepared:
    """Probe and budget first (before torch allocates anything), then load the data.

    A program is read (`locate` finds its blob), checked against the spec's figures and
    dry-run on the meta device before any real tensor is made."""
    info = probe(spec, data_file)
    plan = plan_model(spec.model, info)
    summary = summarize(spec, info, plan)
    if plan.program is not None:
        from training.program.job import program_of

        plan = dataclasses.replace(plan, loaded=program_of(spec, locate)[0])
    frozen: frozenset[str] = frozenset()
    if spec.start.init is not None or spec.start.trainable:
        from training.model.start import load_start

        plan = dataclasses.replace(plan, start=load_start(spec, locate))
        frozen = _check_start(spec, plan)
    target = resolve_device(device)
    with deterministic(spec.seed):
        data = load_dataset(spec, data_ref(spec, data_file), plan.token_input)
    if data.info != info:
        raise TrainingError(f"the data read differently on load ({data.info}) than on probe")
    if plan.token_input and plan.layers:
        for split in (data.train, data.val):
            _check_token_range(split, plan.layers[0].kwargs["num_embeddings"])
    metadata = {
        "format": WEIGHTS_FORMAT,
        "name": spec.name,
        "arch": plan.arch,
        "seed": str(spec.seed),
        "task": info.task,
    }
    if data.vocab:
        metadata["vocab"] = json.dumps(data.vocab)
    return Prepared(spec, plan, summary, data, target, metadata, frozen)


def _check_start(spec: JobSpec, plan: ModelPlan) -> frozenset[str]:
    """Build the model once without memory to check the init against it and count what
    trains against the spec's figure; returns the frozen parameters' names."""
    from training.model.start import frozen_names, trainable_count

    with torch.device("meta"):
        model = build_model(plan)
    if spec.start.trainable and trainable_count(model) != spec.start.trainable_parameters:
        raise SpecError(
            f"model.trainable_parameters: the spec says {spec.start.trainable_parameters}, "
            f"model.trainable selects {trainable_count(model)}"
        )
    return frozen_names(model)


def run_job(
    spec: JobSpec,
    data_file: DataFiles,
    out: Path,
    *,
    device: str = "cpu",
    emit: Emit | None = None,
    notes: list[str] | None = None,
    checkpoint_dir: Path | None = None,
    hold: Hold = NO_BOUND,
    locate: Locate | None = None,
    resume: tuple[Path, int] | None = None,
    final_validation: bool = True,
) -> dict[str, Any]:
    """Train `spec` on its data (`data_file`, or the spec's own source) and write `out`.

    Emits `started`, `progress` and `result` events; returns the result (the `result`
    event without its "event" key). With `checkpoint_dir`, the training state is
    written there at every step of `checkpoint_steps` (spec.trust.checkpoints
    segments), never more of them at once than `hold` allows, and the result lists
    the files' sha256, in step order. With `resume` (a checkpoint file and its step),
    training goes on from that state as the uninterrupted run would; its chain starts
    there. Raises `SpecError` or `TrainingError`.
    """
    emit = emit or (lambda event: None)
    began = time.monotonic()
    run = prepare(spec, data_file, device, locate)
    steps = checkpoint_steps(
        run.summary.total_steps, spec.trust.checkpoints, spec.optim.validate_every
    )
    loop: dict[str, Any] = {"final_validation": final_validation}
    with deterministic(spec.seed):
        if resume is None:
            model = build_model(run.plan).to(run.device)
        else:
            state = resumed(run, *resume)
            model = state.model
            loop |= {"optimizer": state.optimizer, "schedule": state.schedule}
            loop["start_step"] = state.step
            steps = [step for step in steps if step >= state.step]
        emit_started(run, emit, notes)
        plan = CheckpointPlan(checkpoint_dir, steps, hold)
        outcome, kept = train_with_evidence(run, model, run.summary.total_steps, plan, emit, **loop)
        sha256 = write_weights(Path(out), model.state_dict(), run.metadata)
    result = {
        "steps": outcome.steps,
        "samples": outcome.samples,
        "wall_time_s": time.monotonic() - began,
        "device": run.device.type,
        "metrics": outcome.metrics,
        "weights_sha256": sha256,
        **kept,
    }
    emit({"event": "result", **result})
    return result


def resumed(run: Prepared, path: Path, step: int) -> Any:
    """The training state of a checkpoint another worker made (`TrainState`), which
    must be of a checkpoint step of this spec: a unit resumed from it goes on there."""
    from training.evidence.checkpoints import load_checkpoint

    state = load_checkpoint(run, path)
    if state.step != step:
        raise SpecError(f"request.resume: the state is of step {state.step}, not {step}")
    if not 0 < step < run.summary.total_steps:
        raise SpecError(f"request.resume.step {step} is not within the run's steps")
    return state


@dataclass(frozen=True)
class CheckpointPlan:
    """Where a run writes its checkpoints (None: it writes none), at which steps, and
    how many it may hold at once."""

    folder: Path | None
    steps: list[int]
    hold: Hold = NO_BOUND


def train_with_evidence(
    run: Prepared,
    model: torch.nn.Module,
    total_steps: int,
    plan: CheckpointPlan,
    emit: Emit,
    after_step: OnStep | None = None,
    **loop: Any,
) -> tuple[LoopResult, dict[str, Any]]:
    """`train` (`loop`: its other keywords) writing the checkpoints `plan` names, and
    calling `after_step` after each step's checkpoint (an eager share takes its round's
    weights there); its outcome, and what the result reports of the evidence: every
    checkpoint's sha256 and the most states (and bytes) its folder held at once
    (nothing without checkpoints)."""
    folder, steps, hold = plan.folder, plan.steps, plan.hold
    with checkpoints_written(run, model, folder, steps, emit, hold) as writer:
        on_step = writer.on_step if writer else None
        if after_step is not None:
            on_step = _in_turn(on_step, after_step)
        outcome = train(
            model,
            run.data,
            run.spec,
            loss_name=run.summary.loss,
            batch=run.summary.batch_size,
            total_steps=total_steps,
            device=run.device,
            emit=emit,
            on_step=on_step,
            **loop,
        )
        if writer is None:
            return outcome, {}
        shas = writer.close()
    return outcome, {"checkpoints": shas, "evidence_peak": dataclasses.asdict(writer.peak)}


def _in_turn(first: OnStep | None, then: OnStep) -> OnStep:
    def both(step: int, optimizer: torch.optim.Optimizer) -> None:
        if first is not None:
            first(step, optimizer)
        then(step, optimizer)

    return both


def validate(run: Prepared, model: torch.nn.Module) -> dict[str, float]:
    """The validation metrics of `model`, as the training loop reports them ({} without
    a validation split): a replay's check and the owner's outer step read them."""
    if run.data.val is None:
        return {}
    task = run.data.info.task
    loss_fn = make_loss(run.summary.loss, task)
    return evaluate(
        model,
        run.data.val,
        loss_fn,
        run.summary.batch_size,
        run.device,
        task,
        run.spec.optim.precision,
    )


def emit_started(run: Prepared, emit: Emit, notes: list[str] | None = None) -> None:
    started: dict[str, Any] = {
        "event": "started",
        "device": run.device.type,
        "total_steps": run.summary.total_steps,
        "parameters": run.summary.parameters,
    }
    if notes:
        started["notes"] = notes
    emit(started)


def _check_token_range(split: Any, num_embeddings: int) -> None:
    if split is None or not split.x.numel():
        return
    top = int(split.x.max())
    if top >= num_embeddings:
        raise SpecError(
            f"model.layers[0].num_embeddings is {num_embeddings}, but x holds token id {top}"
        )
