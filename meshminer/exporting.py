"""Exporting a PyTorch module into the program files a node trains: `export()`, `Exported`.

A node never runs a peer's Python; it runs a `torch.export` graph through an
interpreter that knows only allow-listed operators (`training.program`). So the
model is exported here, on the owner's machine, in train mode (the graph a worker
trains) and in eval mode (the graph validation runs: dropout off, BatchNorm on its
running statistics), and each file is checked here with the node's own rules, so a
refusal comes now, with every problem listed, not after an upload.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meshminer.errors import ProgramRefused

if TYPE_CHECKING:
    import torch

PROGRAM_FILE = "model.pt2"
EVAL_PROGRAM_FILE = "model.eval.pt2"


@dataclass(frozen=True)
class Exported:
    """A model's saved programs: `program` trains, `eval_program` (if any) validates."""

    program: Path
    eval_program: Path | None = None


def export(
    model: torch.nn.Module,
    example_batch: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    eval: bool = True,
    path: str | Path | None = None,
    dynamic_batch: bool = True,
) -> Exported:
    """Export `model` as `model.pt2` (train mode) and, with `eval`, `model.eval.pt2`
    (eval mode) into the folder `path` (default: a new temporary folder), and check both.

    `example_batch` is what `model(...)` takes: a tensor, or a tuple of tensors passed as
    separate arguments (a model whose `forward(x, y)` returns its loss). With
    `dynamic_batch`, dim 0 of every tensor is one symbolic batch size (at least 2), so the
    node may train with any batch size; the example batch must then hold at least 2.
    The model's train/eval modes are restored afterwards, module by module.
    Raises `ProgramRefused` listing what a node would not run.
    """
    import torch

    args = example_batch if isinstance(example_batch, tuple) else (example_batch,)
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=2)
        dynamic_shapes = tuple({0: batch} for _ in args)
    folder = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="meshminer-"))
    folder.mkdir(parents=True, exist_ok=True)

    def save(file_name: str) -> Path:
        program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
        torch.export.save(program, folder / file_name)
        return folder / file_name

    modes = {module: module.training for module in model.modules()}
    eval_program = None
    try:
        model.train()
        program = save(PROGRAM_FILE)
        if eval:
            model.eval()
            eval_program = save(EVAL_PROGRAM_FILE)
    finally:
        for module, training in modes.items():
            module.training = training
    exported = Exported(program, eval_program)
    _check(exported)
    return exported


def _check(exported: Exported) -> None:
    """Raise `ProgramRefused` if a node would refuse either program (the node's own check)."""
    from training.program import check_pt2

    files = [file for file in (exported.program, exported.eval_program) if file is not None]
    problems = [problem for file in files for problem in check_pt2(file)]  # each names its file
    if problems:
        raise ProgramRefused(problems)
