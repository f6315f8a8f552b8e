"""Pure-torch references: the definition of every op, and its path off CUDA.

Each function here is what the matching Triton kernel in `training.ops._kernels`
must compute, written as plain tensor ops on any device. The CPU path of every op
runs these; the tests compare the kernels with them (codes exactly, floats within
the tolerances in docs/ops.md); the benchmark times them as the unfused baseline.
Inputs are assumed valid: the public wrappers in `training.ops` check them.

Quantization, per block of `block_size` consecutive elements (row-major), in float32:

    a     = max(absmax(block ignoring NaN), MIN_ABSMAX)
    scale = a / L                         (NaN if the block holds a NaN)
    code  = round_half_even(clamp(x * (L / a), -L, L))
            (0 for every element of a block whose scale is NaN or Inf)

with L = 127 for int8 codes and L = 7 for int4 ones (which only this reference
computes: they are made on the CPU, for the wire).

`MIN_ABSMAX` keeps `127 / a` finite (no overflow, no subnormal scale), and makes a
block of zeros a block of zero codes. The reciprocal and the scale are computed
once per block with correctly rounded division, so the kernel can reproduce every
code bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

#: blocks whose absmax is below this are quantized as if it were this (2**-100)
MIN_ABSMAX = 2.0**-100


def _blocks(flat: torch.Tensor, block_size: int) -> torch.Tensor:
    """`flat` zero-padded to whole blocks, as (nblocks, block_size)."""
    n = flat.numel()
    nblocks = -(-n // block_size)
    if nblocks * block_size != n:
        flat = F.pad(flat, (0, nblocks * block_size - n))
    return flat.view(nblocks, block_size)


def quantize_blockwise(
    x: torch.Tensor, block_size: int, levels: int = 127
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes: int8 of x.numel() in -levels..levels, scales: float32 of
    ceil(numel / block_size))."""
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    blocks = _blocks(flat, block_size)
    nan = torch.isnan(blocks)
    has_nan = nan.any(dim=1)
    a = blocks.abs().masked_fill(nan, 0.0).amax(dim=1).clamp_min(MIN_ABSMAX)
    # tensor / tensor: `127.0 / a` is reciprocal(a) * 127 in torch, and CUDA divides by
    # a Python scalar through its reciprocal; both round twice
    full = torch.full_like(a, float(levels))
    scales = a / full
    inverse = full / a
    rounded = torch.round((blocks * inverse[:, None]).clamp(-float(levels), float(levels)))
    finite = torch.isfinite(a) & ~has_nan
    codes = torch.where(finite[:, None], rounded, 0.0).to(torch.int8).view(-1)[:n]
    scales = torch.where(has_nan, torch.nan, scales)
    return codes.clone(), scales


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, block_size: int) -> torch.Tensor:
    """float32 values of (..., n) codes with (..., nblocks) scales: code x its block's scale."""
    n = codes.shape[-1]
    nblocks = scales.shape[-1]
    lead = codes.shape[:-1]
    values = codes.to(torch.float32)
    if nblocks * block_size != n:
        values = F.pad(values, (0, nblocks * block_size - n))
    values = values.view(*lead, nblocks, block_size) * scales[..., None]
    return values.view(*lead, nblocks * block_size)[..., :n]


def dequantize_blockwise(
    codes: torch.Tensor,
    scales: torch.Tensor,
    shape: Sequence[int],
    dtype: torch.dtype,
    block_size: int,
) -> torch.Tensor:
    """The tensor of `shape` and `dtype` that `quantize_blockwise` encoded."""
    return dequantize_rows(codes, scales, block_size).to(dtype).reshape(shape).clone()


def outer_nesterov_step_(
    params: torch.Tensor,
    momentum_buffer: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    lr: float,
    momentum: float,
) -> None:
    """The owner's DiLoCo outer step, unfused: average K deltas, Nesterov SGD into params.

    `codes` (K, n) and `scales` (K, nblocks) are K quantized pseudo-gradients
    (start weights minus the worker's end weights). Exactly `torch.optim.SGD(lr,
    momentum, nesterov=True)` with that average as the gradient, from a zero buffer:

        g = mean_k dequant(delta_k);  buf = momentum * buf + g
        params -= lr * (g + momentum * buf)

    computed in float32 and stored in each tensor's own dtype.
    """
    k = codes.shape[0]
    grad = (dequantize_rows(codes, scales, block_size).sum(dim=0) / k).view(params.shape)
    buf = momentum_buffer.to(torch.float32)
    buf.mul_(momentum).add_(grad)
    update = grad.add(buf, alpha=momentum)
    weights = params.to(torch.float32)
    weights.add_(update, alpha=-lr)
    if buf is not momentum_buffer:
        momentum_buffer.copy_(buf)
    if weights is not params:
        params.copy_(weights)


def adamw_step_(
    params: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """One AdamW step, the op sequence of `torch.optim.AdamW` (single-tensor, no amsgrad).

    `step` is the step being taken, counted from 1. Computed in float32 and stored in
    each tensor's own dtype, so for float32 tensors this is torch's own arithmetic.
    """
    weights = params.to(torch.float32)
    grad = grads.to(torch.float32)
    m = exp_avg.to(torch.float32)
    v = exp_avg_sq.to(torch.float32)
    weights.mul_(1 - lr * weight_decay)
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    bias_correction2_sqrt = math.sqrt(1 - beta2**step)
    denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
    weights.addcdiv_(m, denom, value=-step_size)
    for mine, theirs in ((weights, params), (m, exp_avg), (v, exp_avg_sq)):
        if mine is not theirs:
            theirs.copy_(mine)
