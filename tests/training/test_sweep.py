"""A sweep's spec, space and study, without a network: what the owner builds trials from,
and `train-local` of a sweep."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from node.web.sweep_charts import importance_bars, parallel_coordinates
from node.work.jobs import Trial
from node.work.owner import best_trial
from training.errors import SpecError, TrainingError
from training.run.local import train_local
from training.spec.examples import sweep_toml
from training.spec.job import parse_spec, spec_to_plain
from training.spec.sweep import corner_params, trial_plain
from training.sweep import study as studies
from training.sweep.trials import trial_spec


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


def test_importances_need_two_trials_and_find_the_key_that_matters() -> None:
    sweep = parse_spec(_sweep()).sweep
    assert sweep is not None
    trials = [
        ({"optim.lr": lr, "model.hidden": hidden}, abs(lr - 0.01) * 100)
        for lr in (1e-4, 1e-3, 1e-2, 3e-2, 1e-1)
        for hidden in ([16], [32], [64, 32])
    ]
    assert studies.importances(sweep.space, trials[:1], "minimize") == {}
    found = studies.importances(sweep.space, trials, "minimize")
    assert set(found) == {"optim.lr", "model.hidden"}
    assert found["optim.lr"] > 0.9 > found["model.hidden"]


def test_the_parallel_coordinates_put_each_trial_on_its_choice_and_the_best_on_top() -> None:
    space = {
        "optim.lr": {"low": 1e-4, "high": 1e-1, "log": True},
        "model.hidden": {"choices": [[16], [64, 32]]},
    }
    trials = [
        {
            "number": 0,
            "state": "complete",
            "value": 0.2,
            "params": {"optim.lr": 1e-4, "model.hidden": [16]},
        },
        {
            "number": 1,
            "state": "complete",
            "value": 0.1,
            "params": {"optim.lr": 1e-1, "model.hidden": "[64, 32]"},
        },
        {
            "number": 2,
            "state": "pruned",
            "value": 2.0,
            "params": {"optim.lr": 1e-2, "model.hidden": [16]},
        },
    ]
    svg = str(parallel_coordinates(space, trials, "val_loss", "minimize"))
    assert 'data-lines="2"' in svg and "[64, 32]" in svg
    lines = svg.split("<polyline")[1:]
    assert 'data-trial="1"' in lines[-1] and "best" in lines[-1]  # drawn last: on top
    # trial 0 sits at the bottom of both param axes, trial 1 at the top (the list choice
    # matched whether the params hold a list or the study's JSON text)
    ys = [
        [float(p.split(",")[1]) for p in line.split('points="')[1].split('"')[0].split()]
        for line in lines
    ]
    assert ys[0][:2] == [ys[0][0]] * 2 and ys[1][:2] == [ys[1][0]] * 2 and ys[0][0] > ys[1][0]
    assert "no complete trial yet" in str(
        parallel_coordinates(space, trials[2:], "val_loss", "minimize")
    )
    assert 'data-bars="0"' in str(importance_bars({}))


def test_train_local_runs_a_sweep_prunes_hopeless_trials_and_keeps_the_best_weights(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    space = '"optim.lr" = { choices = [3e-2, 10.0] }'
    spec = parse_spec(tomllib.loads(sweep_toml(trials=6, steps=150, pruner="asha", space=space)))
    events: list[dict] = []
    result = train_local(spec, tmp_path / "best.safetensors", emit=events.append)
    trials = result["trials"]
    assert [t["number"] for t in trials] == list(range(6))
    assert {t["state"] for t in trials} <= {"complete", "pruned"}
    hopeless = [t for t in trials if t["params"]["optim.lr"] == 10.0]
    assert hopeless and any(t["state"] == "pruned" and t["steps"] < 150 for t in hopeless)
    complete = [t for t in trials if t["state"] == "complete"]
    best = min(complete, key=lambda t: t["value"])
    assert (
        result["best"]["number"] == best["number"]
        and result["metrics"]["val_loss"] == best["value"]
    )
    assert result["steps"] == sum(t["steps"] for t in trials)
    assert load_file(tmp_path / "best.safetensors")  # the best trial's, not a pruned one's
    assert [e["number"] for e in events if e["event"] == "trial"] == list(range(6))
    assert not list(tmp_path.glob(".*trial"))  # no scratch file left behind


def test_train_local_of_a_sweep_whose_trials_all_fail_says_so(tmp_path: Path) -> None:
    space = '"optim.lr" = { choices = [1e30] }'  # every trial's loss goes non-finite
    spec = parse_spec(tomllib.loads(sweep_toml(trials=2, steps=60, space=space)))
    with pytest.raises(TrainingError, match="none of the sweep's 2 trials completed"):
        train_local(spec, tmp_path / "best.safetensors")
    assert not (tmp_path / "best.safetensors").exists()
