"""A job on three nodes: owner and worker each record the co-signed receipt with the same
credit, both chains verify, and the third node audits the receipt from gossip."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys

import pytest

from node.demo.localnet import LocalNetwork, wait_for
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow

SPEC = digits_toml("ledger-digits", seed=1, hidden=(32,), batch_size=32, steps=40)


def test_receipts_reach_both_ledgers_and_the_third_nodes_audit(localnet: LocalNetwork) -> None:
    from node.client import request_json

    owner = localnet.add(["--not-accepting"])
    others = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=20)
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": SPEC})
    expected_credit = job["summary"]["training_flops"] / 1e12
    job = wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job['id']}"))["state"] in ("completed", "failed") and j
        ),
        120,
        "the job to finish",
    )
    assert job["state"] == "completed", job["reason"]
    worker = next(n for n in others if n.peer_id == job["worker"])
    auditor = next(n for n in others if n is not worker)

    def work_entry(node, kind):
        entries = node.get("/api/v1/ledger?after=-1&limit=100")["entries"]
        return next((e for e in entries if e["kind"] == kind and e["job_id"] == job["id"]), None)

    received = wait_for(lambda: work_entry(owner, "work_received"), 30, "the owner's entry")
    done = wait_for(lambda: work_entry(worker, "work_done"), 30, "the worker's entry")
    assert received["credit"] == done["credit"]
    assert received["credit"] == pytest.approx(expected_credit, rel=1e-9)
    assert received["unit_id"] == done["unit_id"] == job["unit_id"]
    assert received["payload"] == done["payload"]  # the same co-signed receipt

    for node in (owner, worker):
        report = node.get("/api/v1/ledger/verify")
        assert report["ok"], report
        assert report["entries"] >= 2  # genesis + the work entry
    balances = owner.get("/api/v1/ledger/balances")["node"]
    assert balances["spent"] == pytest.approx(expected_credit)
    assert worker.get("/api/v1/ledger/balances")["node"]["earned"] == pytest.approx(expected_credit)

    def audited() -> dict | None:
        network = auditor.get("/api/v1/ledger/balances")["network"]
        return network.get(worker.peer_id)

    seen = wait_for(audited, 30, "the receipt to reach the third node's audit table")
    assert seen["earned"] == pytest.approx(expected_credit)
    assert auditor.get("/api/v1/ledger/balances")["conflicts"] == []

    # the CLI: recent entries and balances, verify, export; then a tampered copy
    out = _cli("ledger", "--api", worker.api)
    assert out.returncode == 0, out.stderr
    assert "work_done" in out.stdout and "earned" in out.stdout
    out = _cli("ledger", "verify", "--api", worker.api)
    assert out.returncode == 0 and "ledger ok" in out.stdout, out.stdout + out.stderr
    out = _cli("ledger", "export", "--format", "csv", "--api", worker.api)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("seq,") and len(lines) == 1 + len(
        worker.get("/api/v1/ledger")["entries"]
    )

    worker.stop()
    copy = worker.data_dir.parent / "tampered"
    shutil.copytree(worker.data_dir, copy, ignore=shutil.ignore_patterns("node.lock"))
    assert _cli("ledger", "verify", "--data-dir", str(copy)).returncode == 0
    # no node running and no --api: the data dir of MESHMINER_DATA_DIR is read
    out = _cli("ledger", "verify", env={"MESHMINER_DATA_DIR": str(copy),
               "MESHMINER_API": "http://127.0.0.1:9"})  # fmt: skip
    assert out.returncode == 1 and "no meshminer node is answering" in out.stderr  # named: kept
    out = _cli("ledger", "verify", env={"MESHMINER_DATA_DIR": str(copy)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"reading the ledger in {copy}" in out.stderr and "ledger ok" in out.stdout
    with sqlite3.connect(copy / "ledger.db") as db:  # a tamperer removes the guards first
        for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
            db.execute(f"DROP TRIGGER {name}")
        db.execute("UPDATE entries SET credit = credit * 2 WHERE seq = ?", [done["seq"]])
    out = _cli("ledger", "verify", "--data-dir", str(copy))
    assert out.returncode == 1
    assert f"seq {done['seq']}" in out.stderr


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **(env or {})},
    )
