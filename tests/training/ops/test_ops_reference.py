"""training.ops on its CPU path (the pure-torch references): the quantization error
bound, NaN/Inf and empty inputs, the outer step against torch.optim.SGD, AdamW and
FlatAdamW against torch.optim.AdamW, argument checks, the custom ops under opcheck
and torch.compile, and the base install without Triton.

The Triton kernels are compared with these references in test_ops_triton.py, which
runs in Triton's interpreter in a child process (test_ops_interpreter.py)."""

from __future__ import annotations

import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import training.ops as ops
from training.ops import _dispatch, reference
from training.ops.quant import FLOAT_DTYPES

ROOT = Path(__file__).resolve().parents[3]
BLOCK_SIZES = (16, 32, 64, 128, 256, 1024, 4096)
#: half an ulp, relative, of each dtype's normal numbers; and half its smallest subnormal
HALF_ULP = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
HALF_TINY = {torch.float32: 0.0, torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}
SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-41, -3e-39, 1e-30, 3e38, -3e38)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw, max_numel: int = 3000, specials: bool = True, strided: bool = True):
    """Float tensors of 0-3 dims (some empty), any of the three dtypes, magnitudes from
    subnormal to near overflow, optionally with NaN/Inf/zeros/subnormals sprinkled in,
    and sometimes non-contiguous (a transposed layout of the same values)."""
    ndim = draw(st.integers(0, 3))
    shape, room = [], max_numel
    for _ in range(ndim):
        dim = draw(st.integers(0, max(1, min(room, 1200))))
        shape.append(dim)
        room = room // max(dim, 1)
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    scale = draw(st.sampled_from([1.0, 1.0, 1e-3, 1e-20, 1e-42, 1e3, 1e30]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if specials and x.numel():
        for index, value in draw(
            st.lists(
                st.tuples(st.integers(0, x.numel() - 1), st.sampled_from(SPECIALS)), max_size=3
            )
        ):
            x.view(-1)[index] = value
    x = x.to(dtype)
    if strided and ndim >= 2 and draw(st.booleans()):
        x = x.transpose(0, -1).contiguous().transpose(0, -1)  # same values, other strides
    return x


def error_bound(x: torch.Tensor, q: ops.QuantizedTensor) -> torch.Tensor:
    """The documented bound on |x - dequantize(quantize(x))| per element (docs/ops.md)."""
    flat = x.reshape(-1).double()
    a = torch.repeat_interleave(q.scales.double() * 127, q.block_size)[: flat.numel()]
    a = a.clamp_min(reference.MIN_ABSMAX)
    step = a / 254 * (1 + 1e-4)
    return step + HALF_ULP[x.dtype] * (flat.abs() + step) + HALF_TINY[x.dtype]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, shape and dtype, NaN equal to NaN."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.isnan(), b.isnan())
        and (torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0)))
    )


# --- quantization ---------------------------------------------------------------------


@FAST
@given(x=tensors(), block_size=st.sampled_from(BLOCK_SIZES))
def test_quantize_round_trip_stays_within_the_documented_bound(x, block_size):
    q = ops.quantize_blockwise(x, block_size)
    y = ops.dequantize_blockwise(q)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert q.codes.dtype == torch.int8 and q.scales.dtype == torch.float32
    assert q.nblocks == -(-x.numel() // block_size)
    assert q.codes.numel() == 0 or int(q.codes.min()) >= -127
    finite_block = torch.isfinite(q.scales)
    per_element = torch.repeat_interleave(finite_block, block_size)[: x.numel()]
    xs, ys = x.reshape(-1).double()[per_element], y.reshape(-1).double()[per_element]
    bound = error_bound(x, q)[per_element]
    ok = torch.isfinite(ys)  # values within 2**-20 of the dtype's max may round to Inf
    assert ((xs - ys).abs()[ok] <= bound[ok]).all()
    # a block that held NaN or Inf: zero codes, a NaN or +Inf scale, NaN out
    bad = ~per_element
    assert (q.codes[bad] == 0).all()
    assert y.reshape(-1)[bad].isnan().all()


@FAST
@given(x=tensors(specials=False, strided=False), block_size=st.sampled_from(BLOCK_SIZES))
def test_layout_does_not_change_the_codes(x, block_size):
    if x.dim() < 2:
        x = x.reshape(1, -1)
    strided = x.transpose(0, -1).contiguous().transpose(0, -1)
    assert not strided.is_contiguous() or strided.numel() <= 1 or 1 in strided.shape
    a, b = ops.quantize_blockwise(x, block_size), ops.quantize_blockwise(strided, block_size)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)


