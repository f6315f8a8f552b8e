"""`model.init` and `model.trainable` applied to a module (`training.spec.start` is the
spec side): the init's tensors loaded, checked name by name against the model, and
every parameter outside the trainable patterns frozen.

`training.model.modules.build_model` applies a prepared `Start` to every module it builds, so a
single run, its replay, an elastic share and the owner's outer step all start from the
same state and train the same parameters.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from training.errors import SpecError
from training.model.weights import DTYPES
from training.spec.job import JobSpec


@dataclass(frozen=True)
class Start:
    init: Mapping[str, torch.Tensor] | None  # the state training starts from
    trainable: tuple[str, ...]  # glob patterns; () : every parameter trains

    def trains(self, name: str) -> bool:
        return not self.trainable or any(fnmatch.fnmatchcase(name, p) for p in self.trainable)


def load_start(spec: JobSpec, locate: Callable[[str], Path] | None = None) -> Start | None:
    """The spec's start, its init read from the local file or the blob `locate` finds."""
    start = spec.start
    if start.init is None and not start.trainable:
        return None
    init = None
    if start.init is not None:
        sha = start.init_blob
        if sha is not None and locate is None:
            raise SpecError(f"model.init: {start.init} is a blob; its file is not here")
        init = read_init(locate(sha) if sha is not None and locate else Path(start.init))
    return Start(init, start.trainable)


def read_init(path: Path) -> dict[str, torch.Tensor]:
    """An init file's tensors (safetensors only: no pickle is ever read)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise SpecError(f"model.init: not a readable safetensors file: {str(exc)[:200]}") from None


def apply_start(model: nn.Module, start: Start) -> nn.Module:
    """Load the init (every tensor the model's, by name, shape and dtype) and freeze what
    does not train; `SpecError` naming the first tensor or pattern that does not fit."""
    if start.init is not None:
        check_init(model, start.init)
        if not any(t.is_meta for t in model.state_dict().values()):  # meta: names only
            with torch.no_grad():
                model.load_state_dict(start.init, strict=True)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    for pattern in start.trainable:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise SpecError(
                f"model.trainable: {pattern!r} matches no parameter (they are named {shown})"
            )
    names_of: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(parameter), []).append(name)
    for parameter in model.parameters():  # a tied parameter trains if any name matches
        if not any(start.trains(name) for name in names_of[id(parameter)]):
            parameter.requires_grad_(False)
    return model


def check_init(model: nn.Module, init: Mapping[str, torch.Tensor]) -> None:
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name not in init:
            raise SpecError(f"model.init: the file has no tensor {name!r}, which the model has")
        given = init[name]
        if tuple(given.shape) != tuple(tensor.shape) or given.dtype != tensor.dtype:
            raise SpecError(
                f"model.init: tensor {name!r} is {_describe(given)}; the model's is "
                f"{_describe(tensor)}"
            )
    extra = sorted(set(init) - set(expected))
    if extra:
        raise SpecError(f"model.init: tensor {extra[0]!r} is not the model's")


def trainable_count(model: nn.Module) -> int:
    """Parameters that train (tied weights once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def frozen_names(model: nn.Module) -> frozenset[str]:
    """State dict names of the frozen parameters (both names of a tied one)."""
    return frozenset(
        name
        for name, parameter in model.named_parameters(remove_duplicate=False)
        if not parameter.requires_grad
    )


def _describe(tensor: torch.Tensor) -> str:
    return f"{DTYPES.get(tensor.dtype, str(tensor.dtype))} {list(tensor.shape)}"
