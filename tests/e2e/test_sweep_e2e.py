"""Sweeps across real nodes on loopback: an Optuna study on the owner, trials on peers."""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

from node.demo.localnet import LocalNetwork, LocalNode, wait_for
from training.spec.examples import sweep_toml

pytestmark = pytest.mark.slow


def _val_loss(spec_plain: dict, weights: Path) -> float:
    """The validation loss of `weights`, recomputed here from the trial's spec."""
    import torch
    from safetensors.torch import load_file

    from training.model.modules import build_model
    from training.run.execute import prepare
    from training.run.loop import evaluate
    from training.run.optim import make_loss
    from training.spec.job import parse_spec

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


STEPS = 2000
SPACE = """\
"optim.lr" = { choices = [0.003, 0.01, 1e-7] }
"model.hidden" = { choices = [[16], [32], [64, 32]] }"""


def test_a_sweep_spreads_its_trials_over_peers_prunes_and_returns_the_best(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    owner = localnet.add(["--not-accepting"])
    workers = localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    # long enough that a trial's heartbeats (one a second) carry validations to prune on
    spec = sweep_toml("sweep", trials=12, parallel=3, steps=STEPS, pruner="asha", space=SPACE)
    (tmp_path / "sweep.toml").write_text(spec)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "node",
            "submit",
            str(tmp_path / "sweep.toml"),
            "--wait",
            "--api",
            owner.api,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    (job_id,) = [j["id"] for j in owner.get("/api/v1/jobs")]
    job = owner.get(f"/api/v1/jobs/{job_id}")
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:], job["timeline"][-5:])
    assert "trials (val_loss, minimize)" in out.stdout and "completed by its trials" in out.stdout
    trials = job["trials"]
    assert len(trials) == 12
    assert all(t["state"] in ("complete", "pruned", "failed") for t in trials)
    assert len({t["worker"] for t in trials}) >= 2, trials
    pruned = [t for t in trials if t["state"] == "pruned"]  # lr = 1e-7 learns nothing
    assert pruned, trials
    stopped = 0
    for trial in pruned:  # stopped on its worker, not trained to the end
        assert trial["steps"] < STEPS and trial["reports"], trial
        worker = next(w for w in workers if w.peer_id == trial["worker"])
        unit_id = trial["unit_id"]
        # the stop rides on a heartbeat's answer; on a loaded machine that heartbeat can
        # time out, the stop with it, and the worker trains on (paid to the prune only)
        lines = (f"owner stopped unit {unit_id}", f"unit {unit_id}: heartbeat failed")
        tail = wait_for(lambda w=worker, ls=lines: _with_any(w, ls), 10, "the worker to stop it")
        stopped += lines[0] in tail
    assert stopped, "no pruned trial was stopped on its worker"

    def receipts(node: LocalNode, kind: str) -> dict[str, float]:
        entries = node.get("/api/v1/ledger?limit=1000")["entries"]
        return {e["unit_id"]: e["credit"] for e in entries if e["kind"] == kind}

    # each trial's own credit in both ledgers; a pruned one's for the steps it trained
    paid = {t["unit_id"]: t for t in trials if t["state"] in ("complete", "pruned")}
    wait_for(lambda: set(paid) <= set(receipts(owner, "work_received")), 30, "owner receipts")
    for worker in workers:
        mine = {u for u, t in paid.items() if t["worker"] == worker.peer_id}
        wait_for(lambda w=worker, m=mine: m <= set(receipts(w, "work_done")), 30, "receipts")
    credits = receipts(owner, "work_received")
    for unit_id, trial in paid.items():
        whole = trial["training_flops"] / 1e12
        share = trial["steps"] / trial["total_steps"] if trial["state"] == "pruned" else 1.0
        assert credits[unit_id] == pytest.approx(whole * share, rel=1e-6), trial

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
    from training.spec.job import spec_to_plain
    from training.sweep.trials import trial_spec

    assert best["params"]["optim.lr"] != 1e-7
    plain = spec_to_plain(trial_spec(tomllib.loads(spec), best["params"], 50))
    assert _val_loss(plain, weights) == pytest.approx(best["value"], rel=1e-5)