def test_the_block_maximum_gets_code_127_and_half_steps_round_to_even():
    x = torch.tensor([0.0] * 14 + [-254.0, 127.0])  # scale 2: 127 -> 63.5 -> 64, -254 -> -127
    q = ops.quantize_blockwise(x, 16)
    assert q.scales.tolist() == [2.0]
    assert q.codes[-2:].tolist() == [-127, 64]
    x = torch.tensor([0.0] * 14 + [254.0, 125.0])  # 125 -> 62.5 -> 62
    assert ops.quantize_blockwise(x, 16).codes[-1].item() == 62


def test_zeros_and_tiny_blocks_are_exact_and_finite():
    x = torch.zeros(40)
    x[20:] = 2.0**-120  # below MIN_ABSMAX: quantized against 2**-100
    q = ops.quantize_blockwise(x, 16)
    assert torch.isfinite(q.scales).all() and (q.scales > 0).all()
    assert (q.codes[:16] == 0).all()
    y = ops.dequantize_blockwise(q)
    assert (y[:16] == 0).all()
    assert ((y - x).abs() <= 2.0**-100 / 254 * 1.0001).all()


def test_nan_and_inf_poison_only_their_own_block():
    x = torch.randn(64)
    x[3], x[40] = math.nan, math.inf
    q = ops.quantize_blockwise(x, 16)
    assert math.isnan(q.scales[0]) and q.scales[2] == math.inf
    assert q.nonfinite_blocks() == 2
    y = ops.dequantize_blockwise(q)
    assert y[:16].isnan().all() and y[32:48].isnan().all()
    for block in (1, 3):
        alone = ops.quantize_blockwise(x[16 * block : 16 * block + 16], 16)
        assert torch.equal(q.codes[16 * block : 16 * block + 16], alone.codes)
        assert torch.equal(y[16 * block : 16 * block + 16], ops.dequantize_blockwise(alone))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 2), ()])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty_and_scalar_tensors(shape, dtype):
    x = torch.full(shape, 1.5, dtype=dtype)
    q = ops.quantize_blockwise(x)
    assert q.numel == x.numel() and q.nblocks == (1 if x.numel() else 0)
    y = ops.dequantize_blockwise(q)
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, x)  # 1.5 is its block's maximum: code 127, exact


def test_sizes_that_are_not_a_multiple_of_the_block():
    x = torch.arange(1, 1001, dtype=torch.float32)
    q = ops.quantize_blockwise(x, 256)
    assert q.nblocks == 4 and q.scales[-1] == 1000 / 127
    assert ops.dequantize_blockwise(q)[-1] == 1000


def test_quantize_is_not_differentiable_but_takes_tensors_that_require_grad():
    x = torch.randn(10, requires_grad=True)
    y = ops.dequantize_blockwise(ops.quantize_blockwise(x))
    assert not y.requires_grad


