"""Elastic rounds on the wire: which share of a round a unit is, and the delta it returns.

An elastic (DiLoCo) job trains in rounds. Each round the owner offers units; a unit's
`RoundShare` (inside its sealed `WorkPackage`) names the round, the data slot it
trains, and the global weights it starts from. The worker answers with a
`RoundDelta` file (its `Result` signs the file's sha256): the pseudo-gradient
(start weights minus end weights) of the whole model as one flat float32 vector,
blockwise int8 or int4 (`protocol.tensors.CompressedTensor`) or plain float32.

The owner's `RoundUpdate` goes the other way: how the global weights changed from
one round to the next, in the job's codes, for a worker that holds the round before's.

The delta is bounded before it is sized: the caller passes the job's parameter count
(`numel`) from the model plan, and the limits allow nothing bigger. A delta for
another job, round or starting point is refused by name, as is one whose size or
values are off (NaN, Inf, codes outside -127..127 or -7..7, or codes of another
width than the job's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from protocol.checks import require, require_sha256
from protocol.codec import Limits, decode, encode
from protocol.errors import DecodeError
from protocol.ids import check_id
from protocol.schema import from_plain, to_plain
from protocol.tensors import decode_tensor, tensor_limits

#: a job's `elastic.compression`, and the width of its codes on the wire ("none": float32)
CODE_BITS = {"int8": 8, "int4": 4}
COMPRESSIONS = (*CODE_BITS, "none")
MAX_ROUND = 10**6
MAX_SLOT = 4096
_OVERHEAD = 4096  # the map's keys, ids and headers around `tensor`


@dataclass(frozen=True)
class RoundShare:
    """What makes a unit one worker's share of an elastic round (in `WorkPackage`).

    With `update_sha256`, the weights are also `base_sha256` (the round before
    theirs) plus that `RoundUpdate`: a worker that holds the base fetches the update
    instead of the weights. Both, or neither.

    With `start_delta_sha256` the share starts eagerly, before the outer step of the
    round before is taken: from `weights_sha256` (then the round before's global
    weights) minus `outer_lr` times that delta, the slot's own of the round before
    (`training.elastic.starts`)."""

    round: int  # 0-based
    slot: int  # the data slot: which batches this share trains on
    weights_sha256: str  # the global weights it starts from; one of the package's blobs
    base_sha256: str = ""  # the global weights of the round before those
    update_sha256: str = ""  # a RoundUpdate from them to these; one of the package's blobs
    start_delta_sha256: str = ""  # a RoundDelta of round - 1 and this slot; a package blob

    def check(self, path: str) -> None:
        require(0 <= self.round < MAX_ROUND, f"{path}.round", f"must be 0..{MAX_ROUND - 1}")
        require(0 <= self.slot < MAX_SLOT, f"{path}.slot", f"must be 0..{MAX_SLOT - 1}")
        require_sha256(self.weights_sha256, f"{path}.weights_sha256")
        require(
            bool(self.base_sha256) == bool(self.update_sha256),
            f"{path}.update_sha256",
            "comes with base_sha256, and only with it",
        )
        if self.update_sha256:
            require_sha256(self.base_sha256, f"{path}.base_sha256")
            require_sha256(self.update_sha256, f"{path}.update_sha256")
            require(self.round >= 1, f"{path}.update_sha256", "round 0 has no round before")
        if self.start_delta_sha256:
            require_sha256(self.start_delta_sha256, f"{path}.start_delta_sha256")
            require(self.round >= 1, f"{path}.start_delta_sha256", "round 0 has no round before")


@dataclass(frozen=True)
class RoundDelta:
    """One worker's pseudo-gradient for one round: the file its `Result` names."""

    TYPE: ClassVar[str] = "round_delta"
    VERSION: ClassVar[int] = 1

    job_id: str
    round: int
    slot: int
    base_sha256: str  # the global weights the worker started from
    numel: int  # elements of the flat delta (the model's floating-point state)
    compression: str  # int8/int4: `tensor` is an encoded CompressedTensor; "none": float32
    tensor: bytes
    steps: int  # inner steps trained

    def check(self, path: str) -> None:
        check_id(self.job_id, f"{path}.job_id")
        require(0 <= self.round < MAX_ROUND, f"{path}.round", f"must be 0..{MAX_ROUND - 1}")
        require(0 <= self.slot < MAX_SLOT, f"{path}.slot", f"must be 0..{MAX_SLOT - 1}")
        require_sha256(self.base_sha256, f"{path}.base_sha256")
        require(self.numel >= 1, f"{path}.numel", "must be >= 1")
        require(self.steps >= 0, f"{path}.steps", "must be >= 0")
        require(
            self.compression in COMPRESSIONS,
            f"{path}.compression",
            f"must be one of {', '.join(COMPRESSIONS)}",
        )
        if self.compression == "none":
            require(
                len(self.tensor) == 4 * self.numel,
                f"{path}.tensor",
                f"must hold {self.numel} float32 values; it has {len(self.tensor)} bytes",
            )

    def values(self) -> np.ndarray | Any:
        """The float32 vector ("none"), or the checked `CompressedTensor`."""
        if self.compression == "none":
            return np.frombuffer(self.tensor, dtype="<f4")
        return decode_tensor(self.tensor, tensor_limits(self.numel))


