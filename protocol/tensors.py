"""`CompressedTensor`: a blockwise-int8 tensor on the wire (weight deltas, never weights).

Elastic jobs move weight *deltas* every round, and volunteer links are slow, so a
delta travels as int8 codes plus one float32 scale per block of `block_size`
elements: about a quarter of its float32 size (a half of bfloat16). Lossless
weights stay safetensors (`training.model.weights`); this encoding is lossy and used
only where the training side has chosen that loss (see docs/ops.md for the bound).

Wire form: one msgpack map ``{t, v, shape, dtype, block_size, codes, scales}``;
`codes` holds ``prod(shape)`` int8 values in row-major order, `scales` holds
``ceil(prod(shape) / block_size)`` little-endian float32 values. Element ``i``
decodes to ``codes[i] * scales[i // block_size]``, rounded to `dtype`.

Everything is bounded before anything is sized from the message: the codec's
`Limits` cap the bytes (so the two byte strings are already bounded when they are
read), and `shape` is accepted only when its product equals the codes' length,
computed with an early stop so that a hostile shape costs nothing. Values are
checked too, so that only canonical tensors are accepted: every scale finite and
positive (a delta that held NaN or Inf cannot be sent, see `training.ops.wire`),
and no code is -128 (the quantizer uses -127..127, symmetric around zero).

This module needs numpy, never torch; `training.ops.wire` converts to tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from protocol.checks import require
from protocol.codec import Limits, decode, encode
from protocol.errors import DecodeError
from protocol.schema import from_plain, to_plain

#: the element types a compressed tensor decodes to (safetensors' spelling)
DTYPES = ("F32", "BF16", "F16")
#: block sizes are powers of two in this range: below 16 the scales cost more than
#: a quarter of the codes; above 4096 one outlier coarsens too many values
MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 4096
MAX_NDIM = 8
#: the most elements a default-limited decode accepts (2**28: 256 MiB of codes)
DEFAULT_MAX_NUMEL = 1 << 28

_KEYS = frozenset({"t", "v", "shape", "dtype", "block_size", "codes", "scales"})
_OVERHEAD = 1024  # map keys, shape, dtype, headers of the two byte strings


def tensor_limits(max_numel: int) -> Limits:
    """Codec limits for one compressed tensor of at most `max_numel` elements.

    Callers that know the job's parameter count pass it here, so a peer cannot make
    them read a larger message than that job can produce.
    """
    if type(max_numel) is not int or max_numel < 0:
        raise ValueError(f"max_numel must be an integer >= 0, got {max_numel!r}")
    max_scale_bytes = 4 * -(-max_numel // MIN_BLOCK_SIZE)
    return Limits(
        max_bytes=max_numel + max_scale_bytes + _OVERHEAD,
        max_depth=2,
        max_container_len=max(MAX_NDIM, len(_KEYS)),
        max_str_len=32,
        max_bin_len=max(max_numel, max_scale_bytes, 1),
    )


TENSOR_LIMITS = tensor_limits(DEFAULT_MAX_NUMEL)


def _numel_if_at_most(shape: list[int], bound: int) -> int | None:
    """prod(shape), or None as soon as it is known to exceed `bound` (dims are >= 0)."""
    if 0 in shape:
        return 0
    numel = 1
    for dim in shape:
        numel *= dim
        if numel > bound:
            return None
    return numel


@dataclass(frozen=True)
class CompressedTensor:
    """A tensor as blockwise int8 codes and float32 scales (see the module docstring)."""

    TYPE: ClassVar[str] = "compressed_tensor"
    VERSION: ClassVar[int] = 1

    shape: list[int]
    dtype: str  # one of DTYPES: what the decoded tensor's elements are
    block_size: int  # elements per scale; a power of two in MIN..MAX_BLOCK_SIZE
    codes: bytes  # prod(shape) int8 values, row-major
    scales: bytes  # ceil(prod(shape) / block_size) float32 values, little-endian

    @property
    def numel(self) -> int:
        return len(self.codes)

    @property
    def nblocks(self) -> int:
        return -(-len(self.codes) // self.block_size)

    def check(self, path: str) -> None:
        """Structure: the sizes agree with each other. Runs in O(ndim)."""
        require(len(self.shape) <= MAX_NDIM, f"{path}.shape", f"has more than {MAX_NDIM} dims")
        for i, dim in enumerate(self.shape):
            require(dim >= 0, f"{path}.shape[{i}]", "must be >= 0")
        require(self.dtype in DTYPES, f"{path}.dtype", f"must be one of {', '.join(DTYPES)}")
        bs = self.block_size
        require(
            MIN_BLOCK_SIZE <= bs <= MAX_BLOCK_SIZE and bs & (bs - 1) == 0,
            f"{path}.block_size",
            f"must be a power of two in {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE}",
        )
        numel = _numel_if_at_most(self.shape, len(self.codes))
        require(
            numel == len(self.codes),
            f"{path}.codes",
            f"must hold prod(shape) int8 values; it has {len(self.codes)} bytes",
        )
        require(
            len(self.scales) == 4 * self.nblocks,
            f"{path}.scales",
            f"must hold {self.nblocks} float32 values ({4 * self.nblocks} bytes) for "
            f"{len(self.codes)} elements in blocks of {bs}; it has {len(self.scales)} bytes",
        )

    def check_values(self, path: str) -> None:
        """Content: finite positive scales, codes in -127..127. Runs in O(numel)."""
        scales = self.scales_array()
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            bad = int(np.flatnonzero(~(np.isfinite(scales) & (scales > 0)))[0])
            raise DecodeError(
                f"{path}.scales[{bad}] is {float(scales[bad])!r}; every scale must be a "
                "finite number > 0 (a delta holding NaN or Inf cannot be sent)"
            )
        codes = self.codes_array()
        if codes.size and int(codes.min()) == -128:
            raise DecodeError(f"{path}.codes holds -128; codes are -127..127")

    def codes_array(self) -> np.ndarray:
        """The codes as a read-only int8 array (a view of `codes`, no copy)."""
        return np.frombuffer(self.codes, dtype=np.int8)

    def scales_array(self) -> np.ndarray:
        """The scales as a read-only little-endian float32 array (a view, no copy)."""
        return np.frombuffer(self.scales, dtype="<f4")


def encode_tensor(tensor: CompressedTensor) -> bytes:
    """The wire bytes of `tensor`; raises `DecodeError` if it breaks a rule above."""
    tensor.check("CompressedTensor")
    tensor.check_values("CompressedTensor")
    plain: dict[str, Any] = {"t": CompressedTensor.TYPE, "v": CompressedTensor.VERSION}
    plain.update(to_plain(tensor))
    return encode(plain)


def decode_tensor(data: bytes, limits: Limits = TENSOR_LIMITS) -> CompressedTensor:
    """Parse and check one compressed tensor. Raises `TooLarge` or `DecodeError` only."""
    plain = decode(data, limits)
    if not isinstance(plain, dict) or set(plain) != _KEYS:
        found = ", ".join(sorted(map(str, plain))) if isinstance(plain, dict) else "not a map"
        raise DecodeError(
            f"not a compressed tensor (expected keys {', '.join(sorted(_KEYS))}; got {found})"
        )
    type_, version = plain.pop("t"), plain.pop("v")
    if type_ != CompressedTensor.TYPE or type(version) is not int:
        raise DecodeError(f"expected a {CompressedTensor.TYPE} message, got {str(type_)[:64]!r}")
    if version != CompressedTensor.VERSION:
        raise DecodeError(
            f"{CompressedTensor.TYPE} v{version} is not supported (this node reads "
            f"v{CompressedTensor.VERSION})"
        )
    tensor = from_plain(CompressedTensor, plain)  # runs check(): sizes agree
    tensor.check_values("CompressedTensor")
    return tensor
