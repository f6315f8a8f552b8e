"""A job spec's program: converted from the user's archives or read from its blob,
checked against the figures the spec states, and kept while the process runs.

Content addressing makes the cache safe to share: a `blob:` program is the same
bytes wherever it was read. A local archive (`train-local`) is keyed by its files'
path, size and modification time.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.program.convert import convert_pt2
from training.program.errors import ProgramError
from training.program.figures import ProgramFigures, figures
from training.program.program import Program, decode_program
from training.spec import JobSpec, ProgramSpec

Locate = Callable[[str], Path]  # sha256 -> the blob's file
_CACHE: OrderedDict[tuple, tuple[Program, ProgramFigures]] = OrderedDict()
_CACHE_SIZE = 4
_PINNED: dict[tuple, tuple[Program, ProgramFigures]] = {}  # converted here (train-local)


def program_of(spec: JobSpec, locate: Locate | None = None) -> tuple[Program, ProgramFigures]:
    """The spec's program and its figures; `locate` finds a converted program's blob.

    A converted program is refused unless its figures are exactly the spec's."""
    model = spec.model
    if not isinstance(model, ProgramSpec):
        raise ProgramError(f"model.arch is {model.arch!r}, not program")
    key = _key(model)
    if key in _PINNED:
        return _PINNED[key]
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if model.converted:
        if locate is None:
            raise ProgramError(f"model.program: {model.program} is a blob; its file is not here")
        program = decode_program(locate(model.program.removeprefix("blob:")))
        found = figures(program)
        check_figures(model, found)
    else:
        eval_file = Path(model.eval_program) if model.eval_program else None
        program = convert_pt2(Path(model.program), eval_file)
        found = figures(program)
    check_output(model, found)
    _CACHE[key] = (program, found)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return program, found


def bind_local(spec: JobSpec) -> JobSpec:
    """A spec naming the user's `.pt2` files, converted here as the owner's node would
    (`train-local`): the same program bytes, so the same blob and the same figures."""
    model = spec.model
    if not isinstance(model, ProgramSpec) or model.converted:
        return spec
    from training.program.program import encode_program
    from training.spec import with_program_blob

    program, found = program_of(spec)
    sha = hashlib.sha256(encode_program(program)).hexdigest()
    bound = with_program_blob(spec, sha, spec_figures(found))
    _PINNED[_key(bound.model)] = (program, found)  # type: ignore[arg-type]
    return bound


def state_shapes(program: Program) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype) of the state dict its module writes: every
    parameter and persistent buffer under each of its names (tied weights twice)."""
    from training.weights import DTYPES

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
    stated = {key: getattr(model, key) for key in spec_figures(found)}
    for key, value in spec_figures(found).items():
        mine = list(stated[key]) if isinstance(stated[key], tuple) else stated[key]
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


def _key(model: ProgramSpec) -> tuple:
    if model.converted:
        return (model.program,)
    files = [Path(p) for p in (model.program, model.eval_program) if p]
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]
    return ("local", *stats)
