"""The global weights' way down: from one round to the next as a quantized change.

Sending each round's new global weights whole costs every worker 4 bytes a parameter
every round, about 80% of an elastic job's bytes. A worker that trained in the round
before already holds that round's weights, so it fetches only how they changed,
in the job's codes (`protocol.rounds.RoundUpdate`: blockwise int8, about a quarter
of the weights, or int4, an eighth), and a newcomer fetches the weights whole once.

The change is lossy, so a round's global weights are *defined* as what applying it
gives: the round before's weights plus the decoded change, in float32 on the CPU
(`apply_update`), on the owner after its outer step, on every worker and in
`train-local` alike, so all of them agree to the bit. What the codes could not
carry is kept by the owner (`RESIDUAL`, in the momentum file beside the outer
momentum) and added to the next round's change (error feedback): the outer steps'
movement is delayed by a round, never lost.

Jobs with `elastic.compression = "int8"` or `"int4"` do this; "none" keeps both
directions exact.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from protocol.rounds import RoundUpdate, decode_round_update, encode_round_update
from protocol.tensors import decode_tensor, encode_tensor, tensor_limits
from training.elastic.flat import flatten, float_names, unflatten
from training.errors import TrainingError
from training.model.weights import file_sha256, write_atomic, write_weights
from training.ops import (
    DEFAULT_BLOCK_SIZE,
    QuantizedTensor,
    dequantize_blockwise,
    from_wire,
    quantize_blockwise,
    to_wire,
)
from training.run.execute import Prepared

RESIDUAL = "residual"  # the momentum file's second tensor: the change not sent yet


def apply_update(start: torch.Tensor, change: QuantizedTensor) -> torch.Tensor:
    """The flat weights `change` leads to from `start`: one float32 addition per
    value, on the CPU, so that every node rounds the same."""
    return start.cpu().to(torch.float32) + dequantize_blockwise(change).cpu()


def compress_change(
    start: torch.Tensor, target: torch.Tensor, residual: torch.Tensor, bits: int
) -> tuple[QuantizedTensor, torch.Tensor, torch.Tensor]:
    """The `bits`-bit change from `start` towards `target` (plus what earlier rounds
    could not send, `residual`): the change, the weights it gives, and the new residual."""
    wanted = target - start + residual
    change = quantize_blockwise(wanted.cpu(), DEFAULT_BLOCK_SIZE, bits)
    applied = apply_update(start, change)
    return change, applied, wanted - (applied - start)


def write_update(
    out: Path,
    change: QuantizedTensor,
    bits: int,
    *,
    job_id: str,
    round_: int,
    base: str,
    weights: str,
) -> str:
    """The `RoundUpdate` file for round `round_` (from weights `base` to `weights`)."""
    update = RoundUpdate(
        job_id=job_id,
        round=round_,
        base_sha256=base,
        weights_sha256=weights,
        numel=change.codes.numel(),
        tensor=encode_tensor(to_wire(change, bits)),
    )
    write_atomic(out, encode_round_update(update))
    return file_sha256(out)


def rebuild_weights(
    run: Prepared, base: Path, update: Path, out: Path, *, job_id: str, round_: int, weights: str
) -> str:
    """Round `round_`'s global weights from the round before's (`base`) and the
    owner's update, written to `out` as the owner wrote them; their sha256 must be
    `weights` (else `TrainingError`)."""
    state = load_file(str(base), device="cpu")
    names = float_names(state, run.frozen)
    start = flatten(state, names)
    numel = start.numel()
    message = decode_round_update(
        update.read_bytes(),
        numel=numel,
        job_id=job_id,
        round=round_,
        base_sha256=file_sha256(base),
        weights_sha256=weights,
        compression=run.spec.elastic.compression if run.spec.elastic else "none",
    )
    change = from_wire(decode_tensor(message.tensor, tensor_limits(numel)))
    sha = write_weights(out, unflatten(state, names, apply_update(start, change)), run.metadata)
    if sha != weights:
        raise TrainingError(
            f"round {round_}'s weights rebuilt from the update are {sha[:12]}, "
            f"not the round's {weights[:12]}"
        )
    return sha
