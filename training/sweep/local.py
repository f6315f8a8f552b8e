"""`train-local` of a sweep: the owner's study, trial after trial, in this process.

The network runs a sweep's trials on peers (`node/work/owner/modes/sweep.py`); this runs them
here one at a time with the same sampler (and seed), pruner and trial specs. With
`parallel = 1` both ask the sampler the same questions in the same order, so a
benchmark can put the two side by side (`benchmarks/sweep.py`), and a user can try a
sweep before submitting it. Each validation value goes to the pruner as the loop
emits it; a pruned trial stops at that step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from training.errors import TrainingError
from training.run.loop import Emit
from training.spec.job import JobSpec, SpecError, spec_to_plain
from training.spec.sweep import SweepSpec
from training.sweep import study as studies
from training.sweep.trials import trial_spec

STUDY_NAME = "train-local"


class _Pruned(Exception):
    """Raised from the loop's progress callback: the pruner stopped the trial."""

    def __init__(self, step: int, value: float) -> None:
        super().__init__(f"pruned at step {step}")
        self.step, self.value = step, value


def run_sweep(
    spec: JobSpec, out: Path, emit: Emit | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Run every trial of the sweep `spec`, write the best trial's weights to `out`.

    Returns `trials` (number, params, state, value, steps), `best` (number, params,
    value) and the best trial's `metrics` and `weights_sha256`, like a sweep job's
    result. `emit` receives each trial's runner events with its `trial` number, and a
    `trial` event when one ends. Raises `TrainingError` when no trial completed.
    """
    from training.run.execute import run_job

    assert spec.sweep is not None, "run_sweep needs a sweep spec"
    sweep, emit = spec.sweep, emit or (lambda event: None)
    study = studies.open_study(None, STUDY_NAME, sweep, spec.seed)
    base = spec_to_plain(spec)
    out = Path(out)
    scratch = out.with_name(f".{out.name}.trial")
    trials: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    for _ in range(sweep.trials):
        number, params = studies.ask(study, sweep.space)
        trial: dict[str, Any] = {"number": number, "params": params, "steps": 0}
        trials.append(trial)
        try:
            one = trial_spec(base, params, sweep.report_every)
            report = _reporter(study, sweep, trial, emit)
            result = run_job(one, None, scratch, device=device, emit=report)
        except _Pruned as pruned:
            studies.tell(study, number, "pruned")
            trial.update(state="pruned", value=pruned.value, steps=pruned.step)
        except (SpecError, TrainingError) as exc:
            studies.tell(study, number, "failed")
            trial.update(state="failed", value=None, reason=str(exc))
        else:
            value = result["metrics"].get(sweep.metric)
            state = "failed" if value is None else "complete"
            studies.tell(study, number, state, value)
            trial.update(state=state, value=value, steps=result["steps"])
            if value is not None and (best is None or _better(sweep, value, best["value"])):
                os.replace(scratch, out)
                best = {"number": number, "params": params, "value": value, "result": result}
        emit({"event": "trial", "trials": sweep.trials, **trial})
    scratch.unlink(missing_ok=True)
    if best is None:
        raise TrainingError(f"none of the sweep's {sweep.trials} trials completed")
    result = best.pop("result")
    return {
        "trials": trials,
        "best": best,
        "steps": sum(t["steps"] for t in trials),
        "metrics": {**result["metrics"], "best_trial": best["number"], "best_value": best["value"]},
        "weights_sha256": result["weights_sha256"],
        "device": result["device"],
    }


def _reporter(study: Any, sweep: SweepSpec, trial: dict[str, Any], emit: Emit) -> Emit:
    """The loop's callback for one trial: forwards its events, reports each validation
    to the study, and stops the trial (raising `_Pruned`) when the pruner says so."""
    number = trial["number"]

    def on_event(event: dict[str, Any]) -> None:
        emit({**event, "trial": number})
        if event.get("event") != "progress" or "val_step" not in event:
            return
        step = int(event["val_step"])
        value = event.get(sweep.metric) if sweep.metric != "train_loss" else event.get("loss")
        if value is None:
            return
        trial["steps"] = step
        if studies.report(study, number, step, float(value)):
            raise _Pruned(step, float(value))

    return on_event


def _better(sweep: SweepSpec, value: float, than: float) -> bool:
    return value < than if sweep.direction == "minimize" else value > than