def test_a_killed_worker_and_an_owner_restart_lose_no_trial(localnet: LocalNetwork) -> None:
    from node.client import request_json

    owner = localnet.add(["--not-accepting", "--lease", "3"])
    workers = localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    spec = sweep_toml("churn", trials=6, parallel=2, steps=800)
    job_id = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec})["id"]

    def trials() -> list[dict]:
        return owner.get(f"/api/v1/jobs/{job_id}")["trials"]

    first = wait_for(lambda: [t for t in trials() if t["worker"]], 60, "a trial to be placed")[0]
    victim = next(w for w in workers if w.peer_id == first["worker"])
    victim.stop(signal.SIGKILL)
    wait_for(
        lambda: (
            (t := trials()[first["number"]])["worker"] != victim.peer_id or t["state"] != "running"
        ),
        60,
        "the killed worker's trial to move",
    )
    wait_for(lambda: len([t for t in trials() if t["state"] != "running"]) >= 2, 120, "2 trials")
    assert owner.stop(signal.SIGTERM) == 0
    owner.start()
    job = owner.wait_job_end(job_id, 300)
    assert job["state"] == "completed", (job["reason"], job["timeline"][-5:])
    numbers = [t["number"] for t in job["trials"]]
    assert numbers == list(range(6))  # none lost, none twice
    assert all(t["state"] in ("complete", "pruned", "failed") for t in job["trials"])
    moved = job["trials"][first["number"]]
    assert moved["state"] == "complete" and moved["worker"] != victim.peer_id, moved


BAD_SPACES = [
    (
        '"optim.lrr" = { low = 1e-4, high = 1e-1 }',
        "sweep.space 'optim.lrr' = 0.0001: optim.lrr is not a known key",
    ),
    (
        '"optim.lr" = { low = 1e-1, high = 1e-4 }',
        "sweep.space.'optim.lr': low (0.1) must be <= high (0.0001)",
    ),
    (
        '"model.hidden" = { choices = [[32], [100000000]] }',
        "sweep.space 'model.hidden' = [100000000]",
    ),
    (
        '"data.batch_size" = { choices = [32, 0] }',
        "sweep.space 'data.batch_size' = 0: data.batch_size must be > 0",
    ),
    ('"name" = { choices = ["a", "b"] }', "sweep.space.'name': name cannot be searched"),
    ('"optim" = { low = 1, high = 3 }', "optim is a table; search one of its keys"),
]


def test_a_bad_space_is_refused_and_a_lone_node_trains_its_own_trials(
    localnet: LocalNetwork,
) -> None:
    from node.client import ApiError, request_json

    node = localnet.add()
    for space, message in BAD_SPACES:
        with pytest.raises(ApiError) as refused:
            request_json(node.api, "POST", "/api/v1/jobs", {"spec": sweep_toml(space=space)})
        assert message in str(refused.value)
    assert node.get("/api/v1/jobs") == []  # nothing stored

    # no peer: the owner, which accepts work, trains every trial itself, one at a time
    space = '"optim.lr" = { choices = [0.01, 1e-7] }'
    spec = sweep_toml("alone", trials=4, parallel=2, steps=300, pruner="asha", space=space)
    job_id = request_json(node.api, "POST", "/api/v1/jobs", {"spec": spec})["id"]
    job = node.wait_job_end(job_id, 120)
    assert job["state"] == "completed", (job["reason"], job["timeline"][-5:])
    trials = job["trials"]
    assert {t["worker"] for t in trials} == {node.peer_id}
    assert {t["state"] for t in trials} <= {"complete", "pruned"}
    assert any(t["state"] == "pruned" and t["steps"] < 300 for t in trials), trials
    assert job["best"]["params"]["optim.lr"] == 0.01 and job["weights_sha256"]
    assert len(job["progress"]["importances"]) == 1  # computed once two trials completed
    entries = node.get("/api/v1/ledger?limit=100")["entries"]
    assert not [e for e in entries if e["kind"] in ("work_done", "work_received")]


def _with_any(node: LocalNode, lines: tuple[str, ...]) -> str:
    """The tail of `node`'s log when it holds any of `lines`, else ""."""
    tail = node.log_tail(400)
    return tail if any(line in tail for line in lines) else ""