@pytest.mark.parametrize(
    ("x", "block_size", "error", "words"),
    [
        (torch.arange(10), 256, TypeError, "float32, bfloat16 or float16"),
        (torch.zeros(10, dtype=torch.float64), 256, TypeError, "x.float()"),
        ([1.0, 2.0], 256, TypeError, "torch.Tensor"),
        (torch.zeros(10), 100, ValueError, "power of two"),
        (torch.zeros(10), 8, ValueError, "16..4096"),
        (torch.zeros(10), 8192, ValueError, "16..4096"),
        (torch.zeros(10), True, ValueError, "power of two"),
        (torch.zeros(4, 4).to_sparse(), 256, TypeError, "dense"),
    ],
)
def test_bad_quantize_arguments_say_what_to_do(x, block_size, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        ops.quantize_blockwise(x, block_size)


def test_a_quantized_tensor_checks_its_parts():
    q = ops.quantize_blockwise(torch.randn(300), 256)
    with pytest.raises(ValueError, match="codes must be int8 of shape"):
        ops.QuantizedTensor(q.codes[:10], q.scales, q.shape, q.dtype, 256)
    with pytest.raises(ValueError, match=r"scales must be float32 of shape \(2,\)"):
        ops.QuantizedTensor(q.codes, q.scales[:1], q.shape, q.dtype, 256)
    with pytest.raises(TypeError, match="dtype"):
        ops.QuantizedTensor(q.codes, q.scales, q.shape, torch.int32, 256)
    with pytest.raises(TypeError, match="QuantizedTensor"):
        ops.dequantize_blockwise(q.codes)
    assert q.nbytes == 300 + 8 and q.to("cpu").shape == (300,)


# --- the outer step -------------------------------------------------------------------


def sgd_reference(p0, deltas, lr, momentum, steps):
    """torch.optim.SGD(nesterov=True) fed the mean dequantized delta as the gradient."""
    p = p0.detach().float().clone().requires_grad_()
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum, nesterov=momentum > 0)
    grad = torch.stack([ops.dequantize_blockwise(d).float() for d in deltas]).sum(0) / len(deltas)
    for _ in range(steps):
        p.grad = grad.clone()
        opt.step()
    return p.detach()


@FAST
@given(
    x=tensors(max_numel=2000, specials=False, strided=False),
    k=st.integers(1, 4),
    lr=st.sampled_from([0.7, 1.0, 0.1]),
    momentum=st.sampled_from([0.9, 0.0, 0.5]),
    block_size=st.sampled_from(BLOCK_SIZES),
)
def test_outer_step_is_nesterov_sgd_on_the_mean_delta(x, k, lr, momentum, block_size):
    x = x.float()
    gen = torch.Generator().manual_seed(k)
    deltas = [
        ops.quantize_blockwise(torch.randn(x.shape, generator=gen) * 0.01, block_size)
        for _ in range(k)
    ]
    params, buf = x.clone(), torch.zeros_like(x)
    for _ in range(3):
        ops.outer_nesterov_step_(params, buf, deltas, lr=lr, momentum=momentum)
    torch.testing.assert_close(params, sgd_reference(x, deltas, lr, momentum, 3))


def test_outer_step_takes_a_batch_strided_params_and_low_precision():
    gen = torch.Generator().manual_seed(0)
    deltas = [ops.quantize_blockwise(torch.randn(30, 50, generator=gen), 64) for _ in range(3)]
    batch = ops.QuantizedBatch.empty(3, (30, 50), torch.float32, 64)
    for i, d in enumerate(deltas):
        batch.put(i, d)
    assert batch.codes.stride(0) == 64 * 24  # rows padded to whole blocks
    p0 = torch.randn(30, 50, generator=gen)
    a, abuf = p0.clone(), torch.zeros(30, 50)
    ops.outer_nesterov_step_(a, abuf, deltas, lr=0.7)
    b, bbuf = p0.t().contiguous().t(), torch.zeros(50, 30).t()
    ops.outer_nesterov_step_(b, bbuf, batch, lr=0.7)
    assert torch.equal(a, b) and torch.equal(abuf, bbuf) and not b.is_contiguous()
    low, wide = p0.to(torch.bfloat16), p0.to(torch.bfloat16).float()
    ops.outer_nesterov_step_(low, torch.zeros(30, 50), batch, lr=0.7)
    ops.outer_nesterov_step_(wide, torch.zeros(30, 50), batch, lr=0.7)
    assert torch.equal(low, wide.to(torch.bfloat16))  # float32 math, rounded once


