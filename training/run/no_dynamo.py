"""torch.optim without importing torch._dynamo: 2.6 s of CPU less per process.

torch's optimizers import torch._dynamo (the compiler's front end) the first time
they are used, only so that `torch.compile` leaves them alone: `Optimizer.step`
imports it to mark a graph break, and the functions torch wraps in
`torch._compile._disable_dynamo` (`add_param_group`, `zero_grad`, `state_dict`,
`load_state_dict`, the functional `adam` and `sgd`, ...) import it to build their
`torch._dynamo.disable`d version. That import costs as much CPU as `import torch`
itself: 2.6 s on a 2-core VM (2026-11-29), in every runner's fork server, every
fresh runner and every `train-local`, and on a machine whose nodes all start at once
it was a third of the time before a job's first round ended. Nothing here compiles
(no `torch.compile`; programs run in our own interpreter), so:

- `skip_dynamo_wrappers` fills each such wrapper's cache with the plain function,
  which the wrapper then calls as it would call its disabled version;
- `optimizer_step` calls the class's own `step` under `torch.no_grad()`, as torch's
  wrappers do when nothing compiles, and records the call for the learning-rate
  schedule's order check.

Both recognise torch's wrappers by their code and `__wrapped__` links; if a torch
release builds them otherwise, each falls back to what torch does (with the
import). tests/training/test_no_dynamo.py checks, in a fresh process, that training
with every optimizer we make imports no torch._dynamo and gives the same bits as
`optimizer.step()`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

CACHE = "__dynamo_disable"  # where torch's wrapper keeps the function it calls


def skip_dynamo_wrappers() -> int:
    """Let torch.optim's not-to-be-compiled functions, and the kernels of the custom
    ops registered so far (`training.ops`), run without torch._dynamo; how many
    wrappers were filled (0 when all were before, or when this torch builds them some
    other way). Cheap to call again: a few milliseconds."""
    from torch._compile import _disable_dynamo
    from torch._library.custom_ops import OPDEFS

    wrapper_code = _disable_dynamo(_plain).__code__
    kernels = [fn for op in list(OPDEFS.values()) for fn in op._backend_fns.values()]
    filled = 0
    for function in [*_functions("torch.optim"), *kernels]:
        for candidate in (function, *_closed_over(function)):
            plain = getattr(candidate, "__wrapped__", None)
            if candidate.__code__ is wrapper_code and callable(plain):
                filled += CACHE not in vars(plain)
                setattr(plain, CACHE, plain)
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


def _functions(package: str) -> Iterator[Callable[..., Any]]:
    """Every function of `package`'s loaded modules: module-level, and methods."""
    modules = [m for name, m in list(sys.modules.items()) if name.startswith(package) and m]
    for module in modules:
        for value in list(vars(module).values()):
            if inspect.isfunction(value):
                yield value
            elif inspect.isclass(value):
                yield from (v for v in vars(value).values() if inspect.isfunction(v))


def _closed_over(function: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The functions `function` closes over: torch.optim's `maybe_fallback` keeps its
    `_disable_dynamo` wrapper there."""
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(value):
            found.append(value)
    return found
