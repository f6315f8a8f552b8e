"""Spot-check evidence at constant disk, on real node processes: the worker commits to
each training state in its heartbeats, the owner draws each segment as soon as both
its ends are committed and fetches what it chose while training goes on, and the
worker never holds more than three states, however many checkpoints the unit has."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node.demo.localnet import ONE_THREAD, LocalNetwork, LocalNode
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow


def _bounded_worker(localnet: LocalNetwork) -> LocalNode:
    """A volunteer that bounds even a small model's evidence (`evidence_floor_mb = 0`)."""
    folder = localnet.root / f"node{len(localnet.nodes) + 1}"
    folder.mkdir(parents=True)
    (folder / "meshminer.toml").write_text("evidence_floor_mb = 0\n")
    return localnet.add()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **ONE_THREAD},
    )


def test_a_worker_holds_at_most_three_states_and_the_chosen_segments_still_replay(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    worker = _bounded_worker(localnet)
    localnet.wait_all_see_each_other(timeout=20)
    spec = tmp_path / "job.toml"
    # half the segments drawn: many fetches while it trains, none skipped by chance
    toml = digits_toml(steps=150, hidden=(32,), lr=3e-3)
    spec.write_text(toml + "\n[trust]\nspot_check_budget = 0.5\n")
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = owner.get(f"/api/v1/jobs/{job_id}")
    assert job["state"] == "completed", job.get("reason")
    assert job["metrics"]["check"] == "bitwise"
    assert job["metrics"]["checked_segments"] >= 10, job["metrics"]
    assert job["metrics"]["checked_while_training"] >= 1, job["metrics"]

    # the runner's own count of the states on disk at once, each time it wrote one
    found = re.findall(r"(\d+) checkpoints, at most (\d+) of them held", worker.log_tail(400))
    assert found, worker.log_tail(40)
    checkpoints, held = map(int, found[-1])
    assert checkpoints == 76 and held <= 3, found

    local = tmp_path / "local.safetensors"
    trained = _cli("train-local", str(spec), "--out", str(local))
    assert trained.returncode == 0, trained.stderr

    assert hashlib.sha256(local.read_bytes()).hexdigest() == job["weights_sha256"]