def test_outer_step_refuses_a_nonfinite_delta_and_changes_nothing():
    good = ops.quantize_blockwise(torch.randn(100), 16)
    x = torch.randn(100)
    x[50] = math.nan
    bad = ops.quantize_blockwise(x, 16)
    params, buf = torch.ones(100), torch.zeros(100)
    with pytest.raises(ValueError, match="delta 1 holds NaN or Inf in 1 block"):
        ops.outer_nesterov_step_(params, buf, [good, bad], lr=0.7)
    assert (params == 1).all() and (buf == 0).all()


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"buf": torch.zeros(99)}, ValueError, "momentum_buffer has shape"),
        ({"params": torch.zeros(10, 10), "buf": torch.zeros(10, 10)}, ValueError, "deltas have"),
        ({"params": torch.zeros(100, dtype=torch.int32)}, TypeError, "params must be float32"),
        ({"lr": math.nan}, ValueError, "lr must be a finite number"),
        ({"momentum": -0.1}, ValueError, "momentum must be"),
        ({"lr": "0.7"}, TypeError, "lr must be a number"),
        ({"deltas": []}, ValueError, "at least one"),
    ],
)
def test_bad_outer_step_arguments(change, error, words):
    args = {
        "params": torch.zeros(100),
        "buf": torch.zeros(100),
        "deltas": [ops.quantize_blockwise(torch.randn(100), 16)],
        "lr": 0.7,
        "momentum": 0.9,
    }
    args.update(change)
    with pytest.raises(error, match=words):
        ops.outer_nesterov_step_(
            args["params"], args["buf"], args["deltas"], lr=args["lr"], momentum=args["momentum"]
        )


def test_stacking_deltas_that_disagree_names_the_odd_one():
    a = ops.quantize_blockwise(torch.randn(100), 16)
    b = ops.quantize_blockwise(torch.randn(100), 32)
    with pytest.raises(ValueError, match="delta 1 is"):
        ops.QuantizedBatch.stack([a, b])


# --- AdamW ----------------------------------------------------------------------------


@FAST
@given(
    n=st.integers(0, 3000),
    lr=st.sampled_from([1e-3, 3e-2, 0.0]),
    betas=st.sampled_from([(0.9, 0.999), (0.3, 0.99), (0.5, 0.5), (0.0, 0.0)]),
    eps=st.sampled_from([1e-8, 1e-3]),
    weight_decay=st.sampled_from([0.0, 1e-2, 0.5]),
    steps=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_adamw_reference_is_torch_adamw_bit_for_bit(n, lr, betas, eps, weight_decay, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(n, generator=gen)
    theirs = p.clone().requires_grad_()
    opt = torch.optim.AdamW([theirs], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    m, v = torch.zeros(n), torch.zeros(n)
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen)
        ops.adamw_step_(
            p, g, m, v, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, step=step
        )
        theirs.grad = g.clone()
        opt.step()
    assert torch.equal(p, theirs.detach())
    assert torch.equal(m, opt.state[theirs]["exp_avg"])
    assert torch.equal(v, opt.state[theirs]["exp_avg_sq"])


def test_adamw_in_low_precision_is_float32_math_rounded_once():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        p, g, m, v = (torch.randn(500, generator=gen).abs().to(dtype) for _ in range(4))
        wide = [t.float() for t in (p, g, m, v)]
        ops.adamw_step_(*wide, lr=1e-2, step=3)
        ops.adamw_step_(p, g, m, v, lr=1e-2, step=3)
        for mine, expected in zip((p, m, v), (wide[0], wide[2], wide[3]), strict=True):
            assert torch.equal(mine, expected.to(dtype))


def test_adamw_strided_tensors():
    p = torch.randn(40, 30).t()
    expected = p.contiguous()
    m, v = torch.zeros(30, 40), torch.zeros(30, 40)
    g = torch.randn(30, 40)
    ops.adamw_step_(p, g, m.t().contiguous().t(), v.t().contiguous().t(), lr=0.1, step=1)
    ops.adamw_step_(expected, g, m, v, lr=0.1, step=1)
    assert torch.equal(p, expected)


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"grads": torch.zeros(9)}, ValueError, "grads has shape"),
        ({"exp_avg": torch.zeros(10, dtype=torch.float64)}, TypeError, "exp_avg must be"),
        ({"step": 0}, ValueError, "step must be an integer >= 1"),
        ({"lr": -1.0}, ValueError, "lr is out of range"),
        ({"betas": (1.0, 0.999)}, ValueError, r"betas\[0\] is out of range"),
        ({"eps": math.inf}, ValueError, "eps is out of range"),
    ],
)
def test_bad_adamw_arguments(change, error, words):
    args = {
        "params": torch.zeros(10),
        "grads": torch.zeros(10),
        "exp_avg": torch.zeros(10),
        "exp_avg_sq": torch.zeros(10),
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "step": 1,
    }
    args.update(change)
    with pytest.raises(error, match=words):
        ops.adamw_step_(
            args["params"],
            args["grads"],
            args["exp_avg"],
            args["exp_avg_sq"],
            lr=args["lr"],
            betas=args["betas"],
            eps=args["eps"],
            step=args["step"],
        )


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)
    )


