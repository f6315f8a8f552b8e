"""`CompressedTensor`: a blockwise int8 or int4 tensor on the wire (weight changes, never weights).

Elastic jobs move weight *deltas* every round, and volunteer links are slow, so a
delta travels as int8 codes plus one float32 scale per block of `block_size`
elements: about a quarter of its float32 size (a half of bfloat16). Lossless
weights stay safetensors (`training.model.weights`); this encoding is lossy and used
only where the training side has chosen that loss (see docs/ops.md for the bound).

Wire form: one msgpack map ``{t, v, shape, dtype, block_size, bits, codes, scales}``;
`codes` holds ``prod(shape)`` codes in row-major order, `scales` holds
``ceil(prod(shape) / block_size)`` little-endian float32 values. Element ``i``
decodes to ``codes[i] * scales[i // block_size]``, rounded to `dtype`. With
``bits = 8`` (the default when the key is absent) each code is one int8 byte; with
``bits = 4`` two codes share a byte, element ``2k`` in the low nibble and ``2k + 1``
in the high one, each a two's-complement nibble, and an odd count leaves the last
high nibble zero: half the bytes, for elastic jobs that choose the coarser codes.

Everything is bounded before anything is sized from the message: the codec's
`Limits` cap the bytes (so the two byte strings are already bounded when they are
read), and `shape` is accepted only when its product equals the codes' length,
computed with an early stop so that a hostile shape costs nothing. Values are
checked too, so that only canonical tensors are accepted: every scale finite and
positive (a delta that held NaN or Inf cannot be sent, see `training.ops.wire`),
and no code is the most negative of its width (-128, or -8 in a nibble: the
quantizer is symmetric around zero, -127..127 and -7..7).

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
_OPTIONAL_KEYS = frozenset({"bits"})
#: code widths: one byte a code, or two codes a byte
BITS = (8, 4)
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
        max_container_len=max(MAX_NDIM, len(_KEYS | _OPTIONAL_KEYS)),
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
    """A tensor as blockwise int8 or int4 codes and float32 scales (see the module
    docstring)."""

    TYPE: ClassVar[str] = "compressed_tensor"
    VERSION: ClassVar[int] = 1

    shape: list[int]
    dtype: str  # one of DTYPES: what the decoded tensor's elements are
    block_size: int  # elements per scale; a power of two in MIN..MAX_BLOCK_SIZE
    codes: bytes  # prod(shape) codes, row-major: a byte each, or a nibble each (bits 4)
    scales: bytes  # ceil(prod(shape) / block_size) float32 values, little-endian
    bits: int = 8  # one of BITS

    @property
    def numel(self) -> int:
        return _numel_if_at_most(self.shape, 8 * len(self.codes) // self.bits) or 0

    @property
    def nblocks(self) -> int:
        return -(-self.numel // self.block_size)

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
        require(self.bits in BITS, f"{path}.bits", "must be 8 or 4")
        numel = _numel_if_at_most(self.shape, 8 * len(self.codes) // self.bits)
        require(
            numel is not None and len(self.codes) == -(-numel * self.bits // 8),
            f"{path}.codes",
            f"must hold prod(shape) {self.bits}-bit codes; it has {len(self.codes)} bytes",
        )
        require(
            len(self.scales) == 4 * self.nblocks,
            f"{path}.scales",
            f"must hold {self.nblocks} float32 values ({4 * self.nblocks} bytes) for "
            f"{self.numel} elements in blocks of {bs}; it has {len(self.scales)} bytes",
        )

    def check_values(self, path: str) -> None:
        """Content: finite positive scales, codes in -127..127 (-7..7 for bits 4), an
        odd count's padding nibble zero. Runs in O(numel)."""
        scales = self.scales_array()
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            bad = int(np.flatnonzero(~(np.isfinite(scales) & (scales > 0)))[0])
            raise DecodeError(
                f"{path}.scales[{bad}] is {float(scales[bad])!r}; every scale must be a "
                "finite number > 0 (a delta holding NaN or Inf cannot be sent)"
            )
        if self.bits == 4 and self.numel % 2 and self.codes[-1] >> 4:
            raise DecodeError(f"{path}.codes: the padding nibble after the last code is not 0")
        codes = self.codes_array()
        low = -(1 << (self.bits - 1))
        if codes.size and int(codes.min()) == low:
            raise DecodeError(f"{path}.codes holds {low}; codes are {low + 1}..{-low - 1}")

    def codes_array(self) -> np.ndarray:
        """The codes as an int8 array: a read-only view of `codes` for bits 8, the
        nibbles unpacked (a new array) for bits 4."""
        raw = np.frombuffer(self.codes, dtype=np.uint8)
        if self.bits == 8:
            return raw.view(np.int8)
        nibbles = np.empty(2 * raw.size, dtype=np.uint8)
        nibbles[0::2] = raw & 0x0F
        nibbles[1::2] = raw >> 4
        return ((nibbles ^ 8).astype(np.int8) - 8)[: self.numel]

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
    if not isinstance(plain, dict) or not _KEYS <= set(plain) <= _KEYS | _OPTIONAL_KEYS:
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


def pack_nibbles(codes: np.ndarray) -> bytes:
    """int8 codes in -7..7 as `bits = 4` wire bytes (two a byte, low nibble first)."""
    nibbles = codes.astype(np.uint8) & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()
