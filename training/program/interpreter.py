"""The interpreter: a program as an `nn.Module` whose forward is a plain loop over the
checked nodes, each an allowed operator called with the values named before it.

Autograd gives the backward, as in eager PyTorch, because the nodes are the same
`aten` calls the user's modules made: in-place ops, BatchNorm's running statistics
(mutated in place by `batch_norm`) and tied weights (one `Parameter` under two names)
behave as they did for the user, and the weights come out bitwise equal to eager
training on the same batches. The ops that draw random numbers (dropout, attention
dropout, `bernoulli`, `rand_like`) draw from `training.model.dropout` instead of the
device's generator, so that an owner on another kind of device can replay a segment;
a program with dropout trains like its eager module in distribution, not bit for bit.

Parameters keep the user's names (a tree of empty modules holds them), so the state
dict loads into the user's own module with `load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from training.model.dropout import PROGRAM_OPS
from training.program.allowlist import FACTORY_OPS, callable_for
from training.program.errors import ProgramError
from training.program.graph import Device, DType, Graph, MemoryFormat, Ref
from training.program.program import Program

Step = Callable[[dict[str, Any], torch.device], None]


class ProgramModule(nn.Module):
    """Runs the train graph in train mode and the eval graph (when there is one) in eval."""

    def __init__(
        self,
        program: Program,
        *,
        sample_shape: tuple[int, ...] = (),
        returns_loss: bool = False,
        fixed_batch: int = 0,
    ) -> None:
        super().__init__()
        self.sample_shape = sample_shape  # the first input is reshaped to it (when given)
        self.returns_loss = returns_loss  # `output = "loss"`: forward(x, y) is the loss
        self.fixed_batch = fixed_batch  # the batch size a static export fixed (0: dynamic)
        names: dict[str, list[str]] = {}  # canonical -> every name of it (tied weights)
        for name, canonical in sorted(program.aliases.items()):
            names.setdefault(canonical, []).append(name)
        for canonical, tensor in sorted(program.tensors.items()):
            kind = program.kind(canonical)
            value = tensor.clone()
            if kind == "parameter":
                value = nn.Parameter(value, requires_grad=value.is_floating_point())
            for name in names[canonical]:
                try:
                    owner, leaf = _owner(self, name)
                    if kind == "parameter":
                        owner.register_parameter(leaf, value)
                    else:
                        owner.register_buffer(leaf, value, persistent=name in program.persistent)
                except (KeyError, TypeError, AttributeError) as exc:
                    raise ProgramError(f"model.program: state name {name!r}: {exc}") from None
        self._train = (program.train, compile_steps(program.train))
        self._eval = self._train
        if program.eval is not None:
            self._eval = (program.eval, compile_steps(program.eval))

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        graph, steps = self._train if self.training else self._eval
        env: dict[str, Any] = {}
        for item in graph.inputs:
            if item.kind != "user_input":
                env[item.name] = (
                    self.get_parameter(item.target)
                    if item.kind == "parameter"
                    else self.get_buffer(item.target)
                )
        users = graph.user_inputs
        if len(inputs) != len(users):
            raise TypeError(f"the program takes {len(users)} inputs, got {len(inputs)}")
        if self.sample_shape and tuple(inputs[0].shape[1:]) != self.sample_shape:
            inputs = (inputs[0].reshape(inputs[0].shape[0], *self.sample_shape), *inputs[1:])
        for item, value in zip(users, inputs, strict=True):
            env[item.name] = value
        device = inputs[0].device
        for step in steps:
            step(env, device)
        for buffer, value in graph.mutations:
            self.get_buffer(buffer).copy_(env[value])
        return env[graph.outputs[0]]


def compile_steps(graph: Graph) -> list[Step]:
    """One closure per node, its operator and constant arguments bound once."""
    return [_step(node.target, node.args, node.kwargs, node.outputs) for node in graph.nodes]


def _step(target: str, args: tuple, kwargs: tuple, outputs: tuple) -> Step:
    op = callable_for(target)  # KeyError for what is not allowed
    op = PROGRAM_OPS.get(target, op)  # random draws: the same bits on every device
    kw = dict(kwargs)
    if target in FACTORY_OPS and "device" not in kw:  # made where the run is (meta: nowhere)
        kw["device"] = Device()

    def step(env: dict[str, Any], device: torch.device) -> None:
        result = op(
            *(_resolve(a, env, device) for a in args),
            **{k: _resolve(v, env, device) for k, v in kw.items()},
        )
        _bind(outputs, result, env)

    return step


def _resolve(value: Any, env: dict[str, Any], device: torch.device) -> Any:
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, tuple):
        return [_resolve(v, env, device) for v in value]
    if isinstance(value, DType | MemoryFormat):
        return getattr(torch, value.name)  # names from the reader's fixed tables
    if isinstance(value, Device):
        return device
    return value


def _bind(outputs: tuple, result: Any, env: dict[str, Any]) -> None:
    if len(outputs) == 1:
        values: Any = (result,)
    else:
        values = result if isinstance(result, tuple | list) else (result,)
    if len(values) != len(outputs):
        raise TypeError(f"an operator returned {len(values)} values for {len(outputs)} outputs")
    for name, value in zip(outputs, values, strict=True):
        if isinstance(name, tuple):
            if len(name) != len(value):
                raise TypeError(f"an operator returned {len(value)} tensors for {len(name)} names")
            env.update(zip(name, value, strict=True))
        elif name is not None:
            env[name] = value


def _owner(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    """The module that holds `dotted`'s last part, creating empty modules on the way."""
    *path, leaf = dotted.split(".")
    module = root
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = nn.Module()
            module.add_module(part, child)
        module = child
    return module, leaf
