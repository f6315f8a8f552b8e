"""The owner's outer step in elastic (DiLoCo-style) rounds, fused into one pass.

At the end of a round each worker sends its pseudo-gradient, the weights it
started from minus the weights it ended with, quantized (`quantize_blockwise`).
The owner averages the K deltas and takes one Nesterov momentum SGD step with that
average as the gradient. Unfused, that is K dequantizations into float32, a
reduction, and four passes of momentum and weight updates; fused, each element's
K codes, momentum and weight are read once and momentum and weight written once.

The step is the custom op `torch.ops.meshminer.outer_nesterov_step_` (it mutates
`params` and `momentum_buffer`); `outer_nesterov_step_` checks arguments first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from training.ops import reference
from training.ops._dispatch import kernels, use_triton
from training.ops.quant import QuantizedBatch, QuantizedTensor, check_float


@torch.library.custom_op(
    "meshminer::outer_nesterov_step_", mutates_args=("params", "momentum_buffer")
)
def _outer_op(
    params: Tensor,
    momentum_buffer: Tensor,
    codes: Tensor,
    scales: Tensor,
    block_size: int,
    lr: float,
    momentum: float,
) -> None:
    if not use_triton(params, momentum_buffer, codes, scales):
        reference.outer_nesterov_step_(
            params, momentum_buffer, codes, scales, block_size, lr, momentum
        )
        return
    weights = params if params.is_contiguous() else params.contiguous()
    buf = momentum_buffer if momentum_buffer.is_contiguous() else momentum_buffer.contiguous()
    if codes.stride(1) != 1:
        codes = codes.contiguous()
    kernels().outer_step(weights, buf, codes, scales.contiguous(), block_size, lr, momentum)
    if weights is not params:
        params.copy_(weights)
    if buf is not momentum_buffer:
        momentum_buffer.copy_(buf)


@_outer_op.register_fake
def _outer_fake(
    params: Tensor,
    momentum_buffer: Tensor,
    codes: Tensor,
    scales: Tensor,
    block_size: int,
    lr: float,
    momentum: float,
) -> None:
    return None


def outer_nesterov_step_(
    params: Tensor,
    momentum_buffer: Tensor,
    deltas: QuantizedBatch | Sequence[QuantizedTensor],
    *,
    lr: float,
    momentum: float = 0.9,
    check_finite: bool = True,
) -> None:
    """Average the quantized `deltas` and take one Nesterov step into `params`, in place.

    Equivalent to `torch.optim.SGD([params], lr=lr, momentum=momentum, nesterov=True)`
    stepping once with ``grad = mean(dequantize_blockwise(d) for d in deltas)`` and
    its momentum buffer in `momentum_buffer` (start it at zeros). Each delta is a
    pseudo-gradient: start weights minus the worker's end weights, of `params`' shape.

    `params` and `momentum_buffer` may be float32, bfloat16 or float16 (the math is
    float32; keep the buffer float32 unless memory forbids it). With `check_finite`
    (the default) a delta holding NaN or Inf is refused with a ValueError naming it,
    before anything changes; that reads the scales back, one device sync.
    """
    check_float(params, "params")
    check_float(momentum_buffer, "momentum_buffer")
    batch = deltas if isinstance(deltas, QuantizedBatch) else QuantizedBatch.stack(list(deltas))
    if momentum_buffer.shape != params.shape:
        raise ValueError(
            f"momentum_buffer has shape {tuple(momentum_buffer.shape)}, params "
            f"{tuple(params.shape)}; make it torch.zeros_like(params, dtype=torch.float32)"
        )
    if batch.shape != params.shape:
        raise ValueError(
            f"deltas have shape {tuple(batch.shape)}, params {tuple(params.shape)}; each "
            "delta must be quantized from a tensor of the params' shape"
        )
    devices = {params.device, momentum_buffer.device, batch.codes.device}
    if len(devices) != 1:
        raise ValueError(
            f"params, momentum_buffer and deltas must be on one device, got "
            f"{', '.join(sorted(map(str, devices)))}; move the deltas with .to(params.device)"
        )
    for name, value in (("lr", lr), ("momentum", momentum)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if check_finite:
        bad = (~torch.isfinite(batch.scales)).sum(dim=1).tolist()
        for i, count in enumerate(bad):
            if count:
                raise ValueError(
                    f"delta {i} holds NaN or Inf in {count} block(s); leave that worker's "
                    "delta out of the average (nothing was changed)"
                )
    torch.ops.meshminer.outer_nesterov_step_(
        params,
        momentum_buffer,
        batch.codes,
        batch.scales,
        batch.block_size,
        float(lr),
        float(momentum),
    )
