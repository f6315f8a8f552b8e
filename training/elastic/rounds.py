"""Elastic (DiLoCo) rounds: the arithmetic, shared by the runner and `train-local`.

Three steps, each from files to files, so that a network run and the one-process
simulation (`training.elastic.simulate`) go through the same code and give
bitwise-equal weights:
- `init_weights`: round 0's global weights, built from the seed.
- `inner_round`: one worker's share of round r: the global weights, H steps of the
  inner optimizer on data slot s, with the optimizer state the worker kept from its
  last round (or a fresh one), and back comes start - end as one flat float32 vector
  (`protocol.rounds.RoundDelta`), blockwise int4 or int8, or plain.
- `outer_step`: the round's deltas, in slot order, averaged into one Nesterov step
  (`training.ops.outer_nesterov_step_` for quantized deltas), then the new global
  weights are evaluated on the validation split.

Data slots: slot s of round r draws its batches from a permutation seeded by a hash
of (seed, s, r). Which peer trains a slot does not matter, so a replacement for a
worker that left trains exactly the data the leaver would have.

The flat vector holds the model's floating-point state (parameters and float
buffers such as BatchNorm's running statistics) in state-dict name order; integer
buffers stay as in the global weights.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from protocol.rounds import CODE_BITS, RoundDelta, decode_round_delta
from training.elastic.flat import flatten, float_names, unflatten
from training.elastic.starts import take_weights
from training.elastic.updates import RESIDUAL, compress_change, write_update
from training.errors import TrainingError
from training.evidence.checkpoints import Course
from training.evidence.steps import share_checkpoint_steps
from training.evidence.writer import NO_BOUND, Hold
from training.model.modules import build_model
from training.model.weights import file_sha256, write_weights
from training.ops import (
    DEFAULT_BLOCK_SIZE,
    dequantize_blockwise,
    encode_delta,
    from_wire,
    outer_nesterov_step_,
)
from training.run.execute import (
    CheckpointPlan,
    Prepared,
    deterministic,
    train_with_evidence,
    validate,
)
from training.run.loop import Emit
from training.run.optim import make_optimizer
from training.spec.job import ElasticSpec, JobSpec

SIMULATED_JOB_ID = "0" * 16  # the job id train-local's deltas carry
MOMENTUM = "momentum"  # the one tensor of a momentum file


def slot_seed(seed: int, slot: int, round_: int) -> int:
    """The seed of slot `slot`'s batches (and dropout) in round `round_`: 63 bits."""
    digest = hashlib.sha256(f"meshminer.elastic/1:{seed}:{slot}:{round_}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def share_course(run: Prepared, slot: int, round_: int) -> Course:
    """What one share trains through: H inner steps on the slot's batches (the
    chain its checkpoints commit to, `training.evidence.checkpoints`)."""
    return Course(elastic_of(run.spec).inner_steps, slot_seed(run.spec.seed, slot, round_))


def share_checkpoints(run: Prepared) -> list[int]:
    return share_checkpoint_steps(elastic_of(run.spec).inner_steps, run.spec.trust.checkpoints)


def elastic_of(spec: JobSpec) -> ElasticSpec:
    if spec.elastic is None:
        raise TrainingError(f"job {spec.name!r} is not an elastic job (mode {spec.mode!r})")
    return spec.elastic


def numel_of(run: Prepared) -> int:
    """The length of this model's flat vector, from a model on the meta device."""
    with torch.device("meta"):
        state = build_model(run.plan).state_dict()
    return sum(state[n].numel() for n in float_names(state, run.frozen))


def init_weights(run: Prepared, out: Path) -> str:
    """Round 0's global weights (a fresh model from the seed); returns the sha256."""
    with deterministic(run.spec.seed):
        model = build_model(run.plan)
    return write_weights(out, model.state_dict(), run.metadata)


def _load_model(run: Prepared, weights: Path) -> torch.nn.Module:
    model = build_model(run.plan).to(run.device)
    try:
        model.load_state_dict(load_file(str(weights), device=str(run.device)), strict=True)
    except Exception as exc:  # an owner's weights that are not this model's
        raise TrainingError(f"the round's global weights do not fit the model: {exc}") from None
    return model


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    state = optimizer.state_dict()["state"]
    return {
        f"{index}.{key}": value if isinstance(value, torch.Tensor) else torch.tensor(value)
        for index, entries in state.items()
        for key, value in entries.items()
    }


def _load_optimizer(optimizer: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, _, key = name.partition(".")
        state.setdefault(int(index), {})[key] = value
    saved = optimizer.state_dict()
    saved["state"] = state
    optimizer.load_state_dict(saved)


@dataclass(frozen=True)
class InnerOutcome:
    delta: RoundDelta
    train_loss: float
    steps: int
    samples: int
    train_seconds: float  # in the inner steps alone (no start-up, no file work, no wait)
    evidence: dict[str, Any] = field(default_factory=dict)  # `execute.train_with_evidence`
    wait_seconds: float = 0.0  # waiting for the round's weights it takes on its way


def inner_round(
    run: Prepared,
    *,
    job_id: str,
    weights: Path,
    round_: int,
    slot: int,
    state_in: Path | None,
    state_out: Path,
    emit: Emit,
    checkpoint_dir: Path | None = None,
    hold: Hold = NO_BOUND,
    base_sha256: str | None = None,
    takes: Callable[[], Path] | None = None,
) -> InnerOutcome:
    """Train one share of a round from `weights`; the inner optimizer state goes from
    `state_in` (None: a worker new to this job starts fresh) to `state_out`. With
    `checkpoint_dir`, the training state is written there at `share_checkpoints`
    (never more of them at once than `hold` allows) and `InnerOutcome.evidence` lists
    the files' sha256. `base_sha256`: the global weights an eager start was built from
    (`training.elastic.starts`; default: `weights`' own). An eager share that `takes`
    the round's global weights calls it after `takes_weights_at` steps (it returns
    their file once they are there) and moves to them; its delta is then theirs."""
    spec = run.spec
    model = _load_model(run, weights)
    course = share_course(run, slot, round_)
    taken: list[Path] = []
    waited = 0.0
    at = elastic_of(spec).takes_weights_at

    def take(step: int, optimizer: torch.optim.Optimizer) -> None:
        nonlocal waited
        if step == at and takes is not None:
            began = time.monotonic()
            taken.append(takes())
            waited = time.monotonic() - began
            take_weights(run, model, weights, taken[0])

    with deterministic(course.batch_seed):
        optimizer = make_optimizer(spec.optim, model.parameters())
        if state_in is not None:
            try:
                _load_optimizer(optimizer, load_file(str(state_in), device=str(run.device)))
            except Exception as exc:  # our own file; a mismatch means start fresh, loudly
                raise TrainingError(f"the kept inner optimizer state does not fit: {exc}") from None
        began = time.monotonic()
        outcome, evidence = train_with_evidence(
            run,
            model,
            course.total_steps,
            CheckpointPlan(checkpoint_dir, share_checkpoints(run), hold),
            emit,
            optimizer=optimizer,
            batch_seed=course.batch_seed,
            validate=False,
            after_step=take if takes is not None else None,
        )
        train_seconds = time.monotonic() - began - waited
        # not synced: the worker's own start for its next share of the slot, written on
        # its critical path; a crash that loses it ends that share's continuity anyway
        inner = _optimizer_tensors(optimizer)
        write_weights(state_out, inner, {"format": "meshminer.inner/1"}, sync=False)
    if takes is not None and not taken:
        raise TrainingError("the share never reached the step where it takes the round's weights")
    message = round_delta(
        run,
        job_id=job_id,
        round_=round_,
        slot=slot,
        weights=taken[0] if taken else weights,
        trained=model.state_dict(),
        base_sha256=None if taken else base_sha256,
    )
    return InnerOutcome(
        message,
        outcome.metrics["train_loss"],
        outcome.steps,
        outcome.samples,
        train_seconds,
        evidence,
        waited,
    )


def round_delta(
    run: Prepared,
    *,
    job_id: str,
    round_: int,
    slot: int,
    weights: Path,
    trained: Mapping[str, torch.Tensor],
    base_sha256: str | None = None,
) -> RoundDelta:
    """The share's message: its start `weights` minus the `trained` state, as one
    flat vector, compressed as the job says, naming the global weights it started
    from (`base_sha256`; default: `weights`' own). A worker builds it after its H
    steps, and the owner's replay rebuilds it from the worker's last checkpoint, bit
    for bit (float32 subtraction rounds the same on every device)."""
    elastic = elastic_of(run.spec)
    start = load_file(str(weights), device="cpu")
    names = float_names(start, run.frozen)
    after = {name: trained[name].detach().cpu() for name in names}
    delta = flatten(start, names) - flatten(after, names)
    if elastic.compression in CODE_BITS:
        tensor = encode_delta(delta, DEFAULT_BLOCK_SIZE, CODE_BITS[elastic.compression])
    else:
        if not torch.isfinite(delta).all():
            raise TrainingError("the round's delta holds NaN or Inf; lower optim.lr")
        tensor = delta.numpy().astype("<f4").tobytes()
    return RoundDelta(
        job_id=job_id,
        round=round_,
        slot=slot,
        base_sha256=base_sha256 or file_sha256(weights),
        numel=delta.numel(),
        compression=elastic.compression,
        tensor=tensor,
        steps=elastic.inner_steps,
    )


def outer_step(
    run: Prepared,
    *,
    job_id: str,
    round_: int,
    weights: Path,
    momentum: Path | None,
    deltas: list[Path],
    out: Path,
    momentum_out: Path,
    update_out: Path | None = None,
    validate_weights: bool = True,
    bases: list[str] | None = None,
) -> dict[str, float]:
    """Average `deltas` (already in slot order) into one Nesterov step from `weights`
    (each delta from the global weights `bases` names, default `weights`: an eager
    share's are the round before's, `training.elastic.starts`);
    write the new global weights and momentum (and, for a quantized job, with
    `update_out`, the `RoundUpdate` that gives those weights from `weights`:
    `training.elastic.updates`); return the validation metrics (none without
    `validate_weights`: the owner validates in a task of its own, `evaluate_weights`,
    while the next round trains)."""
    elastic = elastic_of(run.spec)
    if not deltas:
        raise TrainingError(f"round {round_} has no deltas to apply")
    state = load_file(str(weights))
    names = float_names(state, run.frozen)
    params = flatten(state, names)
    start = params.clone()
    carried = load_file(str(momentum)) if momentum is not None else {}
    buffer = carried[MOMENTUM].to(torch.float32) if carried else torch.zeros_like(params)
    residual = carried.get(RESIDUAL, torch.zeros_like(params)).to(torch.float32)
    if buffer.shape != params.shape or residual.shape != params.shape:
        raise TrainingError(f"the momentum has {buffer.numel()} values, the model {params.numel()}")
    base = file_sha256(weights)
    bases = bases or [base] * len(deltas)
    if len(bases) != len(deltas):
        raise TrainingError(f"{len(deltas)} deltas but {len(bases)} bases")
    decoded = [
        decode_round_delta(
            path.read_bytes(),
            numel=params.numel(),
            job_id=job_id,
            round=round_,
            base_sha256=started,
            compression=elastic.compression,
        )
        for path, started in zip(deltas, bases, strict=True)
    ]
    bits = CODE_BITS.get(elastic.compression)
    if bits is not None:
        quantized = [from_wire(d.values()) for d in decoded]
        norms = [float(dequantize_blockwise(q).norm()) for q in quantized]
        for q, factor in zip(quantized, clip_factors(norms, elastic.delta_clip), strict=True):
            if factor < 1.0:
                q.scales.mul_(factor)
        outer_nesterov_step_(
            params, buffer, quantized, lr=elastic.outer_lr, momentum=elastic.outer_momentum
        )
    else:  # the same arithmetic as the int8 op's reference, on float32 deltas
        values = [torch.from_numpy(d.values().copy()) for d in decoded]
        norms = [float(v.norm()) for v in values]
        for v, factor in zip(values, clip_factors(norms, elastic.delta_clip), strict=True):
            if factor < 1.0:
                v.mul_(factor)
        grad = torch.stack(values).sum(dim=0)
        grad /= len(decoded)
        buffer.mul_(elastic.outer_momentum).add_(grad)
        params.add_(grad.add(buffer, alpha=elastic.outer_momentum), alpha=-elastic.outer_lr)
    carry = {MOMENTUM: buffer}
    if bits is not None and update_out is not None:
        change, params, carry[RESIDUAL] = compress_change(start, params, residual, bits)
    new_state = unflatten(state, names, params)
    sha = write_weights(out, new_state, run.metadata)
    if bits is not None and update_out is not None:
        write_update(
            update_out, change, bits, job_id=job_id, round_=round_ + 1, base=base, weights=sha
        )
    write_weights(momentum_out, carry, {"format": "meshminer.momentum/1"})
    return evaluate_weights(run, new_state) if validate_weights else {}


def evaluate_weights(run: Prepared, state: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """The validation metrics of the global weights `state` ({} without a split)."""
    if run.data.val is None:
        return {}
    model = build_model(run.plan).to(run.device)
    model.load_state_dict(state, strict=True)
    return validate(run, model)


def clip_factors(norms: list[float], clip: float) -> list[float]:
    """What each delta of a round is scaled by so that none is longer than `clip` x
    the round's median norm (the lower median: with two deltas, the shorter one).

    A bad delta (a cheat's, or a diverged worker's) then moves the global weights
    at most as far as `clip` honest ones would, until the worker is caught; honest
    deltas of one round have norms within a few percent of each other, so they are
    left exactly as they are (factor 1: the same bits as no clipping)."""
    if clip <= 0 or len(norms) < 2:
        return [1.0] * len(norms)
    bound = clip * sorted(norms)[(len(norms) - 1) // 2]
    return [bound / n if n > bound else 1.0 for n in norms]
