"""End to end on real node processes: submit on one node, a peer trains, signed weights
come back; a vanished worker's unit is re-offered; a paused node gets no work."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest
from safetensors import safe_open

from node.client import request_json
from node.demo.localnet import ONE_THREAD, LocalNetwork, LocalNode, wait_for
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **ONE_THREAD},
    )


def _spec(tmp_path: Path, steps: int, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(digits_toml(steps=steps, hidden=(32,), lr=3e-3))
    return path


def _job(node: LocalNode, job_id: str) -> dict:
    return node.get(f"/api/v1/jobs/{job_id}")


def _submit(node: LocalNode, spec: Path) -> str:
    out = _cli("submit", str(spec), "--api", node.api)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("job ", 1)[1].split(" ", 1)[0]


def test_a_peer_trains_the_job_and_signed_weights_come_back(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner, *workers = localnet.start(3)
    localnet.wait_all_see_each_other(timeout=20)
    spec = _spec(tmp_path, steps=150)
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = _job(owner, job_id)
    assert job["state"] == "completed"
    assert job["worker"] in {w.peer_id for w in workers}
    assert job["metrics"]["val_accuracy"] > 0.6
    assert [e["state"] for e in job["timeline"]][:2] == ["queued", "running"]

    # the weights: safetensors, hash as recorded
    weights = tmp_path / "w.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == job["weights_sha256"]
    with safe_open(str(weights), framework="pt") as f:
        assert len(list(f.keys())) >= 2

    # "as if trained locally": bitwise equal to train-local of the same spec
    local = tmp_path / "local.safetensors"
    out = _cli("train-local", str(spec), "--out", str(local))
    assert out.returncode == 0, out.stderr
    assert local.read_bytes() == weights.read_bytes()

    # both sides hold the signed receipt
    worker = next(w for w in workers if w.peer_id == job["worker"])
    for node, role in ((owner, "owner"), (worker, "worker")):
        import sqlite3

        with sqlite3.connect(node.data_dir / "node.db") as db:
            rows = db.execute("select role from receipts where job_id = ?", [job_id]).fetchall()
        assert rows == [(role,)]

    listing = _cli("jobs", "--api", owner.api)
    assert job_id in listing.stdout and "completed" in listing.stdout


def test_vanished_worker_unit_is_reoffered(localnet: LocalNetwork, tmp_path: Path) -> None:
    owner = localnet.add(["--lease", "4"])
    workers = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=20)
    # long enough to be training still when killed (3,000 steps took 1.5-3.5 s)
    job_id = _submit(owner, _spec(tmp_path, steps=8000))
    job = wait_for(
        lambda: (
            (j := _job(owner, job_id))["state"] == "running"
            and j["progress"].get("step", 0) > 0
            and j
        ),
        60,
        "training to start",
    )
    first = next(w for w in workers if w.peer_id == job["worker"])
    first.stop(signal.SIGKILL)
    killed = time.monotonic()
    job = wait_for(
        lambda: (j := _job(owner, job_id))["worker"] not in ("", first.peer_id) and j,
        60,
        "the unit to be re-offered",
    )
    print(f"re-offered {time.monotonic() - killed:.1f} s after SIGKILL")
    assert any("vanished" in e["note"] for e in job["timeline"]), job["timeline"]
    assert job["state"] == "running" and job["attempts"] == 2  # a fresh unit trains it
    request_json(owner.api, "POST", f"/api/v1/jobs/{job_id}/cancel")


def test_paused_node_gets_no_work(localnet: LocalNetwork, tmp_path: Path) -> None:
    owner, worker = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    out = _cli("node", "pause", "--api", worker.api)
    assert out.returncode == 0, out.stderr
    wait_for(
        lambda: any(
            p["peer_id"] == worker.peer_id and not p["policy"]["accepting"]
            for p in owner.get("/api/v1/peers")
        ),
        15,
        "the pause to be advertised",
    )
    out = _cli("node", "pause", "--api", owner.api)
    job_id = _submit(owner, _spec(tmp_path, steps=20))
    job = wait_for(lambda: (j := _job(owner, job_id))["reason"] and j, 15, "a queue reason")
    assert job["state"] == "queued"
    assert "not accepting work" in job["reason"]
    _cli("node", "resume", "--api", worker.api)
    job = wait_for(
        lambda: (j := _job(owner, job_id))["state"] == "completed" and j,
        120,
        "the job to run once the worker resumes",
    )
    assert job["worker"] == worker.peer_id


def test_hours_that_exclude_now_pause_the_running_unit_and_clearing_them_resumes_it(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """`meshminer node prefs hours=...` on the worker: within 5 s its runner stops, its
    heartbeats say "paused" (the lease holds, the owner's timeline notes it) and offers
    elsewhere see its ad's reason; cleared, the same unit trains on."""
    owner = localnet.add(["--not-accepting"])
    worker = localnet.add()
    localnet.wait_all_see_each_other(timeout=20)
    job_id = _submit(owner, _spec(tmp_path, steps=30_000))
    wait_for(lambda: _job(owner, job_id)["progress"].get("step", 0) > 0, 60, "training")
    now = time.localtime()
    hours = f"{(now.tm_hour + 2) % 24:02d}:00-{(now.tm_hour + 3) % 24:02d}:00"
    out = _cli("node", "prefs", f"hours={hours}", "--api", worker.api)
    assert out.returncode == 0 and hours in out.stdout, out.stdout + out.stderr
    asked = time.monotonic()
    job = wait_for(
        lambda: (j := _job(owner, job_id))["progress"].get("phase") == "paused" and j,
        10,
        "the owner to hear the unit is paused",
    )
    assert time.monotonic() - asked < 5
    assert any("paused by its volunteer's preferences" in e["note"] for e in job["timeline"])
    assert worker.get("/api/v1/status")["availability"]["paused"] == (
        f"outside its hours ({hours})"
    )
    wait_for(
        lambda: any(p["paused"] for p in owner.get("/api/v1/peers")),
        15,
        "the worker's ad to say why it does not train",
    )
    step = _step_at_rest(owner, job_id)
    out = _cli("node", "prefs", "hours=", "--api", worker.api)
    assert out.returncode == 0, out.stderr
    job = wait_for(
        lambda: (j := _job(owner, job_id))["progress"].get("step", 0) > step + 200 and j,
        30,
        "the same unit to train on",
    )
    assert job["state"] == "running" and job["attempts"] == 1
    assert any(e["note"].endswith("training again") for e in job["timeline"])
    request_json(owner.api, "POST", f"/api/v1/jobs/{job_id}/cancel")


def _step_at_rest(owner: LocalNode, job_id: str, timeout: float = 20) -> int:
    """The job's step once two readings 2 s apart agree. A training runner moves it by
    hundreds a second, reported every second; a stopped one stops it, once the reports
    already on their way (more of them the busier the machine) have landed."""
    last: list[int] = []

    def at_rest() -> int | None:
        step = _job(owner, job_id)["progress"]["step"]
        still = bool(last) and last[-1] == step
        last.append(step)
        return step if still else None

    return wait_for(at_rest, timeout, "the unit's step to stop moving", interval=2.0)


def test_owner_restarted_mid_job_reattaches_to_the_training_worker(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """The unit's key survives the restart (sealed in node.db), so the owner takes the
    same worker's result instead of training the job a second time."""
    owner = localnet.add(["--lease", "4", "--not-accepting"])
    worker = localnet.add()
    localnet.wait_all_see_each_other(timeout=20)
    job_id = _submit(owner, _spec(tmp_path, steps=3000))
    job = wait_for(
        lambda: (j := _job(owner, job_id))["progress"].get("step", 0) > 0 and j,
        60,
        "training to start on the worker",
    )
    unit_id = job["unit_id"]
    assert owner.stop(signal.SIGTERM) == 0
    # a heartbeat fails while the owner is down (libp2p then refuses to redial it
    # for 60 s, unless told otherwise): the worker must still reach it after
    wait_for(lambda: "heartbeat failed" in worker.log_tail(200), 30, "a heartbeat to fail")
    owner.start()
    job = wait_for(
        lambda: (j := _job(owner, job_id))["state"] in ("completed", "failed") and j,
        240,
        "the job to finish after the restart",
    )
    assert job["state"] == "completed", job["reason"]
    assert (job["worker"], job["unit_id"], job["attempts"]) == (worker.peer_id, unit_id, 1)
    assert worker.log_tail(400).count("accepted unit") == 1


def test_failing_training_fails_the_job_not_the_daemon(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    worker = localnet.add()
    localnet.wait_all_see_each_other(timeout=20)
    # time limit: 3,000,000 steps cannot finish in 2 seconds
    slow = (
        _spec(tmp_path, steps=3_000_000)
        .read_text()
        .replace('gpu = "preferred"', 'gpu = "preferred"\nmax_hours = 0.0006')
    )
    (tmp_path / "slow.toml").write_text(slow)
    job_id = _submit(owner, tmp_path / "slow.toml")
    job = wait_for(
        lambda: (j := _job(owner, job_id))["state"] == "failed" and j,
        120,
        "the over-long job to fail",
    )
    assert "time limit" in job["reason"]
    assert job["worker"] == worker.peer_id
    for node in (owner, worker):
        assert node.proc is not None and node.proc.poll() is None
        assert node.get("/api/v1/status")["load"] == 0 or node is owner
    wait_for(lambda: worker.get("/api/v1/status")["load"] == 0, 10, "the worker to be idle")


def test_deny_list_declines_with_the_reason(localnet: LocalNetwork, tmp_path: Path) -> None:
    owner = localnet.add(["--not-accepting"])
    localnet.add(["--deny-owner", owner.peer_id])
    localnet.wait_all_see_each_other(timeout=20)
    job_id = _submit(owner, _spec(tmp_path, steps=20))
    job = wait_for(lambda: (j := _job(owner, job_id))["excluded"] and j, 30, "the decline")
    assert job["state"] == "queued"
    assert any("deny list" in e["note"] for e in job["timeline"])


@pytest.mark.parametrize("how", ["pause", "shutdown"])
def test_hand_back_reoffers_the_unit(localnet: LocalNetwork, tmp_path: Path, how: str) -> None:
    """`node pause --hand-back`, or a worker stopped (SIGTERM) while it trains: its
    owner gets the unit back at once, not after a lease."""
    owner = localnet.add(["--lease", "60"])  # a lease expiry would time the test out
    volunteer = localnet.add()
    localnet.wait_all_see_each_other(timeout=20)
    # long enough to still run when the pause arrives (3,000 steps took 3.5 s)
    job_id = _submit(owner, _spec(tmp_path, steps=12_000))
    job = wait_for(
        lambda: (j := _job(owner, job_id))["progress"].get("step", 0) > 0 and j,
        60,
        "training to start",
    )
    assert job["worker"] == volunteer.peer_id  # peers are offered work before the owner
    if how == "pause":
        out = _cli("node", "pause", "--hand-back", "--api", volunteer.api)
        assert out.returncode == 0, out.stderr
    else:
        assert volunteer.stop(signal.SIGTERM) == 0
    job = wait_for(
        lambda: (j := _job(owner, job_id))["worker"] not in ("", volunteer.peer_id) and j,
        60,
        "the unit to be handed back and re-offered",
    )
    why = "node paused" if how == "pause" else "node shutting down"
    assert any(
        "returned the unit" in e["note"] and f"handed back by the volunteer ({why})" in e["note"]
        for e in job["timeline"]
    ), job["timeline"]
    assert job["worker"] == owner.peer_id  # the volunteer is paused or gone: the owner trains it
    request_json(owner.api, "POST", f"/api/v1/jobs/{job_id}/cancel")


def test_a_worker_with_room_trains_two_units_at_once(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """`--max-units 2`: both jobs' units run on the one worker at the same time, and
    the busy third one waits without leaving a unit row per retry."""
    owner = localnet.add(["--not-accepting"])
    worker = localnet.add(["--max-units", "2"])
    localnet.wait_all_see_each_other(timeout=20)
    # long enough that the first unit still trains when the second job is submitted
    # (the third only waits its turn: a short one)
    ids = [
        _submit(owner, _spec(tmp_path, steps=steps, name=f"j{i}.toml"))
        for i, steps in enumerate((15000, 15000, 300))
    ]
    # the worker's own load: 100% is two units of two. (The owner's job states lag: on
    # a loaded machine it listed the second job running only after the first unit's
    # runner had finished and its room had gone to the third.)
    wait_for(
        lambda: worker.get("/api/v1/status")["load"] == 100,
        90,
        "two units training on the worker at once",
        interval=0.05,
    )
    jobs = [
        wait_for(
            lambda i=i: (j := _job(owner, i))["state"] in ("completed", "failed") and j,
            300,
            f"job {i} to finish",
        )
        for i in ids
    ]
    assert [j["state"] for j in jobs] == ["completed"] * 3, [j["reason"] for j in jobs]
    assert {j["worker"] for j in jobs} == {worker.peer_id}
    assert all(j["metrics_status"] == "verified" for j in jobs)  # spot-checked, re-evaluated
    assert [j["attempts"] for j in jobs] == [1, 1, 1]
    with closing(sqlite3.connect(owner.data_dir / "node.db")) as db:
        units = db.execute("SELECT job_id, state FROM units").fetchall()
    assert sorted(units) == sorted((i, "done") for i in ids)  # busy declines left no rows
