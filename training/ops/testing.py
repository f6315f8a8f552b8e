"""Run the Triton kernels on CPU tensors, in Triton's interpreter, for tests.

    TRITON_INTERPRET=1 python -c '
    import torch
    from training.ops import quantize_blockwise
    from training.ops.testing import triton_on_cpu
    with triton_on_cpu():
        q = quantize_blockwise(torch.randn(1000))   # the Triton kernel ran, on numpy
    '

The variable must be in the process's environment before Triton is imported:
Triton wraps its own library functions (`tl.max`, `tl.sum`, ...) for the
interpreter or for the GPU when it is imported, and our kernels when they are
first used. So a process is either interpreting or not, for good; the test suite
runs its interpreter tests in a child process (tests/training/ops/test_ops_interpreter.py) and
nothing leaks into the tests that run beside them.

Inside the block, CPU tensors take the Triton path; outside it they take the
reference, as in production, even in an interpreting process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from training.ops import _dispatch

HOW = "start the process with TRITON_INTERPRET=1 in its environment"


def interpreter_ready() -> bool:
    """True when this process can run kernels in Triton's interpreter."""
    if not _dispatch.interpreting():
        return False
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    # Triton's own library was wrapped when it was imported: it must be interpreted too
    return isinstance(tl.max, InterpretedFunction)


@contextmanager
def triton_on_cpu() -> Iterator[None]:
    """Within the block, ops on CPU tensors run their Triton kernels, interpreted."""
    if not _dispatch.triton_available():
        raise RuntimeError(
            "triton is not installed; install the test extra (pip install -e '.[test]')"
        )
    if not interpreter_ready():
        raise RuntimeError(
            f"Triton's interpreter is not on in this process; {HOW} (Triton reads it "
            "when it is imported), e.g. "
            "TRITON_INTERPRET=1 pytest tests/training/ops/test_ops_triton.py"
        )
    saved = _dispatch._FORCE_ON_CPU
    _dispatch._FORCE_ON_CPU = True
    try:
        yield
    finally:
        _dispatch._FORCE_ON_CPU = saved
