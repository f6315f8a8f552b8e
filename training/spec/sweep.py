"""A sweep job's `[sweep]` table: the study's settings and its search space.

A sweep (`mode = "sweep"`) trains one *trial* per sampled configuration. A trial is
the job's own spec as a `single` job with the sampled values written into it
(`trial_plain`), so a worker trains a trial exactly as any other unit, and every
rule of the spec (types, ranges, the budget) applies to each trial. The space is
checked at submit by building the trials its corners give (`corner_params`);
`training.sweep.trials.trial_spec` turns one into a checked spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from training.errors import SpecError
from training.spec.fields import Section, kind, shown

SAMPLERS = ("tpe", "gp", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "asha", "hyperband")
METRICS = {"val_loss": "minimize", "val_accuracy": "maximize", "train_loss": "minimize"}
MAX_TRIALS = 10_000
MAX_PARAMS = 32
MAX_CHOICES = 64
#: keys a sweep may not search: they say what the job is, not how it trains
FIXED_KEYS = (
    "name",
    "mode",
    "placement",
    "sweep",
    "data.source",
    "data.format",
    "data.label",
    "data.task",
    "model.arch",
    # a program and the start are files and the figures counted from them
    "model.program",
    "model.eval_program",
    "model.output",
    "model.init",
    "model.trainable",
    "model.trainable_parameters",
    "model.parameters",
    "model.flops_per_sample",
    "model.activations_per_sample",
    "model.input_shape",
    "model.input_dtype",
    "model.output_shape",
    "model.batch",
)


@dataclass(frozen=True)
class Param:
    """One searched key: a float or int range, or a list of choices."""

    key: str  # dotted path into the spec, e.g. "optim.lr"
    kind: str  # "float" | "int" | "choice"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def to_plain(self) -> dict[str, Any]:
        if self.kind == "choice":
            return {"choices": list(self.choices)}
        plain: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.log:
            plain["log"] = True
        if self.step is not None:
            plain["step"] = self.step
        return plain


@dataclass(frozen=True)
class SweepSpec:
    """`mode = "sweep"`: see docs/jobspec.md#sweep."""

    trials: int = 16
    parallel: int = 4
    metric: str = "val_loss"
    direction: str = "minimize"
    sampler: str = "tpe"
    pruner: str = "none"
    report_every: int = 50
    space: tuple[Param, ...] = ()

    def to_plain(self) -> dict[str, Any]:
        return {
            "trials": self.trials,
            "parallel": self.parallel,
            "metric": self.metric,
            "direction": self.direction,
            "sampler": self.sampler,
            "pruner": self.pruner,
            "report_every": self.report_every,
            "space": {p.key: p.to_plain() for p in self.space},
        }


def parse_sweep(section: Section) -> SweepSpec:
    """The `[sweep]` table; the space's keys are checked against the spec later
    (`corner_params` and `trial_plain` in `check_space`)."""
    metric = section.string("metric", "val_loss", choices=tuple(METRICS))
    sweep = SweepSpec(
        trials=section.integer("trials", 16, lo=1, hi=MAX_TRIALS),
        parallel=section.integer("parallel", 4, lo=1, hi=256),
        metric=metric,
        direction=section.string("direction", METRICS[metric], choices=("minimize", "maximize")),
        sampler=section.string("sampler", "tpe", choices=SAMPLERS),
        pruner=section.string("pruner", "none", choices=PRUNERS),
        report_every=section.integer("report_every", 50, lo=1, hi=10**7),
        space=_parse_space(section.get("space", None)),
    )
    section.finish()
    if sweep.sampler == "grid" and any(p.kind == "float" and p.step is None for p in sweep.space):
        raise SpecError('sweep.sampler "grid" needs a step (or choices) for every float range')
    if sweep.sampler == "cmaes" and any(p.kind == "choice" for p in sweep.space):
        raise SpecError('sweep.sampler "cmaes" searches ranges only; use "tpe" for choices')
    return sweep


