"""A program's `[model]` table (`arch = "program"`): the user's `.pt2` files, or the
converted program blob and the figures counted from it (docs/programs.md).

Nothing here imports torch; `training.program` reads and runs the program itself.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.sources import resolve_path
from training.errors import SpecError
from training.spec.fields import Section

PROGRAM_OUTPUTS = ("logits", "loss")
PROGRAM_FIGURES = (
    "parameters",
    "flops_per_sample",
    "activations_per_sample",
    "input_shape",
    "input_dtype",
    "output_shape",
    "batch",
)
_PROGRAM_BLOB = re.compile(r"blob:[0-9a-f]{64}")


@dataclass(frozen=True)
class ProgramSpec:
    """A user's own model, exported with `torch.export` (docs/programs.md).

    The user's spec names local `.pt2` files; the node that converts them rewrites the
    spec to the program blob and writes in its figures, which every worker's runner
    re-derives from the program before training (a mismatch is refused), so budget and
    credit come from the graph, never from anyone's word."""

    program: str  # a local .pt2, or blob:<sha256> of the converted program
    eval_program: str | None = None  # a local .pt2 exported in eval mode (folded into the blob)
    output: str = "logits"  # "logits": data.task's loss applies; "loss": the graph returns it
    parameters: int = 0
    flops_per_sample: int = 0  # forward, counted by training.program.figures
    activations_per_sample: int = 0
    input_shape: tuple[int, ...] = ()  # one sample of the (first) input
    input_dtype: str = ""
    output_shape: tuple[int, ...] = ()  # one sample of the output (() for a loss)
    batch: int = 0  # the batch size the export fixed (0: dynamic)
    arch: str = "program"

    @property
    def converted(self) -> bool:
        return self.program.startswith("blob:")


def parse_program(
    section: Section, base_dir: Path | None, allowed_root: Path | None
) -> ProgramSpec:
    program = section.string("program", max_len=4096)
    output = section.string("output", "logits", choices=PROGRAM_OUTPUTS)
    if not program.startswith("blob:"):
        if any(section.has(key) for key in PROGRAM_FIGURES):
            raise SpecError(
                "model: the program's figures (parameters, flops_per_sample, ...) are computed "
                "from the graph when it is converted; leave them out"
            )
        eval_program = section.string("eval_program", None, max_len=4096)
        return ProgramSpec(
            program=_program_path(program, base_dir, allowed_root, "model.program"),
            eval_program=None
            if eval_program is None
            else _program_path(eval_program, base_dir, allowed_root, "model.eval_program"),
            output=output,
        )
    if not _PROGRAM_BLOB.fullmatch(program):
        raise SpecError("model.program: a converted program is blob:<64 lowercase hex digits>")
    if section.has("eval_program"):
        raise SpecError("model.eval_program: a converted program holds its eval graph already")
    model = ProgramSpec(
        program=program,
        output=output,
        parameters=section.integer("parameters", lo=1, hi=10**12),
        flops_per_sample=section.integer("flops_per_sample", lo=0, hi=10**18),
        activations_per_sample=section.integer("activations_per_sample", lo=0, hi=10**15),
        input_shape=section.int_list("input_shape", lo=1, hi=2**31, min_len=0, max_len=8),
        input_dtype=section.string(
            "input_dtype", choices=("float32", "float16", "bfloat16", "float64", "int64", "int32")
        ),
        output_shape=section.int_list("output_shape", lo=1, hi=2**31, min_len=0, max_len=8),
        batch=section.integer("batch", 0, lo=0, hi=2**20),
    )
    if output == "loss" and model.output_shape:
        raise SpecError("model.output_shape: a program that returns its loss returns a scalar")
    return model


def _program_path(raw: str, base_dir: Path | None, allowed_root: Path | None, key: str) -> str:
    if Path(raw).suffix.lower() != ".pt2":
        raise SpecError(
            f"{key}: {raw[:100]!r} is not a .pt2 file (torch.export.save writes one; pickles, "
            "TorchScript and ONNX files are never accepted)"
        )
    return resolve_path(raw, base_dir, allowed_root, key)


def program_plain(model: ProgramSpec) -> dict[str, Any]:
    """The `[model]` table of `model`: figures only once it is converted."""
    plain = {k: v for k, v in dataclasses.asdict(model).items() if v is not None}
    if not model.converted:
        for key in PROGRAM_FIGURES:
            del plain[key]
    return plain
