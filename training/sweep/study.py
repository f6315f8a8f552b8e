"""A sweep job's Optuna study: one file per job, driven ask-and-tell by its owner only
(`node/work/owner/modes/sweep.py`), or in memory by `train-local` (`training/sweep/local.py`).

Volunteers never see the study: the owner asks it for a trial's parameters, offers the
trial as a unit, reports the values the worker's heartbeats carry, asks the pruner,
and tells the study how the trial ended. Every call here is synchronous (Optuna's
storage is); the driver runs them in a thread.

The storage is a journal file (`JournalFileBackend`, `studies/<job id>.journal`): an
append-only log that needs no database server and no schema migrations, that
`GET /api/v1/jobs/{id}/study` serves as it is, and that opens again with
`optuna.load_study(study_name=<job id>, storage=JournalStorage(JournalFileBackend(path)))`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from training.spec.sweep import Param, SweepSpec

log = logging.getLogger(__name__)


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage(path: Path) -> Any:
    """The journal storage in `path` (created when missing)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def open_study(path: Path | None, job_id: str, sweep: SweepSpec, seed: int) -> Any:
    """The job's study, created on first use and loaded afterwards (owner restarts);
    in memory when `path` is None (`train-local`)."""
    optuna = _optuna()
    return optuna.create_study(
        study_name=job_id,
        storage=None if path is None else storage(path),
        direction=sweep.direction,
        sampler=_sampler(optuna, sweep, seed),
        pruner=_pruner(optuna, sweep),
        load_if_exists=True,
    )


def _sampler(optuna: Any, sweep: SweepSpec, seed: int) -> Any:
    seed = seed % 2**32
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler == "grid":
        return optuna.samplers.GridSampler(grid_space(sweep.space), seed=seed)
    if sweep.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if sweep.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _pruner(optuna: Any, sweep: SweepSpec) -> Any:
    # steps are reported every `report_every`: the first rung is the first report
    if sweep.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=sweep.report_every)
    if sweep.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=sweep.report_every)
    if sweep.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=sweep.report_every)
    return optuna.pruners.NopPruner()


def distributions(space: tuple[Param, ...]) -> dict[str, Any]:
    """Optuna's distribution for each searched key. A choice that is a list (a
    `model.hidden`, say) is given to Optuna as its JSON text: categorical values must
    be scalars there."""
    dist = _optuna().distributions
    out: dict[str, Any] = {}
    for p in space:
        if p.kind == "choice":
            out[p.key] = dist.CategoricalDistribution([_scalar(c) for c in p.choices])
        elif p.kind == "int":
            out[p.key] = dist.IntDistribution(
                int(p.low), int(p.high), log=p.log, step=int(p.step or 1)
            )
        else:
            out[p.key] = dist.FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
    return out


def grid_space(space: tuple[Param, ...]) -> dict[str, list[Any]]:
    """Every value of every key, for the grid sampler (ranges need a step)."""
    grid: dict[str, list[Any]] = {}
    for p in space:
        if p.kind == "choice":
            grid[p.key] = [_scalar(c) for c in p.choices]
            continue
        assert p.low is not None and p.high is not None
        step = p.step or 1
        count = int((p.high - p.low) / step + 1e-9) + 1
        grid[p.key] = [p.low + i * step for i in range(count)]
    return grid


def _scalar(choice: Any) -> Any:
    return json.dumps(_listed(choice)) if isinstance(choice, tuple | list) else choice


def _listed(value: Any) -> Any:
    return [_listed(v) for v in value] if isinstance(value, tuple | list) else value


def spec_params(space: tuple[Param, ...], sampled: dict[str, Any]) -> dict[str, Any]:
    """The values to write into a trial's spec: list choices back from their JSON."""
    lists = {
        p.key for p in space if p.kind == "choice" and any(isinstance(c, tuple) for c in p.choices)
    }
    return {
        k: json.loads(v) if k in lists and isinstance(v, str) else v for k, v in sampled.items()
    }


def ask(study: Any, space: tuple[Param, ...]) -> tuple[int, dict[str, Any]]:
    """A new trial: its number and the values for its spec."""
    trial = study.ask(distributions(space))
    return trial.number, spec_params(space, trial.params)


def report(study: Any, number: int, step: int, value: float) -> bool:
    """Report an intermediate value of trial `number`; True when the pruner says stop."""
    optuna = _optuna()
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    trial = optuna.trial.Trial(study, trial_id)
    trial.report(value, step)
    return bool(trial.should_prune())


def tell(study: Any, number: int, state: str, value: float | None = None) -> None:
    """End trial `number` as `complete` (with its value), `pruned` or `failed`."""
    optuna = _optuna()
    states = optuna.trial.TrialState
    if state == "complete":
        study.tell(number, value, skip_if_finished=True)
    else:
        kind = states.PRUNED if state == "pruned" else states.FAIL
        study.tell(number, state=kind, skip_if_finished=True)


def running(study: Any, space: tuple[Param, ...]) -> list[tuple[int, dict[str, Any]]]:
    """(number, spec values) of the trials the study has asked for and not been told
    the end of."""
    states = _optuna().trial.TrialState
    found = study.get_trials(deepcopy=False, states=(states.RUNNING,))
    return [(t.number, spec_params(space, t.params)) for t in found]


def importances(
    space: tuple[Param, ...], trials: list[tuple[dict[str, Any], float]], direction: str
) -> dict[str, float]:
    """How much of the value's variation each searched key explains, from complete
    trials' (params, value); {} before two. PED-ANOVA (Optuna's
    `PedAnovaImportanceEvaluator`): a few milliseconds for hundreds of trials and no
    extra dependency, where fANOVA needs scikit-learn and a forest fit per call."""
    if len(trials) < 2 or not space:
        return {}
    optuna = _optuna()
    dists = distributions(space)
    study = optuna.create_study(direction=direction)
    for params, value in trials:
        shown = {k: _scalar(v) for k, v in params.items() if k in dists}
        if shown.keys() != dists.keys():
            continue
        study.add_trial(optuna.trial.create_trial(params=shown, distributions=dists, value=value))
    try:
        found = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
        )
    except (ValueError, RuntimeError):  # too few distinct trials for the evaluator
        return {}
    return {k: float(v) for k, v in found.items()}
