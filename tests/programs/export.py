"""Exporting a test model as a user would (`meshminer.export`), and its job spec."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


def export_pair(model: nn.Module, example: tuple[torch.Tensor, ...], folder: Path) -> Path:
    """`model.pt2` (train mode) and `model.eval.pt2` in `folder`, batch dimension dynamic,
    as `meshminer.export` writes them (checked); returns the train file."""
    import meshminer

    return meshminer.export(model, example, path=folder).program


def program_toml(
    name: str,
    steps: int | None,
    *,
    source: str = "builtin:digits",
    shards: list[str] | None = None,
    data: str = "",
    top: str = "",
    tail: str = "",
) -> str:
    """A job spec for the exported pair beside it (`shards`: token files instead of
    `source`, `top`: top-level keys, `data`: more `[data]` keys, `tail`: tables; no
    `steps` for an elastic job)."""
    optim_steps = "" if steps is None else f"steps = {steps}"
    named = f"shards = {json.dumps(shards)}" if shards else f'source = "{source}"'
    return f"""name = "{name}"
{top}
[model]
arch = "program"
program = "model.pt2"
eval_program = "model.eval.pt2"
[data]
{named}
batch_size = 16
{data}
[optim]
{optim_steps}
lr = 0.01
{tail}"""
