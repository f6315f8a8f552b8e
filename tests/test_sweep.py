"""A sweep's spec, space and study, without a network: what the owner builds trials from."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from node.work import study as studies
from node.work.service import best_trial
from node.work.trial_store import Trial
from training.errors import SpecError
from training.examples import sweep_toml
from training.spec import parse_spec, spec_to_plain
from training.sweep_spec import corner_params, trial_plain
from training.trials import trial_spec


def _sweep(**changes: object) -> dict:
    raw = tomllib.loads(sweep_toml())
    raw["sweep"].update(changes)
    return raw


def test_defaults_round_trip_and_direction_follows_the_metric() -> None:
    spec = parse_spec(_sweep(metric="val_accuracy"))
    assert spec.sweep is not None and spec.sweep.direction == "maximize"
    assert parse_spec(spec_to_plain(spec)) == spec
    assert parse_spec(_sweep()).sweep.direction == "minimize"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sampler": "grid"}, 'sampler "grid" needs a step'),
        ({"sampler": "cmaes"}, 'sampler "cmaes" searches ranges only'),
        ({"trials": 0}, "sweep.trials must be > 0"),
        ({"pruner": "psychic"}, "sweep.pruner must be one of"),
        ({"space": {}}, "sweep.space must be a table"),
        (
            {"space": {"optim.lr": {"low": 0.0, "high": 1.0, "log": True}}},
            "log range needs low > 0",
        ),
        ({"space": {"optim.lr": {"choices": [0.1, 0.1]}}}, "repeats a value"),
        ({"space": {"elastic.workers": {"choices": [1, 2]}}}, "cannot be searched"),
    ],
)
def test_bad_sweep_tables_name_the_key(changes: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_sweep(**changes))


def test_a_trial_is_the_jobs_spec_as_a_single_job_with_the_values_set() -> None:
    base = spec_to_plain(parse_spec(_sweep()))
    trial = trial_spec(base, {"optim.lr": 0.02, "model.hidden": [64, 32]}, 25)
    assert (trial.mode, trial.sweep, trial.optim.lr) == ("single", None, 0.02)
    assert trial.model.hidden == (64, 32) and trial.optim.validate_every == 25
    assert "sweep" not in trial_plain(base, {})
    assert base["optim"]["lr"] == 1e-3  # the job's spec is not changed


def test_corners_cover_every_choice_and_both_ends_of_every_range() -> None:
    space = parse_spec(_sweep()).sweep.space  # type: ignore[union-attr]
    seen = {(key, repr(value)) for key, value, _ in corner_params(space)}
    assert seen == {
        ("model.hidden", "[16]"),
        ("model.hidden", "[32]"),
        ("model.hidden", "[64, 32]"),
        ("optim.lr", "0.0001"),
        ("optim.lr", "0.1"),
    }


def test_the_study_asks_lists_as_json_and_tells_each_end(tmp_path: Path) -> None:
    sweep = parse_spec(_sweep(pruner="asha", report_every=10)).sweep
    assert sweep is not None
    study = studies.open_study(tmp_path / "s.journal", "a" * 16, sweep, seed=0)
    asked = [studies.ask(study, sweep.space) for _ in range(3)]
    assert [n for n, _ in asked] == [0, 1, 2]
    assert all(isinstance(p["model.hidden"], list) for _, p in asked)
    studies.tell(study, 0, "complete", 0.5)
    studies.tell(study, 0, "complete", 0.4)  # told once; a second tell changes nothing
    studies.report(study, 1, 10, 0.9)
    studies.tell(study, 1, "pruned")
    studies.tell(study, 2, "failed")
    again = studies.open_study(tmp_path / "s.journal", "a" * 16, sweep, seed=0)  # a restart
    states = [t.state.name for t in again.trials]
    assert states == ["COMPLETE", "PRUNED", "FAIL"] and again.best_value == 0.5


def test_the_best_trial_is_the_lowest_or_highest_complete_one_first_on_ties() -> None:
    trials = [
        Trial("j", 0, {}, "complete", 0.3),
        Trial("j", 1, {}, "pruned", 0.1),
        Trial("j", 2, {}, "complete", 0.2),
        Trial("j", 3, {}, "complete", 0.2),
    ]
    assert best_trial(trials, "minimize")["number"] == 2  # type: ignore[index]
    assert best_trial(trials, "maximize")["number"] == 0  # type: ignore[index]
    assert best_trial(trials[1:2], "minimize") is None
