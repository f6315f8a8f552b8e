"""The Triton kernels of training.ops against their references, run on CPU tensors in
Triton's interpreter: quantization codes, scales and dequantized values bit for bit,
the fused outer step and AdamW within the tolerances in docs/ops.md, across shapes,
strides and dtypes, with NaN/Inf and empty tensors.

Triton reads TRITON_INTERPRET when it is imported, so this module runs only in a
process started with it set; test_ops_interpreter.py starts one. To run it alone:

    TRITON_INTERPRET=1 .venv/bin/python -m pytest tests/training/ops/test_ops_triton.py
"""

from __future__ import annotations

import contextlib
import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "kernels run in Triton's interpreter in a child process (test_ops_interpreter.py)",
        allow_module_level=True,
    )
pytest.importorskip("triton", reason="triton is not installed (the test extra has it)")

import torch  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_ops_reference import BLOCK_SIZES, FAST, same, tensors  # noqa: E402

import training.ops as ops  # noqa: E402
from training.ops import _dispatch, _kernels, reference  # noqa: E402
from training.ops.quant import FLOAT_DTYPES  # noqa: E402
from training.ops.testing import interpreter_ready, triton_on_cpu  # noqa: E402

# the interpreter evaluates NaN and Inf lanes with numpy, which warns about them
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: kernel vs reference, one step from the same state: float32 relative/absolute; in
#: low precision one unit in the last place (a float32 difference may flip a rounding)
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-6},
    torch.float16: {"rtol": 2**-10, "atol": 1e-6},
}


@pytest.fixture(autouse=True, scope="module")
def kernels_on_cpu():
    with triton_on_cpu():
        yield


@contextlib.contextmanager
def launched(name: str, expected: bool = True):
    """Check that the Triton path really ran: the kernel was launched (if `expected`)."""
    before = _dispatch.launches[name]
    yield
    assert (_dispatch.launches[name] > before) == expected, name


@contextlib.contextmanager
def references_on_cpu():
    """The production rule for the block: CPU tensors take the references."""
    saved, _dispatch._FORCE_ON_CPU = _dispatch._FORCE_ON_CPU, False
    try:
        yield
    finally:
        _dispatch._FORCE_ON_CPU = saved


def test_the_kernels_really_run_in_the_interpreter():
    from triton.runtime.interpreter import InterpretedFunction

    assert interpreter_ready()
    for kernel in (_kernels._quantize_kernel, _kernels._outer_kernel, _kernels._adamw_kernel):
        assert isinstance(kernel, InterpretedFunction)
    assert _dispatch.use_triton(torch.zeros(1))
    with launched("quantize_blockwise"):
        ops.quantize_blockwise(torch.randn(10))


@FAST
@given(x=tensors(), block_size=st.sampled_from(BLOCK_SIZES))
def test_quantize_and_dequantize_match_the_reference_bit_for_bit(x, block_size):
    codes, scales = reference.quantize_blockwise(x, block_size)
    expected = reference.dequantize_blockwise(codes, scales, x.shape, x.dtype, block_size)
    with launched("quantize_blockwise", x.numel() > 0):
        q = ops.quantize_blockwise(x, block_size)
    assert torch.equal(q.codes, codes)
    assert same(q.scales, scales)
    with launched("dequantize_blockwise", x.numel() > 0):
        y = ops.dequantize_blockwise(q)
    assert same(y, expected)


@FAST
@given(
    x=tensors(max_numel=2500, specials=False),
    k=st.integers(1, 4),
    buf_dtype=st.sampled_from([torch.float32, None]),
    lr=st.sampled_from([0.7, 1.0]),
    momentum=st.sampled_from([0.9, 0.0]),
    block_size=st.sampled_from(BLOCK_SIZES),
    steps=st.integers(1, 3),
)
def test_outer_step_matches_the_reference(x, k, buf_dtype, lr, momentum, block_size, steps):
    gen = torch.Generator().manual_seed(k * 7 + steps)
    deltas = [
        ops.quantize_blockwise(torch.randn(x.shape, generator=gen) * 0.05, block_size)
        for _ in range(k)
    ]
    batch = ops.QuantizedBatch.stack(deltas)
    buf_dtype = buf_dtype or x.dtype
    mine, mine_buf = x.clone(), torch.zeros(x.shape, dtype=buf_dtype)
    for _ in range(steps):
        theirs, theirs_buf = mine.clone(), mine_buf.clone()  # per step, as for AdamW
        with launched("outer_nesterov_step", x.numel() > 0):
            ops.outer_nesterov_step_(mine, mine_buf, batch, lr=lr, momentum=momentum)
        reference.outer_nesterov_step_(
            theirs, theirs_buf, batch.codes, batch.scales, block_size, lr, momentum
        )
        torch.testing.assert_close(mine, theirs, **TOLERANCE[x.dtype])
        torch.testing.assert_close(mine_buf, theirs_buf, **TOLERANCE[buf_dtype])


