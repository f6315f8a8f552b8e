"""Elastic jobs on real node processes: DiLoCo rounds across peers, bitwise equal to
train-local's simulation with a fixed set of workers; receipts for every share."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from node.client import request_json
from node.localnet import LocalNetwork, LocalNode, wait_for
from training.examples import elastic_toml

pytestmark = pytest.mark.slow


def _receipts(node: LocalNode, job_id: str) -> set[tuple[str, str]]:
    with closing(sqlite3.connect(node.data_dir / "node.db")) as db:
        rows = db.execute("SELECT unit_id, role FROM receipts WHERE job_id = ?", [job_id])
        return set(rows.fetchall())


def test_fixed_workers_train_an_elastic_job_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    workers = localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    spec = elastic_toml("el", workers=3, min_workers=3, inner_steps=20, rounds=3, hidden=(32,))
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec})
    done = wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job['id']}"))["state"]
            in ("completed", "failed", "cancelled")
            and j
        ),
        240,
        "the elastic job to end",
    )
    assert done["state"] == "completed", done["timeline"][-5:]
    rounds = done["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    peers = {w.peer_id for w in workers}
    for r in rounds:
        assert r["state"] == "closed" and set(r["workers"]) == peers, r
        assert 0 < r["bytes_in"] < r["full_bytes"] / 3, r
        assert r["val_loss"] is not None
    assert rounds[-1]["val_loss"] < rounds[0]["val_loss"]

    spec_file = tmp_path / "el.toml"
    spec_file.write_text(spec)
    local = tmp_path / "local.safetensors"
    out = subprocess.run(
        [sys.executable, "-m", "node", "train-local", str(spec_file), "--out", str(local)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    weights = tmp_path / "network.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job['id']}/weights", weights)
    assert weights.read_bytes() == local.read_bytes()

    owner_side = _receipts(owner, job["id"])
    assert len(owner_side) == 9
    for worker in workers:
        mine = _receipts(worker, job["id"])
        assert len(mine) == 3 and all(role == "worker" for _, role in mine)
