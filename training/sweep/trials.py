"""One trial of a sweep as the `JobSpec` a worker trains (see `training.spec.sweep`)."""

from __future__ import annotations

from typing import Any

from training.spec.job import JobSpec, parse_spec
from training.spec.sweep import trial_plain


def trial_spec(base: dict[str, Any], params: dict[str, Any], report_every: int) -> JobSpec:
    """The checked `JobSpec` of one trial: validated every `report_every` steps, so
    its heartbeats carry the values the study's pruner reads."""
    plain = trial_plain(base, params)
    plain["optim"] = {**plain.get("optim", {}), "validate_every": report_every}
    return parse_spec(plain)
