"""Sweeps across real nodes on loopback: an Optuna study on the owner, trials on peers."""

from __future__ import annotations

import tomllib
import urllib.request
from pathlib import Path

import pytest

from node.client import request_json
from node.localnet import LocalNetwork, LocalNode, wait_for
from training.examples import sweep_toml

pytestmark = pytest.mark.slow


def _wait_end(owner: LocalNode, job_id: str, timeout: float) -> dict:
    return wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job_id}"))["state"]
            in ("completed", "failed", "cancelled")
            and j
        ),
        timeout,
        "the sweep to end",
    )


def _val_loss(spec_plain: dict, weights: Path) -> float:
    """The validation loss of `weights`, recomputed here from the trial's spec."""
    import torch
    from safetensors.torch import load_file

    from training.execute import prepare
    from training.loop import evaluate
    from training.models import build_model
    from training.optim import make_loss
    from training.spec import parse_spec

    run = prepare(parse_spec(spec_plain), None, "cpu")
    model = build_model(run.plan)
    model.load_state_dict(load_file(str(weights)), strict=True)
    loss_fn = make_loss(run.summary.loss, run.data.info.task)
    found = evaluate(
        model,
        run.data.val,
        loss_fn,
        run.summary.batch_size,
        torch.device("cpu"),
        run.data.info.task,
    )
    return found["val_loss"]


def test_a_sweep_spreads_its_trials_over_peers_and_returns_the_best(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    owner = localnet.add(["--not-accepting"])
    localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    spec = sweep_toml("sweep", trials=12, parallel=3, steps=100)
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec})
    job = _wait_end(owner, job["id"], 300)
    assert job["state"] == "completed", (job["reason"], job["timeline"][-5:])
    trials = job["trials"]
    assert len(trials) == 12
    assert all(t["state"] in ("complete", "pruned", "failed") for t in trials)
    assert len({t["worker"] for t in trials}) >= 2, trials

    study_file = tmp_path / "study.journal"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job['id']}/study", study_file)
    study = optuna.load_study(
        study_name=job["id"], storage=JournalStorage(JournalFileBackend(str(study_file)))
    )
    assert len(study.trials) == 12
    best = job["best"]
    assert best["number"] == study.best_trial.number
    assert best["value"] == pytest.approx(study.best_value)
    assert job["metrics"]["best_trial"] == best["number"]

    weights = tmp_path / "best.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job['id']}/weights", weights)
    from training.spec import spec_to_plain
    from training.sweep_spec import trial_spec

    plain = spec_to_plain(trial_spec(tomllib.loads(spec), best["params"], 50))
    assert _val_loss(plain, weights) == pytest.approx(best["value"], rel=1e-5)