@FAST
@given(
    n=st.sampled_from([0, 1, 5, 1000, 1024, 1025, 2500]),
    dtype=st.sampled_from(FLOAT_DTYPES),
    state_dtype=st.sampled_from([torch.float32, None]),
    lr=st.sampled_from([1e-3, 3e-2]),
    betas=st.sampled_from([(0.9, 0.999), (0.6, 0.9), (0.3, 0.99)]),
    weight_decay=st.sampled_from([0.0, 0.1]),
    steps=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_adamw_matches_the_reference(n, dtype, state_dtype, lr, betas, weight_decay, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    state_dtype = state_dtype or dtype
    start = torch.randn(n, generator=gen).to(dtype)
    mine = [start.clone(), torch.zeros(n, dtype=state_dtype), torch.zeros(n, dtype=state_dtype)]
    hyper = {"lr": lr, "betas": betas, "eps": 1e-8, "weight_decay": weight_decay}
    for step in range(1, steps + 1):
        grad = torch.randn(n, generator=gen).to(dtype)
        theirs = [t.clone() for t in mine]  # per step: low-precision drift compounds
        with launched("adamw_step", n > 0):
            ops.adamw_step_(mine[0], grad, mine[1], mine[2], step=step, **hyper)
        reference.adamw_step_(
            theirs[0], grad, theirs[1], theirs[2], lr, *betas, 1e-8, weight_decay, step
        )
        torch.testing.assert_close(mine[0], theirs[0], **TOLERANCE[dtype])
        for a, b in zip(mine[1:], theirs[1:], strict=True):
            torch.testing.assert_close(a, b, **TOLERANCE[state_dtype])


def test_strided_params_are_written_back():
    params = torch.randn(40, 30).t()
    buf = torch.zeros(40, 30).t()
    delta = ops.quantize_blockwise(torch.randn(30, 40), 64)
    expected, expected_buf = params.contiguous(), buf.contiguous()
    ops.outer_nesterov_step_(params, buf, [delta], lr=0.5)
    reference.outer_nesterov_step_(
        expected, expected_buf, delta.codes[None], delta.scales[None], 64, 0.5, 0.9
    )
    torch.testing.assert_close(params, expected, **TOLERANCE[torch.float32])
    assert not params.is_contiguous()
    p, m, v = torch.randn(30, 20).t(), torch.zeros(20, 30), torch.zeros(30, 20).t()
    g = torch.randn(20, 30)
    q, qm, qv = p.contiguous(), m.clone(), v.contiguous()
    ops.adamw_step_(p, g, m, v, lr=0.1, step=1)
    reference.adamw_step_(q, g, qm, qv, 0.1, 0.9, 0.999, 1e-8, 1e-2, 1)
    torch.testing.assert_close(p, q, **TOLERANCE[torch.float32])


def test_empty_tensors_launch_nothing():
    before = dict(_dispatch.launches)
    q = ops.quantize_blockwise(torch.zeros(0, 3))
    assert ops.dequantize_blockwise(q).shape == (0, 3)
    ops.outer_nesterov_step_(
        torch.zeros(0), torch.zeros(0), [ops.quantize_blockwise(torch.zeros(0))], lr=1.0
    )
    ops.adamw_step_(*(torch.zeros(0) for _ in range(4)), lr=1e-3, step=1)
    assert dict(_dispatch.launches) == before


def test_flat_adamw_on_the_kernel_trains_like_the_reference():
    from test_ops_reference import small_model, train

    ours, theirs = small_model(), small_model()
    train(ours, ops.FlatAdamW(ours.parameters(), lr=1e-2), 4)
    with references_on_cpu():
        train(theirs, ops.FlatAdamW(theirs.parameters(), lr=1e-2), 4)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_wire_round_trip_through_the_kernels():
    x = torch.randn(33, 70, dtype=torch.bfloat16)
    data = ops.encode_delta(x, 128)
    y = ops.dequantize_blockwise(ops.decode_delta(data))
    codes, scales = reference.quantize_blockwise(x, 128)
    assert torch.equal(y, reference.dequantize_blockwise(codes, scales, x.shape, x.dtype, 128))


def test_opcheck_on_the_kernel_path():
    x = torch.randn(300)
    q = ops.quantize_blockwise(x, 64)
    torch.library.opcheck(torch.ops.meshminer.quantize_blockwise, (x, 64))
    torch.library.opcheck(
        torch.ops.meshminer.dequantize_blockwise, (q.codes, q.scales, [300], torch.float16, 64)
    )
