"""The Triton kernels of training.ops compiled for a real GPU, against their references:
the same checks as test_ops_triton.py (which runs them in Triton's interpreter), on
CUDA tensors, plus the one only a GPU can answer: the codes a GPU writes on the wire
are the bytes the CPU reference writes for the same values, so a delta does not
depend on which kind of machine quantized it.

Skipped without a CUDA device (the suite's machines have none); run on one with

    python -m pytest tests/training/ops/test_ops_cuda.py
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("this process interprets kernels; these run compiled", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the compiled kernels need a GPU", allow_module_level=True)
pytest.importorskip("triton", reason="triton is not installed (the gpu extra has it)")

from test_ops_reference import SPECIALS, same, small_model, train  # noqa: E402

import training.ops as ops  # noqa: E402
from training.ops import _dispatch, reference  # noqa: E402
from training.ops.quant import FLOAT_DTYPES  # noqa: E402

CUDA = torch.device("cuda")
#: as in test_ops_triton.py: float32 relative/absolute; in low precision one ulp
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-6},
    torch.float16: {"rtol": 2**-10, "atol": 1e-6},
}
SHAPES = [(1,), (255,), (256,), (1000,), (33, 70), (7, 300, 5), (1 << 20,)]
BLOCK_SIZES = (16, 64, 256, 1024, 4096)


@contextlib.contextmanager
def launched(name: str):
    before = _dispatch.launches[name]
    yield
    assert _dispatch.launches[name] > before, f"{name} did not launch its kernel"


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int, specials: bool) -> torch.Tensor:
    """Random values on the CPU (float64 drawn, then cast), with specials sprinkled in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * (10.0 ** (seed % 7 - 3))
    if specials:
        for i, value in enumerate(SPECIALS):
            x.view(-1)[(i * 7919) % x.numel()] = value
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("specials", [False, True])
def test_quantize_and_dequantize_match_the_reference_bit_for_bit(dtype, shape, specials):
    for i, block_size in enumerate(BLOCK_SIZES):
        x = values(shape, dtype, seed=i + len(shape), specials=specials)
        gpu = x.to(CUDA)
        if len(shape) >= 2:  # other strides, same values
            gpu = gpu.transpose(0, -1).contiguous().transpose(0, -1)
        with launched("quantize_blockwise"):
            q = ops.quantize_blockwise(gpu, block_size)
        codes, scales = reference.quantize_blockwise(gpu, block_size)
        assert torch.equal(q.codes, codes) and same(q.scales, scales), block_size
        cpu_codes, cpu_scales = reference.quantize_blockwise(x, block_size)
        assert torch.equal(q.codes.cpu(), cpu_codes), "GPU codes differ from the CPU's"
        assert same(q.scales.cpu(), cpu_scales), "GPU scales differ from the CPU's"
        with launched("dequantize_blockwise"):
            y = ops.dequantize_blockwise(q)
        expected = reference.dequantize_blockwise(cpu_codes, cpu_scales, x.shape, dtype, block_size)
        assert same(y.cpu(), expected), block_size


def test_a_wire_delta_is_the_same_bytes_from_a_gpu_and_a_cpu():
    x = values((513, 129), torch.bfloat16, seed=3, specials=False)
    for bits in (8, 4):
        from_gpu = ops.encode_delta(x.to(CUDA), 256, bits)
        assert from_gpu == ops.encode_delta(x, 256, bits), bits


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_outer_step_matches_the_reference(dtype, momentum, k):
    gen = torch.Generator().manual_seed(k)
    shape, block_size = (1000, 37), 256
    x = torch.randn(shape, generator=gen).to(dtype).to(CUDA)
    deltas = [
        ops.quantize_blockwise((torch.randn(shape, generator=gen) * 0.05).to(CUDA), block_size)
        for _ in range(k)
    ]
    batch = ops.QuantizedBatch.stack(deltas)
    mine, mine_buf = x.clone(), torch.zeros(shape, dtype=torch.float32, device=CUDA)
    for _ in range(3):
        theirs, theirs_buf = mine.clone(), mine_buf.clone()
        with launched("outer_nesterov_step"):
            ops.outer_nesterov_step_(mine, mine_buf, batch, lr=0.7, momentum=momentum)
        reference.outer_nesterov_step_(
            theirs, theirs_buf, batch.codes, batch.scales, block_size, 0.7, momentum
        )
        torch.testing.assert_close(mine, theirs, **TOLERANCE[dtype])
        torch.testing.assert_close(mine_buf, theirs_buf, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 1000, 1025, 1 << 20])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_the_reference(dtype, n, weight_decay):
    gen = torch.Generator().manual_seed(n)
    mine = [
        torch.randn(n, generator=gen).to(dtype).to(CUDA),
        torch.zeros(n, device=CUDA),
        torch.zeros(n, device=CUDA),
    ]
    for step in range(1, 4):
        grad = torch.randn(n, generator=gen).to(dtype).to(CUDA)
        theirs = [t.clone() for t in mine]
        with launched("adamw_step"):
            ops.adamw_step_(
                mine[0], grad, mine[1], mine[2], lr=3e-2, weight_decay=weight_decay, step=step
            )
        reference.adamw_step_(
            theirs[0], grad, theirs[1], theirs[2], 3e-2, 0.9, 0.999, 1e-8, weight_decay, step
        )
        torch.testing.assert_close(mine[0], theirs[0], **TOLERANCE[dtype])
        for a, b in zip(mine[1:], theirs[1:], strict=True):
            torch.testing.assert_close(a, b, **TOLERANCE[torch.float32])


def test_flat_adamw_on_the_gpu_trains_like_the_reference_on_the_cpu():
    ours, theirs = small_model().to(CUDA), small_model()
    with launched("adamw_step"):
        train(ours, ops.FlatAdamW(ours.parameters(), lr=1e-2), 4, device=CUDA)
    train(theirs, ops.FlatAdamW(theirs.parameters(), lr=1e-2), 4)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


def test_the_ops_trace_under_torch_compile_on_a_gpu():
    x = torch.randn(4096, device=CUDA)

    @torch.compile(fullgraph=True)
    def round_trip(t: torch.Tensor) -> torch.Tensor:
        codes, scales = torch.ops.meshminer.quantize_blockwise(t, 256)
        return torch.ops.meshminer.dequantize_blockwise(codes, scales, [4096], t.dtype, 256)

    expected = ops.dequantize_blockwise(ops.quantize_blockwise(x, 256))
    assert same(round_trip(x), expected)
