"""Checkpoint commitments on a real node.db, both ends, without a network: the owner
draws each segment once both its states are committed, keeps what a replay needs and
lets the rest go; the worker holds only what is undecided or kept; a chain that
changes after it was committed fails."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from contexts import offline_context
from factories import peer_id_of
from nacl.signing import SigningKey

from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.trust import (
    Commitments,
    FetchedStates,
    HeldStates,
    Reputation,
    UnitTerms,
    needed_states,
    replay_chance,
)
from node.work.trust.replays import Replays
from protocol import ProtocolError
from protocol.work import Progress, ProgressAck

WORKER = peer_id_of(SigningKey(b"w" * 32))
SPEC = {"trust": {"checkpoints": 10, "spot_check_budget": 0.3}}


def _sha(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def ctx(tmp_path: Path) -> WorkContext:
    return offline_context(tmp_path)


def _owner(ctx: WorkContext) -> tuple[Commitments, Unit]:
    replays = Replays(ctx, None)  # type: ignore[arg-type]  (nothing is replayed here)
    commitments = Commitments(ctx, Reputation(ctx.jobs.db), FetchedStates(ctx.blobs), replays)
    job = ctx.jobs.create("j", SPEC, "auto", {}, [])
    unit = ctx.jobs.add_unit(job.id, WORKER, 30, deadline=time.time() + 3600)
    return commitments, unit


def _heard(
    commitments: Commitments, job: Job, unit: Unit, spec: dict, beat: Progress, **terms: Any
) -> ProgressAck:
    return trio.run(commitments.heard, job, unit, UnitTerms(spec, **terms), beat)


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
    ack = _heard(commitments, job, unit, SPEC, _beat(unit, 0, shas[:1]))
    assert (ack.ok, ack.have, ack.keep, ack.drop) == (True, 1, (), ())  # nothing closed yet
    acks = [
        _heard(commitments, job, unit, SPEC, _beat(unit, i, shas[i : i + 1])) for i in range(1, 11)
    ]
    assert [a.have for a in acks] == list(range(2, 12))
    chosen = commitments.chosen_at_result(unit, SPEC, shas)
    assert chosen is not None and all(0 <= i < 10 for i in chosen)
    kept = {i for a in acks for i in a.keep}
    dropped = {i for a in acks for i in a.drop}
    assert kept == set(chosen)  # one class: a replay needs only the chosen starts
    assert not kept & dropped and 10 not in dropped  # the newest state never goes
    assert kept | dropped | {10} >= set(range(9))  # every state decided, as soon as closed


def test_a_changed_commitment_stops_the_unit_and_a_changed_chain_fails(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    job = ctx.jobs.get(unit.job_id)
    _heard(commitments, job, unit, SPEC, _beat(unit, 0, [_sha(0), _sha(1)]))
    ack = _heard(commitments, job, unit, SPEC, _beat(unit, 1, [_sha(9)]))
    assert (ack.ok, ack.reason) == (False, "commitment 1 changed")
    with pytest.raises(ProtocolError, match="not those it committed to"):
        commitments.chosen_at_result(unit, SPEC, [_sha(0), _sha(7), _sha(2)])


def test_a_worker_that_committed_nothing_is_checked_as_before(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    assert commitments.chosen_at_result(unit, SPEC, [_sha(0), _sha(1)]) is None


def test_the_worker_holds_only_undecided_and_kept_states(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    held = HeldStates(folder)
    for i in range(4):
        (folder / f"checkpoint-{i}.safetensors").write_bytes(bytes([i]) * 10)
        held.written({"index": i, "sha256": _sha(i), "file": f"checkpoint-{i}.safetensors"})
    assert held.unsent() == (0, [_sha(i) for i in range(4)])
    ack = ProgressAck(True, "", 4, keep=(1,), drop=(0, 2, 3))
    assert held.to_store(ack) == [1]
    held.stored.add(1)
    files, released = held.to_drop(ack)
    assert [p.name for p in files] == ["checkpoint-0.safetensors", "checkpoint-2.safetensors"]
    assert released == [] and held.unsent() == (4, []) and held.kept() == [_sha(1)]
    assert sorted(held.files) == [1, 3]  # 1 is kept for the owner; 3 is the newest
    files, released = held.to_drop(ProgressAck(True, "", 4, drop=(1,)))
    assert released == [_sha(1)] and held.kept() == [] and sorted(held.files) == [3]


@pytest.mark.parametrize(
    ("chosen", "cross", "share", "needed"),
    [
        ([2, 5], False, False, {2, 5}),
        ([2, 5], True, False, {0, 2, 3, 5, 6}),
        ([2], False, True, {2}),  # a share's checkpoint 0 only when segment 0 replays
        ([1], True, True, {1, 2}),
        ([0], False, True, {0}),
        ([], False, False, set()),
    ],
)
def test_a_replay_needs_the_starts_and_across_classes_the_ends(
    chosen: list[int], cross: bool, share: bool, needed: set[int]
) -> None:
    assert needed_states(chosen, cross, share) == needed


@pytest.mark.parametrize(("budget", "kept"), [(1.0, True), (0.0001, False)])
def test_a_share_keeps_its_first_state_only_when_segment_0_is_drawn(
    ctx: WorkContext, budget: float, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    commitments, unit = _owner(ctx)
    job = ctx.jobs.get(unit.job_id)
    spec = {"trust": {"checkpoints": 10, "spot_check_budget": budget}}
    if not kept:  # the least chance there is (one segment in `checkpoints`), drawn "no"
        monkeypatch.setattr("node.work.trust.commitments.drawn", lambda chance, rng: False)
    beat = _beat(unit, 0, [_sha(0), _sha(1)])
    ack = _heard(commitments, job, unit, spec, beat, delta_round=0)
    assert (0 in ack.keep, 0 in ack.drop) == (kept, not kept)


def test_a_job_with_replicas_keeps_every_state(ctx: WorkContext) -> None:
    commitments, unit = _owner(ctx)
    job = ctx.jobs.get(unit.job_id)
    spec = {"trust": {**SPEC["trust"], "replicas": 2}}
    ack = _heard(commitments, job, unit, spec, _beat(unit, 0, [_sha(i) for i in range(5)]))
    assert (ack.have, ack.keep, ack.drop) == (5, (), ())