def train(model, opt, steps, seed=0, set_to_none=False, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 7, generator=gen), torch.randn(8, 3, generator=gen)
        x, y = x.to(device), y.to(device)
        if set_to_none:
            model.zero_grad(set_to_none=True)
        else:
            opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("set_to_none", [False, True])
def test_flat_adamw_trains_like_torch_adamw(set_to_none):
    ours, theirs = small_model(), small_model()
    flat = ops.FlatAdamW(ours.parameters(), lr=1e-2, weight_decay=0.05)
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.05)
    train(ours, flat, 6, set_to_none=set_to_none)
    train(theirs, ref, 6)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    first = next(ours.parameters())
    assert first.data_ptr() == flat.flat_params.data_ptr()  # still views of the buffer
    assert first.grad.data_ptr() == flat.flat_grads.data_ptr()


def test_flat_adamw_state_dict_resumes_exactly():
    a = small_model()
    opt = ops.FlatAdamW(a.parameters(), lr=1e-2)
    train(a, opt, 3)
    saved_model = {k: v.clone() for k, v in a.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # as torch.save would: not live views
    train(a, opt, 3, seed=1)
    b = small_model(seed=5)
    b.load_state_dict(saved_model)
    opt_b = ops.FlatAdamW(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(saved_opt)
    assert opt_b.steps == 3
    train(b, opt_b, 3, seed=1)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_flat_adamw_follows_an_lr_scheduler():
    model = small_model()
    opt = ops.FlatAdamW(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)
    before = [p.clone() for p in model.parameters()]
    train(model, opt, 1)
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    assert all(torch.equal(x, y) for x, y in zip(before, model.parameters(), strict=True))


def test_flat_adamw_refuses_what_one_launch_cannot_do():
    with pytest.raises(ValueError, match="one dtype on one device"):
        ops.FlatAdamW(
            [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3).half())]
        )
    with pytest.raises(ValueError, match="one parameter group"):
        ops.FlatAdamW(
            [
                {"params": [torch.nn.Parameter(torch.zeros(3))]},
                {"params": [torch.nn.Parameter(torch.zeros(3))]},
            ]
        )
    model = small_model()
    opt = ops.FlatAdamW(model.parameters())
    next(model.parameters()).grad = None
    with pytest.raises(RuntimeError, match="parameter 0 .* has no gradient"):
        opt.step()
    model = small_model()
    opt = ops.FlatAdamW(model.parameters())
    model[0].weight.data = torch.zeros(16, 7)
    with pytest.raises(RuntimeError, match="no longer lives in FlatAdamW's buffer"):
        opt.step()


# --- custom ops, torch.compile, dispatch, no Triton ------------------------------------


def test_custom_ops_pass_opcheck():
    x = torch.randn(300)
    q = ops.quantize_blockwise(x, 64)
    ns = torch.ops.meshminer
    torch.library.opcheck(ns.quantize_blockwise, (x, 64))
    torch.library.opcheck(ns.dequantize_blockwise, (q.codes, q.scales, [300], torch.bfloat16, 64))
    batch = ops.QuantizedBatch.stack([q, q])
    torch.library.opcheck(
        ns.outer_nesterov_step_,
        (torch.randn(300), torch.zeros(300), batch.codes, batch.scales, 64, 0.7, 0.9),
    )
    four = [torch.randn(300) for _ in range(4)]
    torch.library.opcheck(ns.adamw_step_, (*four, 1e-3, 0.9, 0.999, 1e-8, 0.01, 2))


