"""Elastic jobs on real node processes: DiLoCo rounds across peers, bitwise equal to
train-local's simulation with a fixed set of workers; receipts for every share."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import tomllib
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, wait_for
from training.spec.examples import elastic_toml

pytestmark = pytest.mark.slow


def _receipts(node: LocalNode, job_id: str) -> set[tuple[str, str]]:
    with closing(sqlite3.connect(node.data_dir / "node.db")) as db:
        rows = db.execute("SELECT unit_id, role FROM receipts WHERE job_id = ?", [job_id])
        return set(rows.fetchall())


@pytest.mark.parametrize("overlap", [None, 0.0, 1.0], ids=["default", "none", "never-taken"])
def test_fixed_workers_train_an_elastic_job_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path, overlap: float | None
) -> None:
    """Three workers, three rounds: the weights are train-local's, bit for bit, with
    each way of overlapping rounds: by default a share starts eagerly and takes its
    round's weights after a quarter of its steps; with `overlap = 0` it waits for
    them; with 1 it starts eagerly and never takes them."""
    owner = localnet.add(["--not-accepting"])
    workers = localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    spec = elastic_toml(
        "el",
        workers=3,
        min_workers=3,
        inner_steps=20,
        rounds=3,
        hidden=(32,),
        extra="" if overlap is None else f"overlap = {overlap}",
    )
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec})
    done = owner.wait_job_end(job["id"], 240)
    assert done["state"] == "completed", done["timeline"][-5:]
    rounds = done["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    peers = {w.peer_id for w in workers}
    for r in rounds:
        assert r["state"] == "closed" and set(r["workers"]) == peers, r
        assert 0 < r["bytes_in"] < r["full_bytes"] / 3, r
        assert r["val_loss"] is not None
    assert rounds[-1]["val_loss"] < rounds[0]["val_loss"]
    notes = [e["note"] for e in done["timeline"]]
    # round 0's weights whole; then each round's update, except when a share starts
    # eagerly and never takes them: round 1 then starts from round 0's weights and the
    # worker's own delta, both held, and round 2 from round 1's weights
    eager, never = overlap != 0.0, overlap == 1.0
    updates = ["round 1's weights update"] + ([] if never else ["round 2's weights update"])
    log = "weights rebuilt from the round before's"
    if eager and not never:
        log = "weights taken on the share's way"
    for worker in workers:  # on loopback each fetch of the weights takes the data channel
        fetched = [n for n in notes if "'s weights" in n and worker.peer_id in n]
        assert [n.split(" (")[0] for n in fetched] == ["round 0's weights", *updates], notes
        assert fetched[0].endswith("(direct channel)"), notes
        assert log in worker.log_tail(400)
    assert rounds[0]["bytes_out"] >= rounds[0]["full_bytes"]  # the weights, whole, to each
    # 4-bit updates (the default): about an eighth of the weights
    assert 0 < rounds[2]["bytes_out"] < rounds[2]["full_bytes"] / 6, rounds[2]
    if never:
        assert rounds[1]["bytes_out"] == 0, rounds[1]
    else:
        assert 0 < rounds[1]["bytes_out"] < rounds[1]["full_bytes"] / 6, rounds[1]
    starts = [n for n in notes if n.startswith("round ") and " slot " in n]
    assert sum("(eager)" in n for n in starts) == (6 if eager else 0), starts

    _assert_equals_train_local(owner, job["id"], spec, tmp_path)

    owner_side = _receipts(owner, job["id"])
    assert len(owner_side) == 9
    for worker in workers:
        mine = _receipts(worker, job["id"])
        assert len(mine) == 3 and all(role == "worker" for _, role in mine)


def _assert_equals_train_local(owner: LocalNode, job_id: str, spec: str, tmp_path: Path) -> None:
    """The job's weights are, bit for bit, what `train-local` simulates of its rounds."""
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
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    assert weights.read_bytes() == local.read_bytes()


def _units(node: LocalNode, job_id: str) -> list[tuple[int, int, str, str]]:
    with closing(sqlite3.connect(node.data_dir / "node.db")) as db:
        rows = db.execute("SELECT round, slot, state, reason FROM units WHERE job_id = ?", [job_id])
        return rows.fetchall()


def _submit(owner: LocalNode, spec: str) -> str:
    return request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec})["id"]


def _rounds(owner: LocalNode, job_id: str) -> list[dict]:
    return owner.get(f"/api/v1/jobs/{job_id}")["rounds"]


def _wait_closed(owner: LocalNode, job_id: str, count: int, timeout: float) -> list[dict]:
    return wait_for(
        lambda: (
            len([r for r in _rounds(owner, job_id) if r["state"] == "closed"]) >= count
            and _rounds(owner, job_id)
        ),
        timeout,
        f"{count} closed rounds",
    )