def delta_limits(numel: int) -> Limits:
    """Codec limits for a `RoundDelta` of `numel` elements in either compression."""
    inner = tensor_limits(numel)
    biggest = max(4 * numel, inner.max_bytes)
    return Limits(
        max_bytes=biggest + _OVERHEAD,
        max_depth=1,
        max_container_len=16,
        max_str_len=128,
        max_bin_len=biggest,
    )


def encode_round_delta(delta: RoundDelta) -> bytes:
    delta.check("RoundDelta")
    return encode({"t": RoundDelta.TYPE, "v": RoundDelta.VERSION, **to_plain(delta)})


def decode_round_delta(
    data: bytes,
    *,
    numel: int,
    job_id: str,
    round: int,
    base_sha256: str | None,
    compression: str,
    slot: int | None = None,
) -> RoundDelta:
    """Parse and check a delta file against what the owner expects of it: this job,
    this round (and `slot`, when given), these starting weights (any, for None), the
    job's compression, `numel` elements, finite values. Raises `TooLarge` or
    `DecodeError` naming what is wrong."""
    expected: dict[str, Any] = {
        "job_id": job_id,
        "round": round,
        "base_sha256": base_sha256,
        "compression": compression,
        "numel": numel,
        "slot": slot,
    }
    expected = {name: want for name, want in expected.items() if want is not None}
    delta = _read_file(data, RoundDelta, "round delta", numel, expected)
    values = delta.values()
    if delta.compression == "none":
        if not np.isfinite(values).all():
            raise DecodeError("RoundDelta.tensor holds NaN or Inf")
    else:
        _check_codes(values, "RoundDelta", numel, CODE_BITS[delta.compression])
    return delta


def _check_codes(values: Any, what: str, numel: int, bits: int) -> None:
    if values.shape != [numel]:
        raise DecodeError(f"{what}.tensor has shape {values.shape}, expected [{numel}]")
    if values.bits != bits:
        raise DecodeError(f"{what}.tensor has {values.bits}-bit codes; this job sends {bits}")


@dataclass(frozen=True)
class RoundUpdate:
    """How the global weights changed from one round to the next, in the job's codes
    (the owner's file; `training.elastic.updates` says how it is made and applied)."""

    TYPE: ClassVar[str] = "round_update"
    VERSION: ClassVar[int] = 1

    job_id: str
    round: int  # the round whose global weights it gives (>= 1)
    base_sha256: str  # the round before's global weights, which it applies to
    weights_sha256: str  # what applying it gives
    numel: int  # elements of the flat change (the model's floating-point state)
    tensor: bytes  # an encoded CompressedTensor of `numel` values

    def check(self, path: str) -> None:
        check_id(self.job_id, f"{path}.job_id")
        require(1 <= self.round < MAX_ROUND, f"{path}.round", f"must be 1..{MAX_ROUND - 1}")
        require_sha256(self.base_sha256, f"{path}.base_sha256")
        require_sha256(self.weights_sha256, f"{path}.weights_sha256")
        require(self.numel >= 1, f"{path}.numel", "must be >= 1")


def encode_round_update(update: RoundUpdate) -> bytes:
    update.check("RoundUpdate")
    return encode({"t": RoundUpdate.TYPE, "v": RoundUpdate.VERSION, **to_plain(update)})


def decode_round_update(
    data: bytes,
    *,
    numel: int,
    job_id: str,
    round: int,
    base_sha256: str,
    weights_sha256: str,
    compression: str,
) -> RoundUpdate:
    """Parse and check an update file against the share it came with: this job, this
    round, from these weights to those, `numel` elements, canonical blocks of the
    job's `compression` (int8 or int4). Raises `TooLarge` or `DecodeError` naming
    what is wrong."""
    expected = {
        "job_id": job_id,
        "round": round,
        "base_sha256": base_sha256,
        "weights_sha256": weights_sha256,
        "numel": numel,
    }
    if compression not in CODE_BITS:
        raise DecodeError(f"a job with compression {compression!r} has no round updates")
    update = _read_file(data, RoundUpdate, "round update", numel, expected)
    values = decode_tensor(update.tensor, tensor_limits(numel))
    _check_codes(values, "RoundUpdate", numel, CODE_BITS[compression])
    return update


F = TypeVar("F", RoundDelta, RoundUpdate)


def _read_file(data: bytes, cls: type[F], what: str, numel: int, expected: dict[str, Any]) -> F:
    """A `cls` file of at most `numel` values, its fields checked against `expected`
    (each mismatch named: `<Class>.<field> is <got>, expected <want>`)."""
    plain = decode(data, delta_limits(numel))
    if not isinstance(plain, dict) or plain.get("t") != cls.TYPE:
        raise DecodeError(f"not a {what} file")
    version = plain.pop("v", None)
    if type(version) is not int or version != cls.VERSION:  # True == 1 in Python
        raise DecodeError(f"{what}: only version {cls.VERSION} is read")
    plain.pop("t")
    message = from_plain(cls, plain)
    for name, want in expected.items():
        got = getattr(message, name)
        if name == "numel":
            require(got == want, f"{cls.__name__}.numel", f"is {got}; this model has {want}")
        else:
            why = f"is {repr(got)[:80]}, expected {want!r}"
            require(got == want, f"{cls.__name__}.{name}", why)
    return message
