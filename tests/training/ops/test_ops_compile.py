"""The Triton kernels compile for NVIDIA GPUs (sm_80, sm_90) with no GPU present, and
the machine code has the properties the design relies on: vectorized 16-byte loads
and stores on whole tiles, correctly rounded division and square root, and no fused
multiply-add in quantization (so its codes equal the reference's on a GPU too).

Triton's own compiler and its bundled ptxas do this on the CPU; what cannot be
checked without a GPU is speed (benchmarks/ops.py, docs/ops.md)."""

from __future__ import annotations

import os
import re

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (the test extra has it)")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("this process interprets kernels; nothing compiles", allow_module_level=True)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from training.ops import _kernels  # noqa: E402

pytestmark = pytest.mark.process  # Triton's compiler runs ptxas in a subprocess

ALIGNED = [["tt.divisibility", 16]]  # what Triton assumes of 16-byte aligned arguments
BLOCKWISE = {
    "n": "i32",
    "row_start": "i32",
    "row_end": "i32",
    "BLOCK_SIZE": "constexpr",
    "ROWS": "constexpr",
    "FULL_BLOCKS": "constexpr",
}


def ptx(kernel, signature, constexprs, aligned, capability=90, **options) -> str:
    names = list(signature)
    attrs = {(names.index(name),): ALIGNED for name in aligned}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    assert compiled.asm["cubin"], "ptxas produced no binary"
    return compiled.asm["ptx"]


def ops(text: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, text))


@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_quantize_compiles_vectorized_without_fma(capability, dtype):
    signature = {"x_ptr": f"*{dtype}", "codes_ptr": "*i8", "scales_ptr": "*fp32", **BLOCKWISE}
    code = ptx(
        _kernels._quantize_kernel,
        signature,
        {"BLOCK_SIZE": 256, "ROWS": 8, "FULL_BLOCKS": True},
        ["x_ptr", "codes_ptr", "scales_ptr", "row_start"],
        capability,
        num_warps=4,
        enable_fp_fusion=False,
    )
    assert ops(code, r"ld\.global\.[\w.]+") == {"ld.global.v4.b32"}
    assert "st.global.v4.b32" in ops(code, r"st\.global\.[\w.]+")
    assert "div.rn.f32" in code and "div.full" not in code and "div.approx" not in code
    assert "fma." not in code


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_dequantize_and_outer_step_compile_vectorized(dtype):
    signature = {"codes_ptr": "*i8", "scales_ptr": "*fp32", "out_ptr": f"*{dtype}", **BLOCKWISE}
    code = ptx(
        _kernels._dequantize_kernel,
        signature,
        {"BLOCK_SIZE": 256, "ROWS": 8, "FULL_BLOCKS": True},
        ["codes_ptr", "scales_ptr", "out_ptr", "row_start"],
        num_warps=4,
    )
    assert "ld.global.v4.b32" in code and ops(code, r"st\.global\.[\w.]+") == {"st.global.v4.b32"}
    signature = {
        "params_ptr": f"*{dtype}",
        "buf_ptr": "*fp32",
        "codes_ptr": "*i8",
        "scales_ptr": "*fp32",
        "codes_stride": "i32",
        "nblocks": "i32",
        "n": "i32",
        "row_start": "i32",
        "row_end": "i32",
        "k": "i32",
        "lr": "fp32",
        "momentum": "fp32",
        "BLOCK_SIZE": "constexpr",
        "ROWS": "constexpr",
        "FULL_BLOCKS": "constexpr",
    }
    code = ptx(
        _kernels._outer_kernel,
        signature,
        {"BLOCK_SIZE": 256, "ROWS": 8, "FULL_BLOCKS": True},
        ["params_ptr", "buf_ptr", "codes_ptr", "scales_ptr", "codes_stride", "row_start"],
        num_warps=4,
    )
    assert "ld.global.v4.b32" in code and ops(code, r"st\.global\.[\w.]+") == {"st.global.v4.b32"}
    assert "div.rn.f32" in code


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("masked", [False, True])
def test_adamw_compiles_with_correctly_rounded_sqrt_and_division(dtype, masked):
    tensors = ["params_ptr", "grads_ptr", "exp_avg_ptr", "exp_avg_sq_ptr"]
    scalars = ["decay", "weight1", "beta2", "weight2", "eps", "step_size", "bias_correction2_sqrt"]
    signature = {name: f"*{dtype}" for name in tensors}
    signature.update({"n": "i32", **dict.fromkeys(scalars, "fp32"), "start": "i32"})
    signature.update(LERP_FROM_START="constexpr", BLOCK="constexpr", MASKED="constexpr")
    code = ptx(
        _kernels._adamw_kernel,
        signature,
        {"LERP_FROM_START": True, "BLOCK": 1024, "MASKED": masked},
        [*tensors, "start"],
        num_warps=4,
    )
    assert "sqrt.rn.f32" in code and "sqrt.approx" not in code and "div.rn.f32" in code
    if not masked:  # whole tiles: 16-byte loads of all four streams
        assert ops(code, r"ld\.global\.[\w.]+") == {"ld.global.v4.b32"}
