"""Which implementation an op runs: the Triton kernel or the pure-torch reference.

The rule (`use_triton`): the Triton kernel runs when Triton is importable and every
tensor the op touches is on a CUDA device; everything else (CPU tensors, or no
Triton, as in the base install) runs the reference in `training.ops.reference`.

Tests need the kernels on CPU. Triton's interpreter (`TRITON_INTERPRET=1`) runs a
kernel's body with numpy on host memory. Triton reads the variable when it is
imported (its own `tl.max`, `tl.sum`, ... are wrapped then) and when it wraps a
kernel, so a process interprets or it does not, from its start. Our kernels are
wrapped lazily, on first use (`kernels()`), never at import time. Even in an
interpreting process, CPU tensors take the Triton path only inside
`training.ops.testing.triton_on_cpu()`, which sets `_FORCE_ON_CPU` for its block.

Triton is imported lazily and only ImportError means "not installed": a broken
install should fail loudly where it is used, not silently fall back.
"""

from __future__ import annotations

import collections
import functools
import os
from types import ModuleType
from typing import Any

import torch

#: set by `training.ops.testing.triton_on_cpu()`: run the kernels on CPU tensors
_FORCE_ON_CPU = False

#: kernel launches by name, so tests can tell that the Triton path really ran
launches: collections.Counter[str] = collections.Counter()


@functools.cache
def _triton() -> ModuleType | None:
    try:
        import triton
    except ImportError:
        return None
    return triton


def triton_available() -> bool:
    """True when Triton can be imported (the `gpu` or `test` extra is installed)."""
    return _triton() is not None


def interpreting() -> bool:
    """True when Triton would wrap a kernel for its CPU interpreter right now."""
    triton = _triton()
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # triton < 3.4 has no knobs


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether an op over `tensors` runs its Triton kernel (see the module docstring)."""
    if all(t.device.type == "cuda" for t in tensors):
        return triton_available()
    if _FORCE_ON_CPU:
        return interpreting() and all(t.device.type == "cpu" for t in tensors)
    return False


@functools.cache
def kernels() -> Any:
    """The kernel launchers (`_kernels.build()`), imported on first use."""
    from training.ops import _kernels

    return _kernels.build(launches)
