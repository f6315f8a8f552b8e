"""Where a share starts: the round's global weights, or eagerly, before they exist.

A worker that sent slot s's delta of round r would otherwise wait for the round's
last delta, its check and the outer step before it could train round r + 1. An
eager start does not wait: slot s starts round r + 1 from the newest global weights
it can hold, round r's own, minus `outer_lr` times its own delta of round r, the
step the outer step would take if its delta were the round's mean (the "eager
updates" variant of DiLoCo).

That guess lacks the other workers' deltas; trained from all the way, it cost 1-7 %
of the final loss in jobs of 6-20 rounds (docs/design/elastic.md). So after
`ElasticSpec.takes_weights_at` steps, by when round r + 1's weights exist, the share
takes them (`take_weights`): every trained value moves by the new weights minus the
guess, and the share goes on as if it had started from them, its delta taken from
them. The outer step of round r + 1 then applies each delta to the weights it names.

The start and the move are computed, never sent: the worker, the owner's replay and
`train-local` each do them here, from the same files, with two correctly rounded
float32 operations per value (a product and a difference; a difference and a sum;
never fused), so all agree to the bit on any CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from protocol.errors import DecodeError, TooLarge
from protocol.rounds import CODE_BITS, decode_round_delta
from training.elastic.flat import flatten, float_names, unflatten
from training.errors import TrainingError
from training.model.weights import write_weights
from training.ops import dequantize_blockwise, from_wire
from training.run.execute import Prepared


def delta_vector(
    data: bytes, *, numel: int, job_id: str, round_: int, slot: int, compression: str
) -> torch.Tensor:
    """The float32 values of a `RoundDelta` of this job, round and slot, as the outer
    step reads them (dequantized codes, or the plain floats)."""
    try:
        delta = decode_round_delta(
            data,
            numel=numel,
            job_id=job_id,
            round=round_,
            base_sha256=None,
            compression=compression,
            slot=slot,
        )
    except (DecodeError, TooLarge) as exc:
        raise TrainingError(f"the share's start delta: {exc}") from None
    if compression in CODE_BITS:
        return dequantize_blockwise(from_wire(delta.values())).cpu().to(torch.float32)
    return torch.from_numpy(delta.values().copy())


def eager_start(
    run: Prepared, weights: Path, delta: Path, out: Path, *, job_id: str, round_: int, slot: int
) -> Path:
    """Slot `slot`'s start of round `round_`: the global `weights` of the round
    before minus `outer_lr` x the slot's `delta` of that round, written to `out`."""
    elastic = run.spec.elastic
    if elastic is None or round_ < 1:
        raise TrainingError("an eager start is a later round's of an elastic job")
    state = load_file(str(weights), device="cpu")
    names = float_names(state, run.frozen)
    params = flatten(state, names)
    values = delta_vector(
        delta.read_bytes(),
        numel=params.numel(),
        job_id=job_id,
        round_=round_ - 1,
        slot=slot,
        compression=elastic.compression,
    )
    step = torch.mul(values, elastic.outer_lr)
    write_weights(out, unflatten(state, names, torch.sub(params, step)), run.metadata)
    return out


def take_weights(run: Prepared, model: torch.nn.Module, start: Path, weights: Path) -> None:
    """Move an eager share's `model`, trained from `start` (its guess), as if it had
    started from the round's global `weights`: each float value (the delta's, by
    name) plus (`weights` - `start`). Its optimizer state stays as it is."""
    guess = load_file(str(start), device="cpu")
    target = load_file(str(weights), device="cpu")
    state = model.state_dict()
    with torch.no_grad():
        for name in float_names(guess, run.frozen):
            if name not in target or target[name].shape != guess[name].shape:
                raise TrainingError(f"the round's weights do not fit the share: {name}")
            state[name].add_(torch.sub(target[name], guess[name]).to(state[name].device))
