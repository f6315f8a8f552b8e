"""QuantizedTensor <-> `protocol.tensors.CompressedTensor` <-> bytes.

`protocol` owns the wire form and its limits and never imports torch; this is the
torch side. A delta holding NaN or Inf is refused here, before it is sent, with a
message that says so (the decoder would refuse it anyway).
"""

from __future__ import annotations

import numpy as np
import torch

from protocol.codec import Limits
from protocol.tensors import (
    TENSOR_LIMITS,
    CompressedTensor,
    decode_tensor,
    encode_tensor,
    pack_nibbles,
    tensor_limits,
)
from training.ops.quant import (
    DEFAULT_BLOCK_SIZE,
    QuantizedTensor,
    quantize_blockwise,
)

_WIRE_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _WIRE_DTYPES.items()}


def to_wire(q: QuantizedTensor, bits: int = 8) -> CompressedTensor:
    """The wire message for `q` (copies codes and scales to host memory), a byte a
    code or, with `bits=4`, a nibble (`q` must then hold codes in -7..7).

    Raises ValueError if a block held NaN or Inf: such a delta means the worker
    diverged, and the owner would refuse it.
    """
    bad = q.nonfinite_blocks()
    if bad:
        raise ValueError(
            f"the tensor held NaN or Inf in {bad} of {q.nblocks} blocks; it cannot be sent "
            "(check the run for divergence)"
        )
    codes = q.codes.detach().to("cpu").contiguous().numpy()
    scales = q.scales.detach().to("cpu").contiguous().numpy().astype("<f4", copy=False)
    if bits == 4:
        if codes.size and int(np.abs(codes).max()) > 7:
            raise ValueError("4-bit codes must be -7..7; quantize with bits=4")
        packed = pack_nibbles(codes)
    elif bits == 8:
        packed = codes.tobytes()
    else:
        raise ValueError(f"bits must be 8 or 4, got {bits!r}")
    return CompressedTensor(
        shape=list(q.shape),
        dtype=_WIRE_DTYPES[q.dtype],
        block_size=q.block_size,
        codes=packed,
        scales=scales.tobytes(),
        bits=bits,
    )


def from_wire(message: CompressedTensor, device: torch.device | str = "cpu") -> QuantizedTensor:
    """The QuantizedTensor of a decoded (so already checked) wire message, on `device`."""
    codes = torch.from_numpy(np.array(message.codes_array(), copy=True))
    scales = torch.from_numpy(message.scales_array().astype(np.float32, copy=True))
    return QuantizedTensor(
        codes.to(device),
        scales.to(device),
        torch.Size(message.shape),
        _TORCH_DTYPES[message.dtype],
        message.block_size,
    )


def encode_delta(x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE, bits: int = 8) -> bytes:
    """Quantize `x` and return the wire bytes (about numel x (bits / 8 + 4 / block_size))."""
    return encode_tensor(to_wire(quantize_blockwise(x, block_size, bits), bits))


def decode_delta(
    data: bytes,
    *,
    max_numel: int | None = None,
    limits: Limits | None = None,
    device: torch.device | str = "cpu",
) -> QuantizedTensor:
    """Decode wire bytes into a QuantizedTensor on `device`.

    Pass the job's parameter count as `max_numel` so a peer cannot make this read
    more (or explicit `limits`); the default allows 2**28 elements. Raises only
    `protocol.errors.ProtocolError` subclasses (`TooLarge`, `DecodeError`).
    """
    if limits is None:
        limits = TENSOR_LIMITS if max_numel is None else tensor_limits(max_numel)
    return from_wire(decode_tensor(data, limits), device)
