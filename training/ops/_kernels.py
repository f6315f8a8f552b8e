"""The Triton kernels, and the launchers that size their grids.

Imported lazily, by `_dispatch.kernels()` on first use, never by `import
training.ops` (the base install has no Triton). Whether the kernels compile for the
GPU or run in the CPU interpreter is fixed for the process (`TRITON_INTERPRET`, see
`_dispatch`).

Every kernel works on flat, contiguous memory, in tiles of ROWS x BLOCK_SIZE
elements (one quantization block per row) or BLOCK elements, loads once, computes
in float32 and stores once. Offsets are 64-bit, so tensors past 2**31 elements
are fine. Whole tiles are masked by row (or not at all), so loads vectorize; a
partial last block gets a launch of its own with per-element masks.

Exactness: quantization must give the reference's codes bit for bit, on the GPU
too. Its divisions use `div_rn` (Triton's `/` on float32 is approximate), it
rounds half to even with floor (the interpreter cannot call libdevice's rint),
and it is launched with `enable_fp_fusion=False` so no multiply is fused into a
later add. Rounding to bfloat16 is done on the bits (`_round_for`), because the
interpreter truncates; on a GPU that gives what `cvt.rn.bf16.f32` gives. The
fused steps are only held to tolerances, so they keep fusion on.
"""

from __future__ import annotations

import collections
import contextlib
import math
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from training.ops.reference import MIN_ABSMAX

_MIN_ABSMAX = tl.constexpr(MIN_ABSMAX)
_INF = tl.constexpr(float("inf"))

#: elements per program for the blockwise kernels, and warps for that many
_TILE = 2048
_TILE_WARPS = 4
#: elements per program for AdamW (four input streams, three outputs)
_ADAMW_BLOCK = 1024
_ADAMW_WARPS = 4


