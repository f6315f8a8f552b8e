"""Exporting a test model as a user would: a train-mode and an eval-mode `.pt2`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def export_pair(model: nn.Module, example: tuple[torch.Tensor, ...], folder: Path) -> Path:
    """`model.pt2` (train mode) and `model.eval.pt2` in `folder`, batch dimension dynamic;
    returns the train file. The model is left in train mode."""
    dims = tuple({0: torch.export.Dim("batch", min=2)} for _ in example)
    for train, name in ((True, "model.pt2"), (False, "model.eval.pt2")):
        model.train(train)
        torch.export.save(torch.export.export(model, example, dynamic_shapes=dims), folder / name)
    model.train()
    return folder / "model.pt2"


def program_toml(
    name: str,
    steps: int | None,
    *,
    source: str = "builtin:digits",
    data: str = "",
    top: str = "",
    tail: str = "",
) -> str:
    """A job spec for the exported pair beside it (`top`: top-level keys, `data`: more
    `[data]` keys, `tail`: tables; no `steps` for an elastic job)."""
    optim_steps = "" if steps is None else f"steps = {steps}"
    return f"""name = "{name}"
{top}
[model]
arch = "program"
program = "model.pt2"
eval_program = "model.eval.pt2"
[data]
source = "{source}"
batch_size = 16
{data}
[optim]
{optim_steps}
lr = 0.01
{tail}"""