def _parse_space(raw: Any) -> tuple[Param, ...]:
    if not isinstance(raw, dict) or not raw:
        raise SpecError(
            'sweep.space must be a table of keys to search, e.g. "optim.lr" = '
            "{ low = 1e-4, high = 1e-1, log = true }"
        )
    if len(raw) > MAX_PARAMS:
        raise SpecError(f"sweep.space searches {len(raw)} keys; at most {MAX_PARAMS}")
    return tuple(_parse_param(key, value) for key, value in sorted(raw.items()))


def _parse_param(key: Any, raw: Any) -> Param:
    path = f"sweep.space.{key!r}" if isinstance(key, str) else "sweep.space"
    if not isinstance(key, str) or not key or len(key) > 100 or key.count(".") > 3:
        raise SpecError(f'{path}: a key is a dotted spec path such as "optim.lr"')
    if key in FIXED_KEYS or key.split(".")[0] in ("sweep", "elastic", "requirements"):
        raise SpecError(f"{path}: {key} cannot be searched (it says what the job is)")
    section = Section(raw, path)
    if section.has("choices"):
        choices = section.get("choices")
        section.finish()
        if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
            raise SpecError(f"{path}.choices must be a list of 1..{MAX_CHOICES} values")
        for value in choices:
            if isinstance(value, dict) or value is None:
                raise SpecError(f"{path}.choices: {shown(value)} is {kind(value)}")
        if len({repr(v) for v in choices}) != len(choices):
            raise SpecError(f"{path}.choices repeats a value")
        return Param(key, "choice", choices=tuple(_frozen(v) for v in choices))
    low, high = section.get("low"), section.get("high")
    integer = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
    if integer:
        low_v = section.integer("low")
        high_v = section.integer("high")
    else:
        low_v = section.number("low")
        high_v = section.number("high")
    log = section.boolean("log", False)
    step = None
    if section.has("step"):
        step = (
            section.integer("step", lo=1) if integer else section.number("step", lo=0, lo_open=True)
        )
    section.finish()
    if low_v > high_v:
        raise SpecError(f"{path}: low ({low_v}) must be <= high ({high_v})")
    if log and low_v <= 0:
        raise SpecError(f"{path}: a log range needs low > 0, got {low_v}")
    if log and step is not None:
        raise SpecError(f"{path}: a range is either log or stepped, not both")
    return Param(key, "int" if integer else "float", low_v, high_v, log, step)


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _thawed(value: Any) -> Any:
    return [_thawed(v) for v in value] if isinstance(value, tuple) else value


def trial_plain(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The spec one trial trains: `base` (the sweep job's plain spec) as a `single`
    job, with each searched key set to its value in `params`."""
    plain = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    plain.pop("sweep", None)
    plain["mode"] = "single"
    for key, value in params.items():
        *tables, leaf = key.split(".")
        table = plain
        for name in tables:
            inner = table.get(name)
            if not isinstance(inner, dict):
                inner = {}
            table[name] = inner = dict(inner)
            table = inner
        if isinstance(table.get(leaf), dict):
            raise SpecError(f"sweep.space.{key!r}: {key} is a table; search one of its keys")
        table[leaf] = _thawed(value)
    return plain


def corner_params(space: tuple[Param, ...]) -> list[tuple[str, Any, dict[str, Any]]]:
    """(key, value, params) covering every choice and both ends of every range, the
    other keys at their middle: what a submit checks, so a space cannot hide a value
    that breaks the spec or its budget."""
    corners = []
    for param in space:
        values = list(param.choices) if param.kind == "choice" else [param.low, param.high]
        for value in values:
            params = {p.key: _middle(p) for p in space}
            params[param.key] = value
            corners.append((param.key, _thawed(value), params))
    return corners


def _middle(param: Param) -> Any:
    if param.kind == "choice":
        return param.choices[0]
    assert param.low is not None and param.high is not None
    if param.kind == "int":
        return (int(param.low) + int(param.high)) // 2
    if param.log:
        return math.sqrt(float(param.low) * float(param.high))
    return (float(param.low) + float(param.high)) / 2
