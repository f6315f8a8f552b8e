"""A program's figures, from the graph itself: exact parameters, forward FLOPs per
sample, activations per sample, and the largest tensor any node makes.

The graph runs once on the `meta` device (shapes and dtypes, no data, no memory)
under torch's `FlopCounterMode`. That dry run is also the guard against a graph that
asks for absurd memory (a 10^12-element `arange`): it happens before any real op, on
the owner at submit and on the volunteer in the runner, and a tensor over
`MAX_TENSOR_BYTES` refuses the program with the node that made it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from training.program.errors import ProgramError
from training.program.graph import Graph
from training.program.interpreter import compile_steps
from training.program.program import Program

FLOP_COUNTER = "torch.utils.flop_counter/2.13"  # named in the receipt's credit formula
MAX_TENSOR_BYTES = 16 * 2**30
DRY_RUN_BATCH = 2  # a symbolic batch size is run at its smallest (export's min)


@dataclass(frozen=True)
class ProgramFigures:
    parameters: int  # trainable and frozen, tied weights once
    flops_per_sample: int  # forward
    activations_per_sample: int  # elements of every node's tensor outputs
    batch: int | None  # the batch size the graph fixes (None: symbolic)
    input_shapes: tuple[tuple[int, ...], ...]  # per sample, for each user input
    input_dtypes: tuple[str, ...]
    output_shape: tuple[int, ...]  # per sample ((), for a loss)


def figures(program: Program, label: str = "model.program") -> ProgramFigures:
    """Dry-run the train graph (and the eval graph) on `meta`; `ProgramError` if a node's
    tensor is too big or a graph fails on its own inputs' shapes."""
    if program.eval is not None:
        _dry_run(program, program.eval, label + " (eval)")
    return _dry_run(program, program.train, label)


def _dry_run(program: Program, graph: Graph, label: str) -> ProgramFigures:
    from torch.utils.flop_counter import FlopCounterMode

    batch = _batch(graph, label)
    run_batch = batch or DRY_RUN_BATCH
    env: dict[str, Any] = {}
    parameters = sum(
        tensor.numel()
        for canonical, tensor in program.tensors.items()
        if program.kind(canonical) == "parameter"
    )
    for item in graph.inputs:
        if item.kind == "user_input":
            shape = [run_batch if isinstance(s, str) else s for s in item.sizes]
            env[item.name] = torch.empty(shape, dtype=getattr(torch, item.dtype), device="meta")
        else:
            env[item.name] = program.state(item.target).to("meta")
    meta = torch.device("meta")
    activations = 0
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        for node, step in zip(graph.nodes, compile_steps(graph), strict=True):
            where = f"{label}: node {node.index} ({node.target})"
            try:
                step(env, meta)
            except Exception as exc:  # a graph that does not fit its own shapes
                why = str(exc)[:300]
                raise ProgramError(f"{where} fails on the inputs' shapes: {why}") from None
            activations += _check_outputs(node.outputs, env, where)
    output = env[graph.outputs[0]]
    per_sample = tuple(output.shape[1:]) if output.dim() else ()
    users = graph.user_inputs
    return ProgramFigures(
        parameters=parameters,
        flops_per_sample=math.ceil(counter.get_total_flops() / run_batch),
        activations_per_sample=math.ceil(activations / run_batch),
        batch=batch,
        input_shapes=tuple(tuple(int(s) for s in i.sizes[1:]) for i in users),
        input_dtypes=tuple(i.dtype for i in users),
        output_shape=per_sample,
    )


def _batch(graph: Graph, label: str) -> int | None:
    """The batch size the user inputs fix, or None when it is one symbol."""
    firsts = {i.sizes[0] if i.sizes else None for i in graph.user_inputs}
    if not graph.user_inputs or None in firsts or len(firsts) != 1:
        raise ProgramError(f"{label}: every input needs the same leading batch dimension")
    for item in graph.user_inputs:
        if any(isinstance(s, str) for s in item.sizes[1:]):
            raise ProgramError(f"{label}: only the batch dimension may be symbolic")
    (first,) = firsts
    return None if isinstance(first, str) else int(first)


def _check_outputs(outputs: tuple, env: dict[str, Any], where: str) -> int:
    elements = 0
    for name in outputs:
        for one in name if isinstance(name, tuple) else (name,):
            value = env.get(one) if one is not None else None
            if isinstance(value, torch.Tensor):
                size = value.numel() * value.element_size()
                if size > MAX_TENSOR_BYTES:
                    raise ProgramError(
                        f"{where} makes a tensor of {value.numel():,} elements "
                        f"({size / 2**30:,.1f} GiB); the limit is {MAX_TENSOR_BYTES >> 30} GiB"
                    )
                elements += value.numel()
    return elements
