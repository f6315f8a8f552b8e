"""Spot-check evidence at constant disk, on real node processes: the worker commits to
each training state in its heartbeats, the owner draws each segment as soon as both
its ends are committed and fetches what it chose while training goes on, and the
worker never holds more than three states, however many checkpoints the unit has."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from processes import torch_mapped

from node.demo.localnet import ONE_THREAD, LocalNetwork, LocalNode, wait_for
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow


def _bounded_worker(localnet: LocalNetwork) -> LocalNode:
    """A volunteer that bounds even a small model's evidence (`evidence_floor_mb = 0`)."""
    folder = localnet.root / f"node{len(localnet.nodes) + 1}"
    folder.mkdir(parents=True)
    (folder / "meshminer.toml").write_text("evidence_floor_mb = 0\n")
    return localnet.add()


def _train_local(spec: Path, out: Path) -> subprocess.Popen:
    """`train-local` of `spec`, started now beside the network's run (one thread each
    on two cores): the bits the job's weights must equal."""
    return subprocess.Popen(
        [sys.executable, "-m", "node", "train-local", str(spec), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", **ONE_THREAD},
    )


def _local_sha256(trained: subprocess.Popen, out: Path) -> str:
    _, err = trained.communicate(timeout=300)
    assert trained.returncode == 0, err
    return hashlib.sha256(out.read_bytes()).hexdigest()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **ONE_THREAD},
    )


def test_a_worker_holds_three_states_and_an_owner_killed_meanwhile_draws_none_twice(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """A third of the segments are drawn, so the owner fetches and replays many states
    while the worker trains, and the worker never holds more than 3 of its 51. The owner is
    SIGKILLed while the worker waits on its draws; restarted on the same data dir, it
    goes on from the draws and fetches it kept in node.db: the same unit completes,
    checked, bitwise equal to train-local, and the worker trained it once."""
    owner = localnet.add(["--not-accepting", "--lease", "30"])
    worker = _bounded_worker(localnet)
    localnet.wait_all_see_each_other(timeout=20)
    spec = tmp_path / "job.toml"
    toml = digits_toml(steps=1500, hidden=(32,), lr=3e-3)
    spec.write_text(toml + "\n[trust]\ncheckpoints = 50\nspot_check_budget = 0.3\n")
    local = _train_local(spec, tmp_path / "local.safetensors")
    out = _cli("submit", str(spec), "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    db = f"file:{owner.data_dir / 'node.db'}?mode=ro"

    def replayed_early() -> int:
        with closing(sqlite3.connect(db, uri=True)) as conn:
            try:
                rows = conn.execute("select chain from commitments").fetchall()
            except sqlite3.OperationalError:  # no table yet
                return 0
        return sum(len(json.loads(chain)["replayed"]) for (chain,) in rows)

    # killed once a segment was replayed while it trained (kept in node.db), so that
    # the count below does not race the replay's start-up against the training
    job = wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job_id}"))["progress"].get("step", 0) >= 300
            and replayed_early() >= 1
            and j
        ),
        120,
        "a fifth of the training and a segment replayed",
    )
    unit_id = job["unit_id"]
    owner.stop(signal.SIGKILL)
    owner.start()
    job = owner.wait_job_end(job_id, 300)
    assert job["state"] == "completed", job.get("reason")
    assert (job["unit_id"], job["attempts"]) == (unit_id, 1)
    metrics = job["metrics"]
    assert metrics["check"] == "bitwise" and metrics["checked_segments"] >= 4, metrics
    assert metrics["checked_while_training"] >= 1, metrics
    assert worker.log_tail(400).count("accepted unit") == 1
    # the runner's own count of the states on disk at once, each time it wrote one
    (found,) = re.findall(r"(\d+) checkpoints, at most (\d+) of them held", worker.log_tail(400))
    assert found[0] == "51" and int(found[1]) <= 3, found

    assert _local_sha256(local, tmp_path / "local.safetensors") == job["weights_sha256"]


def test_a_unit_whose_worker_is_killed_goes_on_from_a_recent_state_elsewhere(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """`trust.resume_minutes`: the owner fetches a state of the unit every few
    seconds while it trains; the worker is SIGKILLed, and the next worker trains only
    the steps after the latest state the owner trusts. The job's weights are still
    the bits of train-local, and the second worker is credited for its steps only."""
    owner = localnet.add(["--not-accepting", "--lease", "4"])
    first, second = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=20)
    spec = tmp_path / "job.toml"
    toml = digits_toml(steps=8000, hidden=(32,), lr=3e-3)  # 1.5-3.5 s a 3,000
    spec.write_text(toml + "\n[trust]\nresume_minutes = 0.02\n")
    local = _train_local(spec, tmp_path / "local.safetensors")
    out = _cli("submit", str(spec), "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    db = f"file:{owner.data_dir / 'node.db'}?mode=ro"

    def resume_point() -> tuple | None:
        with closing(sqlite3.connect(db, uri=True)) as conn:
            try:
                return conn.execute(
                    "select unit_id, step from resume_points where job_id = ?", [job_id]
                ).fetchone()
            except sqlite3.OperationalError:  # no table yet
                return None

    unit_id, step = wait_for(resume_point, 120, "a resume point")
    job = owner.get(f"/api/v1/jobs/{job_id}")
    trainer = first if job["worker"] == first.peer_id else second
    trainer.stop(signal.SIGKILL)
    job = owner.wait_job_end(job_id, 300)
    assert job["state"] == "completed", job.get("reason")
    assert job["attempts"] == 2 and job["unit_id"] != unit_id
    notes = [e["note"] for e in job["timeline"]]
    resumed = [n for n in notes if "going on from step" in n]
    assert resumed, notes
    resumed_at = int(re.search(r"going on from step (\d+)", resumed[0]).group(1))
    assert resumed_at >= step > 0
    assert job["metrics"]["steps"] == 8000 - resumed_at
    # the owner's checks and replays built the model in runners: its daemon has no
    # torch, whose import once held its thread past the 4 s lease
    assert owner.proc is not None and not torch_mapped(owner.proc.pid)

    assert _local_sha256(local, tmp_path / "local.safetensors") == job["weights_sha256"]
