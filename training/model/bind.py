"""Counting what a spec's model will train, before anything is allocated: the module on
the `meta` device with `model.trainable` applied. The owner's node binds a spec this way
at submit (and `train-local` here); the owner also reads an elastic delta's length from
it. Kept apart from `training.model.start`, which `training.model.modules` imports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from training.data.info import DataFiles, probe
from training.model.modules import build_model
from training.model.plan import plan_model
from training.model.start import Start, trainable_count
from training.spec.job import JobSpec


def meta_model(
    spec: JobSpec, data_file: DataFiles = None, locate: Callable[[str], Path] | None = None
) -> nn.Module:
    """The spec's module on the `meta` device with its parameters frozen as
    `model.trainable` says (the init is not read: only names and shapes matter)."""
    plan = plan_model(spec.model, probe(spec, data_file))
    if plan.program is not None:
        from training.program.job import program_of

        plan = dataclasses.replace(plan, loaded=program_of(spec, locate)[0])
    if spec.start.trainable:
        plan = dataclasses.replace(plan, start=Start(None, spec.start.trainable))
    with torch.device("meta"):
        return build_model(plan)


def bind_trainable(
    spec: JobSpec, data_file: DataFiles = None, locate: Callable[[str], Path] | None = None
) -> JobSpec:
    """The spec with `model.trainable_parameters` counted (what the owner's node does at
    submit, and `train-local` before training); `SpecError` if a pattern matches nothing."""
    if not spec.start.trainable:
        return spec
    count = trainable_count(meta_model(spec, data_file, locate))
    start = dataclasses.replace(spec.start, trainable_parameters=count)
    return dataclasses.replace(spec, start=start)
