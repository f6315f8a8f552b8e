"""Checkpoint commitments on a real node.db, both ends, without a network: the owner
draws each segment once both its states are committed, keeps what a replay needs and
lets the rest go; the worker holds only what is undecided or kept; a chain that
changes after it was committed fails."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlite_utils
from factories import capacity_ad, peer_id_of
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.peers import PeerTable
from node.preferences import Preferences
from node.work.blobs import BlobStore
from node.work.context import WorkContext
from node.work.jobs import JobStore, Unit
from node.work.trust import Commitments, HeldStates, Reputation, replay_chance
from protocol import ProtocolError
from protocol.work import Progress, ProgressAck

WORKER = peer_id_of(SigningKey(b"w" * 32))
SPEC = {"trust": {"checkpoints": 10, "spot_check_budget": 0.3}}


def _sha(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def ctx(tmp_path: Path) -> WorkContext:
    db = sqlite_utils.Database(tmp_path / "node.db")
    identity = Identity(SigningKey.generate())
    own = capacity_ad(identity.peer_id, 1)
    return WorkContext(
        identity=identity,
        host=None,  # type: ignore[arg-type]  (no network: nothing is fetched here)
        peers=PeerTable(db, ttl_s=60.0),
        jobs=JobStore(db),
        blobs=BlobStore(tmp_path),
        data_dir=tmp_path,
        own_ad=lambda: own,
        policy=None,  # type: ignore[arg-type]
        preferences=Preferences,
        ledger=None,  # type: ignore[arg-type]
        publish_receipt=None,  # type: ignore[arg-type]
        publish_evidence=None,  # type: ignore[arg-type]
    )


def _owner(ctx: WorkContext) -> tuple[Commitments, Unit]:
    async def state_bytes(job, spec) -> int:  # noqa: ANN001
        return 1 << 20

    commitments = Commitments(ctx, Reputation(ctx.jobs.db), state_bytes, lambda sha: None)
    job = ctx.jobs.create("j", SPEC, "auto", {}, [])
    unit = ctx.jobs.add_unit(job.id, WORKER, 30, deadline=time.time() + 3600)
    return commitments, unit


def _beat(unit: Unit, start: int, shas: list[str]) -> Progress:
    return Progress(
        unit.job_id, unit.unit_id, "training", 1, 10, 1.0, 1.0, 1, time.time(),
        commit_from=start, commitments=shas,
    )  # fmt: skip


def test_the_chance_of_a_replay_is_the_budget_over_the_segments() -> None:
    assert replay_chance(SPEC, 0) == pytest.approx(0.3)
    assert replay_chance({"trust": {"checkpoints": 10, "spot_check_budget": 2.0}}, 0) == 1.0
    assert replay_chance({**SPEC, "trust": {**SPEC["trust"], "replicas": 2}}, 0) == 0.0
    assert replay_chance({"trust": {"checkpoints": 0}}, 0) == 0.0
    assert replay_chance({"trust": {"checkpoints": 100}}, 50) < replay_chance(
        {"trust": {"checkpoints": 100}}, 0
    )  # a trusted peer is checked less


def test_each_segment_is_drawn_once_its_end_is_committed(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    job = ctx.jobs.get(unit.job_id)
    shas = [_sha(i) for i in range(11)]
    ack = commitments.heard(job, unit, SPEC, _beat(unit, 0, shas[:1]))
    assert (ack.ok, ack.have, ack.keep, ack.drop) == (True, 1, (), ())  # nothing closed yet
    acks = [
        commitments.heard(job, unit, SPEC, _beat(unit, i, shas[i : i + 1])) for i in range(1, 11)
    ]
    assert [a.have for a in acks] == list(range(2, 12))
    chosen = commitments.decide_all(unit, SPEC, shas)
    assert chosen is not None and all(0 <= i < 10 for i in chosen)
    kept = {i for a in acks for i in a.keep}
    dropped = {i for a in acks for i in a.drop}
    assert kept == set(chosen)  # one class: a replay needs only the chosen starts
    assert not kept & dropped and 10 not in dropped  # the newest state never goes
    assert kept | dropped | {10} >= set(range(9))  # every state decided, as soon as closed


def test_a_changed_commitment_stops_the_unit_and_a_changed_chain_fails(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    job = ctx.jobs.get(unit.job_id)
    commitments.heard(job, unit, SPEC, _beat(unit, 0, [_sha(0), _sha(1)]))
    ack = commitments.heard(job, unit, SPEC, _beat(unit, 1, [_sha(9)]))
    assert (ack.ok, ack.reason) == (False, "commitment 1 changed")
    with pytest.raises(ProtocolError, match="not those it committed to"):
        commitments.decide_all(unit, SPEC, [_sha(0), _sha(7), _sha(2)])


def test_a_worker_that_committed_nothing_is_checked_as_before(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    assert commitments.decide_all(unit, SPEC, [_sha(0), _sha(1)]) is None


def test_the_worker_holds_only_undecided_and_kept_states(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    held = HeldStates(folder)
    blobs = BlobStore(tmp_path)
    released: list[str] = []
    for i in range(4):
        (folder / f"checkpoint-{i}.safetensors").write_bytes(bytes([i]) * 10)
        held.written({"index": i, "sha256": _sha(i), "file": f"checkpoint-{i}.safetensors"})
    assert held.unsent() == (0, [_sha(i) for i in range(4)])
    ack = ProgressAck(True, "", 4, keep=(1,), drop=(0, 2, 3))
    assert held.apply(ack, blobs.put_file, released.append)
    assert held.unsent() == (4, []) and held.kept() == [_sha(1)]
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["checkpoint-3.safetensors"]  # 1 is in the blob store; 3 is the newest
    assert held.apply(ProgressAck(True, "", 4, drop=(1,)), blobs.put_file, released.append)
    assert released == [_sha(1)] and held.kept() == []
