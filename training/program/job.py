"""A job spec's program: converted from the user's archives (by the owner's node, or
by `train-local` here), or read from its blob and checked against the figures the spec
states; kept while the process runs.

Content addressing makes the cache safe to share: a `blob:` program is the same
bytes wherever it was read.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.program.convert import convert_with_figures
from training.program.errors import ProgramError
from training.program.figures import ProgramFigures, figures
from training.program.program import Program, decode_program, encode_program
from training.spec.job import JobSpec, ProgramSpec, model_files, with_program_blob

Locate = Callable[[str], Path]  # sha256 -> the blob's file
_CACHE: OrderedDict[str, tuple[Program, ProgramFigures]] = OrderedDict()
_CACHE_SIZE = 4
_PINNED: dict[str, tuple[Program, ProgramFigures]] = {}  # converted here (train-local)


def program_of(spec: JobSpec, locate: Locate | None = None) -> tuple[Program, ProgramFigures]:
    """A converted spec's program and its figures; `locate` finds the program's blob.

    The program is refused unless its figures are exactly the spec's."""
    model = spec.model
    if not isinstance(model, ProgramSpec) or not model.converted:
        raise ProgramError("model.program: only a converted program (blob:...) is read here")
    key = model.program
    if key in _PINNED:
        return _PINNED[key]
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if locate is None:
        raise ProgramError(f"model.program: {model.program} is a blob; its file is not here")
    program = decode_program(locate(key.removeprefix("blob:")))
    found = figures(program)
    check_figures(model, found)
    check_output(model, found)
    _remember(key, (program, found))
    return program, found


def convert(spec: JobSpec, files: dict[str, Path] | None = None) -> tuple[JobSpec, bytes]:
    """A spec naming the user's `.pt2` files, converted: the spec naming the program blob
    with its figures, and the blob's bytes. `files` are where the archives are (by
    default where the spec says); errors name them by the spec's own names."""
    model = spec.model
    assert isinstance(model, ProgramSpec) and not model.converted
    named = model_files(spec)
    files = files or named
    labels = (named["program"].name, named.get("eval_program", Path("")).name)
    program, found = convert_with_figures(files["program"], files.get("eval_program"), labels)
    check_output(model, found)
    data = encode_program(program)
    bound = with_program_blob(spec, hashlib.sha256(data).hexdigest(), spec_figures(found))
    _remember(bound.model.program, (program, found))  # type: ignore[union-attr]
    return bound, data


def bind_local(spec: JobSpec) -> JobSpec:
    """`train-local`'s conversion, as the owner's node would do it (the same program
    bytes, so the same blob and figures), kept for the whole run."""
    model = spec.model
    if not isinstance(model, ProgramSpec) or model.converted:
        return spec
    bound, _ = convert(spec)
    key = bound.model.program  # type: ignore[union-attr]
    _PINNED[key] = _CACHE[key]
    return bound


def _remember(key: str, entry: tuple[Program, ProgramFigures]) -> None:
    _CACHE[key] = entry
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)


def state_shapes(program: Program) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype) of the state dict its module writes: every
    parameter and persistent buffer under each of its names (tied weights twice)."""
    from training.model.weights import DTYPES

    return {
        name: (tuple(program.state(name).shape), DTYPES[program.state(name).dtype])
        for name in sorted(program.aliases)
        if program.kind(name) == "parameter" or name in program.persistent
    }


def spec_figures(found: ProgramFigures) -> dict[str, Any]:
    """The figures as the spec's `[model]` keys (`with_program_blob` writes them in)."""
    return {
        "parameters": found.parameters,
        "flops_per_sample": found.flops_per_sample,
        "activations_per_sample": found.activations_per_sample,
        "input_shape": list(found.input_shapes[0]),
        "input_dtype": found.input_dtypes[0],
        "output_shape": list(found.output_shape),
        "batch": found.batch or 0,
    }


def check_figures(model: ProgramSpec, found: ProgramFigures) -> None:
    for key, value in spec_figures(found).items():
        mine = getattr(model, key)
        mine = list(mine) if isinstance(mine, tuple) else mine
        if mine != value:
            raise ProgramError(
                f"model.{key}: the spec says {mine}, the program gives {value}; the spec's "
                "figures must be the program's own"
            )


def check_output(model: ProgramSpec, found: ProgramFigures) -> None:
    inputs = len(found.input_shapes)
    if model.output == "loss" and (inputs != 2 or found.output_shape):
        raise ProgramError(
            'model.output = "loss": the graph must take (x, y) and return a scalar loss; it '
            f"takes {inputs} inputs and returns {found.output_shape or 'a scalar'} per sample"
        )
    if model.output == "logits" and inputs != 1:
        raise ProgramError(
            f'model.output = "logits": the graph must take one input (x); it takes {inputs} '
            '(a graph that takes (x, y) and returns its loss needs output = "loss")'
        )
