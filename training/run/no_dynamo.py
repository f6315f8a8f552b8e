"""torch.optim, and models built on the meta device, without importing torch._dynamo:
2.6 s of CPU less per process.

torch's optimizers import torch._dynamo (the compiler's front end) the first time
they are used, only so that `torch.compile` leaves them alone: `Optimizer.step`
imports it to mark a graph break, and the functions torch wraps in
`torch._compile._disable_dynamo` (`add_param_group`, `zero_grad`, `state_dict`,
`load_state_dict`, the functional `adam` and `sgd`, ...) import it to build their
`torch._dynamo.disable`d version. That import costs as much CPU as `import torch`
itself: 2.6 s on a 2-core VM (2026-11-29), in every runner's fork server, every
fresh runner and every `train-local`, and on a machine whose nodes all start at once
it was a third of the time before a job's first round ended. The reference
implementations that run a model's initialisation on the meta device (`torch._refs`'
`normal_`, `mul`, ...), where we count a job's tensors without allocating them
(`expected_tensors`), import it the same way: 1.5 s of CPU in the owner's first
runner of an elastic job, between its submission and the first offer. Nothing here compiles
(no `torch.compile`; programs run in our own interpreter), so:

- `skip_dynamo_wrappers` fills each such wrapper's cache with the plain function
  (the one its closure holds), which the wrapper then calls as it would call its
  disabled version;
- `optimizer_step` calls the class's own `step` under `torch.no_grad()`, as torch's
  wrappers do when nothing compiles, and records the call for the learning-rate
  schedule's order check.

Both recognise torch's wrappers by their code (and the step by its `__wrapped__`
link); if a torch release builds them otherwise, each falls back to what torch does
(with the import). tests/training/test_no_dynamo.py checks, in a fresh process,
that training with every optimizer we make, and counting a model's tensors on the
meta device, import no torch._dynamo, and that training gives the same bits as
`optimizer.step()`.
"""

from __future__ import annotations

import gc
import inspect
import sys
import types
from contextlib import suppress

import torch

CACHE = "__dynamo_disable"  # where torch's wrapper keeps the function it calls
_scanned: tuple[int, int] | None = None  # (torch's modules, custom ops) at the last scan


def skip_dynamo_wrappers() -> int:
    """Let every function torch has wrapped in `_disable_dynamo` so far (torch.optim's,
    the meta device's reference implementations, the kernels of the custom ops
    registered so far, `training.ops`) run without torch._dynamo; how many wrappers
    were filled (0 when all were before, or when this torch builds them some other
    way). The wrappers are found among the interpreter's objects (30-50 ms); torch
    makes them as its own modules load and as ops are registered, so a call when
    neither happened since the last does nothing (an elastic simulation makes an
    optimizer for every share; a runner forked from a warm server imports a few
    modules of its own, none of them torch's, and then skips the scan)."""
    global _scanned
    from torch._compile import _disable_dynamo
    from torch._library.custom_ops import OPDEFS

    loaded = (
        sum(1 for name in list(sys.modules) if name.partition(".")[0] == "torch"),
        len(OPDEFS),
    )
    if loaded == _scanned:
        return 0
    wrapper_code = _disable_dynamo(_plain).__code__
    if "fn" not in wrapper_code.co_freevars:
        return 0
    cell = wrapper_code.co_freevars.index("fn")
    filled = 0
    for candidate in gc.get_objects():
        if type(candidate) is not types.FunctionType or candidate.__code__ is not wrapper_code:
            continue
        with suppress(ValueError, AttributeError, TypeError):  # an empty cell; no attributes
            plain = candidate.__closure__[cell].cell_contents  # type: ignore[index]
            if callable(plain) and CACHE not in getattr(plain, "__dict__", {}):
                setattr(plain, CACHE, plain)
                filled += 1
    _scanned = loaded
    return filled


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.step()` as torch runs it outside `torch.compile` (no hooks are ever
    registered here), without its import of torch._dynamo."""
    wrapped = type(optimizer).step
    step = inspect.unwrap(wrapped)
    if step is wrapped or optimizer.defaults.get("differentiable"):
        optimizer.step()
        return
    with torch.no_grad():
        step(optimizer)
    optimizer._opt_called = True  # type: ignore[attr-defined]  # the schedule's check


def _plain() -> None:
    """A function for `_disable_dynamo` to wrap: every wrapper shares that code."""