def _simulated_val_loss(spec: str, tmp_path: Path) -> float:
    from training.run.local import train_local  # noqa: PLC0415 (torch, only here)
    from training.spec.job import parse_spec

    result = train_local(parse_spec(tomllib.loads(spec)), tmp_path / "sim.safetensors")
    return result["rounds"][-1]["val_loss"]


def test_a_worker_killed_mid_round_costs_its_share_and_a_newcomer_joins(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting", "--lease", "3"])
    workers = localnet.add_many(3)
    localnet.wait_all_see_each_other(timeout=30)
    spec = elastic_toml("churn", workers=3, min_workers=2, inner_steps=200, rounds=10, hidden=(32,))
    job_id = _submit(owner, spec)
    # started now, so that a loaded machine's slow start does not eat the job's rounds;
    # idle until a slot frees, since all three are taken
    newcomer = localnet.add()
    _wait_closed(owner, job_id, 1, 120)
    wait_for(lambda: newcomer.peer_id in owner.peer_ids(), 60, "the owner to see the newcomer")
    opened = wait_for(  # a round after the first is open
        lambda: (r := _rounds(owner, job_id))[-1]["state"] == "open" and r[-1]["round"] >= 1 and r,
        60,
        "round 1 to open",
    )
    # the victim: a worker of the round just closed, likely holding its slot again now
    victim = next(w for w in workers if w.peer_id in opened[-2]["workers"])
    victim.stop(signal.SIGKILL)
    job = owner.wait_job_end(job_id, 300)
    assert job["state"] == "completed", job["timeline"][-5:]
    rounds = job["rounds"]
    # shares start eagerly: the victim may have finished a share of a round or two
    # past the one open when it died; from the first round it did not finish, it is gone
    last = max(r["round"] for r in rounds if victim.peer_id in r["workers"])
    after = rounds[last + 1 :]
    assert after and last < opened[-1]["round"] + 2, [r["workers"] for r in rounds]
    assert victim.peer_id in after[0]["dropped"] + after[0]["left"], after[0]
    assert all(victim.peer_id not in r["workers"] for r in after)
    assert any(newcomer.peer_id in r["workers"] for r in after), rounds
    assert all(len(r["workers"]) >= 2 for r in rounds)
    fixed = _simulated_val_loss(spec, tmp_path)
    print(f"val loss with churn {rounds[-1]['val_loss']:.4f}, fixed membership {fixed:.4f}")
    assert rounds[-1]["val_loss"] <= fixed * 1.06  # a lost share, a newcomer's fresh state


def test_an_owner_killed_mid_round_makes_no_volunteer_train_twice(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """SIGKILL while a round's shares train: after the restart the owner re-attaches
    to them (their keys are sealed in node.db), takes their deltas, and the job ends
    bitwise equal to train-local's simulation, each share trained and paid once."""
    owner = localnet.add(["--not-accepting", "--lease", "3"])
    workers = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)
    # shares long enough (a few seconds) to be caught training: most are not spot
    # checked, so a round of short ones is over before a poll sees it
    spec = elastic_toml("restart", workers=2, min_workers=2, inner_steps=600, rounds=4)
    job_id = _submit(owner, spec)
    before = _wait_closed(owner, job_id, 2, 180)
    wait_for(  # shares start eagerly: one of round 2 may be done and round 3's training
        lambda: any(r >= 2 and state == "running" for r, _, state, _ in _units(owner, job_id)),
        60,
        "a share of round 2 or 3 to train",
    )
    assert owner.stop(signal.SIGKILL) == -signal.SIGKILL
    owner.start()
    job = owner.wait_job_end(job_id, 300)
    assert job["state"] == "completed", job["timeline"][-5:]
    rounds = job["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for kept in before:  # what was closed before the restart is as it was
        if kept["state"] == "closed":
            after = rounds[kept["round"]]
            if kept["val_loss"] is None:  # closed, not evaluated yet: evaluated after
                assert after["val_loss"] is not None and after["metrics"], after
                assert after["evaluated_at"] >= after["closed_at"] > 0, after
                after = {**after, "val_loss": None, "metrics": {}, "evaluated_at": 0.0}
            assert after == kept
    units = _units(owner, job_id)
    assert sorted((r, slot) for r, slot, state, _ in units if state == "done") == [
        (r, slot) for r in range(4) for slot in range(2)
    ]
    # no share trained a second time: an extra unit is only an offer the kill cut short,
    # never confirmed, which expires (no fault of the worker's) and is offered again
    extra = [unit for unit in units if unit[2] != "done"]
    assert all(s == "expired" and "was never confirmed" in why for *_, s, why in extra), extra
    assert len(units) <= 10, units
    for worker in workers:
        assert len(_receipts(worker, job_id)) == 4
    chain = [r["weights_sha256"] for r in rounds[1:]]
    assert chain == [r["next_weights_sha256"] for r in rounds[:-1]]  # applied once each
    assert job["weights_sha256"] == rounds[-1]["next_weights_sha256"]
    _assert_equals_train_local(owner, job_id, spec, tmp_path)