@triton.jit
def _round_for(ptr, y):
    """`y` (float32) rounded to nearest-even in the element type of `ptr`."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        high = tl.where(y != y, 0x7FC0, bits >> 16)  # NaN stays a (quiet) NaN
        return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(ptr.dtype.element_ty)


@triton.jit
def _quantize_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    n,
    row_start,
    row_end,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    FULL_BLOCKS: tl.constexpr,
):
    rows = row_start + tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = rows[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]
    row_mask = rows < row_end
    if FULL_BLOCKS:  # a row-wide mask keeps the loads vectorized
        mask = row_mask[:, None] & (tl.arange(0, BLOCK_SIZE) < BLOCK_SIZE)[None, :]
    else:
        mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    nan = x != x
    # a sum propagates NaN on every backend (max may not): NaN iff the row holds one
    nan_or_zero = tl.sum(tl.where(nan, x, 0.0), axis=1)
    has_nan = nan_or_zero != nan_or_zero
    absmax = tl.max(tl.where(nan, 0.0, tl.abs(x)), axis=1)
    a = tl.maximum(absmax, _MIN_ABSMAX)
    scale = tl.math.div_rn(a, tl.full((ROWS,), 127.0, tl.float32))
    inverse = tl.math.div_rn(tl.full((ROWS,), 127.0, tl.float32), a)
    # the clamp also keeps the multiply from being fused into the subtraction below
    y = tl.minimum(tl.maximum(x * inverse[:, None], -127.0), 127.0)
    floor = tl.floor(y)
    frac = y - floor
    odd = (floor - 2.0 * tl.floor(0.5 * floor)) != 0.0
    rounded = floor + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)
    finite = (a < _INF) & ~has_nan
    codes = tl.where(finite[:, None], rounded, 0.0).to(tl.int8)
    tl.store(codes_ptr + offs, codes, mask=mask)
    tl.store(scales_ptr + rows, tl.where(has_nan, nan_or_zero, scale), mask=row_mask)


@triton.jit
def _dequantize_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    n,
    row_start,
    row_end,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    FULL_BLOCKS: tl.constexpr,
):
    rows = row_start + tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = rows[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]
    row_mask = rows < row_end
    if FULL_BLOCKS:
        mask = row_mask[:, None] & (tl.arange(0, BLOCK_SIZE) < BLOCK_SIZE)[None, :]
    else:
        mask = offs < n
    q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    s = tl.load(scales_ptr + rows, mask=row_mask, other=0.0)
    tl.store(out_ptr + offs, _round_for(out_ptr, q * s[:, None]), mask=mask)


@triton.jit
def _outer_kernel(
    params_ptr,
    buf_ptr,
    codes_ptr,
    scales_ptr,
    codes_stride,
    nblocks,
    n,
    row_start,
    row_end,
    k,
    lr,
    momentum,
    BLOCK_SIZE: tl.constexpr,
    ROWS: tl.constexpr,
    FULL_BLOCKS: tl.constexpr,
):
    rows = row_start + tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs = rows[:, None] * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)[None, :]
    row_mask = rows < row_end
    if FULL_BLOCKS:
        mask = row_mask[:, None] & (tl.arange(0, BLOCK_SIZE) < BLOCK_SIZE)[None, :]
    else:
        mask = offs < n
    acc = tl.zeros((ROWS, BLOCK_SIZE), dtype=tl.float32)
    codes_row = codes_ptr  # pointers step by a row each time: 64-bit, whatever k x n is
    scales_row = scales_ptr
    for _ in range(k):
        q = tl.load(codes_row + offs, mask=mask, other=0).to(tl.float32)
        s = tl.load(scales_row + rows, mask=row_mask, other=0.0)
        acc += q * s[:, None]
        codes_row += codes_stride
        scales_row += nblocks
    grad = tl.math.div_rn(acc, tl.full((ROWS, BLOCK_SIZE), k, tl.float32))
    buf = tl.load(buf_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    buf = buf * momentum + grad
    update = grad + momentum * buf
    weights = tl.load(params_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    weights = weights - lr * update
    tl.store(buf_ptr + offs, _round_for(buf_ptr, buf), mask=mask)
    tl.store(params_ptr + offs, _round_for(params_ptr, weights), mask=mask)


@triton.jit
def _adamw_kernel(
    params_ptr,
    grads_ptr,
    exp_avg_ptr,
    exp_avg_sq_ptr,
    n,
    decay,
    weight1,
    beta2,
    weight2,
    eps,
    step_size,
    bias_correction2_sqrt,
    start,
    LERP_FROM_START: tl.constexpr,
    BLOCK: tl.constexpr,
    MASKED: tl.constexpr,
):
    offs = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # only the tail launch is masked: a mask on n would stop the loads vectorizing
    if MASKED:
        mask = offs < n
        other = 0.0
    else:
        mask = None
        other = None
    weights = tl.load(params_ptr + offs, mask=mask, other=other).to(tl.float32)
    grad = tl.load(grads_ptr + offs, mask=mask, other=other).to(tl.float32)
    m = tl.load(exp_avg_ptr + offs, mask=mask, other=other).to(tl.float32)
    v = tl.load(exp_avg_sq_ptr + offs, mask=mask, other=other).to(tl.float32)
    weights = weights * decay
    # torch's lerp: from the start for weights below 0.5, from the end otherwise
    if LERP_FROM_START:  # noqa: SIM108 (a Triton constexpr branch)
        m = m + weight1 * (grad - m)
    else:
        m = grad - (grad - m) * (1.0 - weight1)
    v = v * beta2 + weight2 * grad * grad
    denom = tl.math.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    weights = weights - step_size * tl.math.div_rn(m, denom)
    tl.store(params_ptr + offs, _round_for(params_ptr, weights), mask=mask)
    tl.store(exp_avg_ptr + offs, _round_for(exp_avg_ptr, m), mask=mask)
    tl.store(exp_avg_sq_ptr + offs, _round_for(exp_avg_sq_ptr, v), mask=mask)


def _on(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Launch on the tensor's own GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def _rows(block_size: int) -> int:
    return max(1, _TILE // block_size)


def _warps(block_size: int) -> int:
    return _TILE_WARPS * max(1, block_size // _TILE)


def _launch_blocks(kernel, head: tuple, n: int, block_size: int, tail: tuple, **options) -> None:
    """Launch a blockwise kernel over the whole blocks (row masks, vectorized loads),
    then once more with element masks for a last, partial block."""
    full = n // block_size
    nblocks = -(-n // block_size)
    rows = _rows(block_size)
    common = dict(BLOCK_SIZE=block_size, num_warps=_warps(block_size), **options)
    if full:
        grid = (triton.cdiv(full, rows),)
        kernel[grid](*head, n, 0, full, *tail, ROWS=rows, FULL_BLOCKS=True, **common)
    if full < nblocks:
        kernel[(1,)](*head, n, full, nblocks, *tail, ROWS=1, FULL_BLOCKS=False, **common)


def build(launches: collections.Counter[str]) -> SimpleNamespace:
    """The launchers, each counting its launches in `launches`. Callers in
    `training.ops` check shapes and dtypes and pass contiguous memory (the outer
    step's codes may have a row stride: rows padded to whole blocks)."""

    def quantize(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.numel()
        codes = torch.empty(n, dtype=torch.int8, device=x.device)
        scales = torch.empty(-(-n // block_size), dtype=torch.float32, device=x.device)
        if n:
            with _on(x):
                head = (x, codes, scales)
                _launch_blocks(_quantize_kernel, head, n, block_size, (), enable_fp_fusion=False)
            launches["quantize_blockwise"] += 1
        return codes, scales

    def dequantize(
        codes: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, block_size: int
    ) -> None:
        n = codes.numel()
        if n:
            with _on(codes):
                _launch_blocks(_dequantize_kernel, (codes, scales, out), n, block_size, ())
            launches["dequantize_blockwise"] += 1

    def outer_step(
        params: torch.Tensor,
        buf: torch.Tensor,
        codes: torch.Tensor,
        scales: torch.Tensor,
        block_size: int,
        lr: float,
        momentum: float,
    ) -> None:
        k, n = codes.shape
        if n:
            head = (params, buf, codes, scales, codes.stride(0), scales.shape[1])
            with _on(params):
                _launch_blocks(_outer_kernel, head, n, block_size, (k, lr, momentum))
            launches["outer_nesterov_step"] += 1

    def adamw(
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
        n = params.numel()
        if not n:
            return
        weight1 = 1 - beta1
        scalars = (
            n,
            1 - lr * weight_decay,
            weight1,
            beta2,
            1 - beta2,
            eps,
            lr / (1 - beta1**step),
            math.sqrt(1 - beta2**step),
        )
        tensors = (params, grads, exp_avg, exp_avg_sq)
        options = dict(LERP_FROM_START=weight1 < 0.5, BLOCK=_ADAMW_BLOCK, num_warps=_ADAMW_WARPS)
        whole = n - n % _ADAMW_BLOCK
        with _on(params):
            if whole:
                grid = (whole // _ADAMW_BLOCK,)
                _adamw_kernel[grid](*tensors, *scalars, 0, MASKED=False, **options)
            if whole < n:
                _adamw_kernel[(1,)](*tensors, *scalars, whole, MASKED=True, **options)
        launches["adamw_step"] += 1

    return SimpleNamespace(
        quantize=quantize, dequantize=dequantize, outer_step=outer_step, adamw=adamw
    )