def test_ops_trace_under_torch_compile():
    def round_trip(x: torch.Tensor) -> torch.Tensor:
        return ops.dequantize_blockwise(ops.quantize_blockwise(x, 64)) * 2

    def step(p, m, v, g):
        ops.adamw_step_(p, g, m, v, lr=1e-2, step=1)
        return p.sum()

    x = torch.randn(5, 70)
    compiled = torch.compile(round_trip, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), round_trip(x))
    tensors = [torch.randn(100).abs() for _ in range(4)]  # exp_avg_sq must be >= 0
    copies = [t.clone() for t in tensors]
    torch.compile(step, backend="aot_eager", fullgraph=True)(*tensors)
    step(*copies)
    assert all(torch.equal(a, b) for a, b in zip(tensors, copies, strict=True))


def test_cpu_tensors_take_the_reference_outside_the_interpreter_block():
    before = dict(_dispatch.launches)
    ops.dequantize_blockwise(ops.quantize_blockwise(torch.randn(100)))
    assert not _dispatch.use_triton(torch.zeros(1))
    assert dict(_dispatch.launches) == before
    assert os.environ.get("TRITON_INTERPRET", "0") != "1" or _dispatch.interpreting()


@pytest.mark.skipif(not _dispatch.triton_available(), reason="triton is not installed")
def test_triton_on_cpu_needs_the_interpreter_from_the_start():
    if _dispatch.interpreting():
        pytest.skip("this process interprets")
    from training.ops.testing import triton_on_cpu

    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"), triton_on_cpu():
        pass
    assert not _dispatch._FORCE_ON_CPU


@pytest.mark.process
def test_the_base_install_without_triton_uses_the_references():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, training.ops as ops\n"
        "from training.ops import testing\n"
        "assert not ops.triton_available()\n"
        "x = torch.randn(1000)\n"
        "y = ops.dequantize_blockwise(ops.quantize_blockwise(x))\n"
        "assert (x - y).abs().max() < 0.05\n"
        "try:\n"
        "    with testing.triton_on_cpu(): pass\n"
        "except RuntimeError as e:\n"
        "    assert 'not installed' in str(e)\n"
        "else:\n"
        "    raise AssertionError('triton_on_cpu ran without triton')\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_quantization_table_in_the_docs_holds():
    """docs/ops.md's block-size table: bytes per element, RMS and max error on N(0,1)."""
    text = (ROOT / "docs" / "ops.md").read_text()
    rows = re.findall(
        r"^\| \**(\d+)\** \| \**([\d.]+)\**.*?\| \**([\d.]+)%\** \| ([\d.]+)% \|$", text, re.M
    )
    assert {int(r[0]) for r in rows} == {16, 64, 256, 1024, 4096}
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    for block_size, per_element, rms, worst in rows:
        q = ops.quantize_blockwise(x, int(block_size))
        err = x - ops.dequantize_blockwise(q)
        assert q.nbytes / x.numel() == pytest.approx(float(per_element), abs=6e-4)
        assert 100 * err.pow(2).mean().sqrt() / x.pow(2).mean().sqrt() == pytest.approx(
            float(rms), abs=0.011
        )
        by_block = err.abs().view(-1, int(block_size)).amax(1) / x.abs().view(
            -1, int(block_size)
        ).amax(1)
        assert 100 * by_block.max() == pytest.approx(float(worst), abs=6e-4)


def test_flat_adamw_takes_over_from_torch_adamw():
    a, b = small_model(), small_model()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
    train(a, opt_a, 3)
    b.load_state_dict(a.state_dict())
    opt_b = ops.FlatAdamW(b.parameters(), lr=1e-2)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert opt_b.steps == 3
    train(a, opt_a, 2, seed=1)
    train(b, opt_b, 2, seed=1)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
