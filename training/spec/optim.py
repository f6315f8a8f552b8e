"""The `[optim]` table: the optimizer, its learning-rate schedule, how long training
runs, and at which precision."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from training.errors import SpecError
from training.spec.fields import Section

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "warmup")
LOSSES = ("cross_entropy", "mse", "l1")
PRECISIONS = ("fp32", "bf16")
MAX_STEPS = 10**9


@dataclass(frozen=True)
class OptimSpec:
    name: str = "adamw"
    lr: float = 1e-3
    steps: int | None = None
    epochs: int | None = None
    weight_decay: float = 0.0
    momentum: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    loss: str | None = None
    grad_clip: float | None = None
    validate_every: int = 0  # steps between validations during training (0: at the end only)
    precision: str = "fp32"  # bf16: autocast around the forward and the loss


def check_inner_optim(section: Section) -> None:
    """An elastic job's length is its rounds x inner steps; a schedule would restart
    every round, so the inner optimizer runs at a constant rate."""
    for key in ("steps", "epochs"):
        if section.has(key):
            raise SpecError(
                f"optim.{key}: an elastic job trains elastic.rounds x elastic.inner_steps "
                f"steps per worker; leave optim.{key} out"
            )
    if section.get("schedule", "constant") != "constant":
        raise SpecError(
            "optim.schedule: an elastic job's inner optimizer runs at a constant rate; "
            'leave the schedule out (or "constant")'
        )


def parse_optim(section: Section, steps_required: bool = True) -> OptimSpec:
    name = section.string("name", "adamw", choices=OPTIMIZERS)
    if name != "sgd" and section.has("momentum"):
        raise SpecError(f"optim.momentum applies only to sgd (optim.name is {name!r})")
    schedule = section.string("schedule", "constant", choices=SCHEDULES)
    if schedule == "constant" and section.has("warmup_steps"):
        raise SpecError('optim.warmup_steps needs schedule = "warmup" or "cosine"')
    steps = section.integer("steps", None, lo=1, hi=MAX_STEPS)
    epochs = section.integer("epochs", None, lo=1, hi=10**6)
    if steps_required and (steps is None) == (epochs is None):
        raise SpecError("optim needs exactly one of `steps` or `epochs` (integers > 0)")
    optim = OptimSpec(
        steps=steps,
        epochs=epochs,
        name=name,
        lr=section.number("lr", 1e-3, lo=0, lo_open=True),
        weight_decay=section.number("weight_decay", 0.0, lo=0, hi=100),
        momentum=section.number("momentum", 0.0, lo=0, hi=1, hi_open=True),
        schedule=schedule,
        warmup_steps=section.integer("warmup_steps", 0, lo=0, hi=MAX_STEPS),
        loss=section.string("loss", None, choices=LOSSES),
        grad_clip=section.number("grad_clip", None, lo=0, hi=1e9, lo_open=True),
        validate_every=section.integer("validate_every", 0, lo=0, hi=MAX_STEPS),
        precision=section.string("precision", "fp32", choices=PRECISIONS),
    )
    section.finish()
    return optim


def optim_plain(optim: OptimSpec) -> dict[str, Any]:
    """The table as plain data, leaving out what does not apply or is at a default
    older specs did not have (so that they stay equal)."""
    plain = dataclasses.asdict(optim)
    if optim.name != "sgd":
        del plain["momentum"]
    if optim.schedule == "constant":
        del plain["warmup_steps"]
    if not optim.validate_every:
        del plain["validate_every"]
    if optim.precision == "fp32":
        del plain["precision"]
    return {key: value for key, value in plain.items() if value is not None}
