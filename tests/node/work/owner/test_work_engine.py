"""The owner's work engine on a real node.db: compare-and-set transitions, races
between cancel, offers, results and leases, backoff, sealed unit keys, recovery."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import sqlite_utils
import trio
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.peers import PeerTable
from node.preferences import Preferences
from node.work.blobs import Authorized, BlobStore, TransferError, fetch_granted
from node.work.context import WorkContext
from node.work.jobs import JobStore, StaleJob, UnitKeys
from node.work.owner import BACKOFF_MAX_S, MAX_ATTEMPTS, Backoff, Leases, Lifecycle
from node.work.owner.modes import MODES, JobMode, OwnerParts
from node.work.owner.placement import PEER_BACKOFF_MAX_S, Placement
from node.work.service import note_served
from node.work.trust import Reputation
from protocol.blobs import BlobGrant

WORKER = "12D3KooWworker"


def _ctx(tmp_path: Path, seed: bytes | None = None) -> WorkContext:
    db = sqlite_utils.Database(tmp_path / "node.db")
    identity = Identity(SigningKey(seed) if seed else SigningKey.generate())
    return WorkContext(
        identity=identity,
        host=None,  # type: ignore[arg-type]  (no network in these tests)
        peers=None,  # type: ignore[arg-type]
        jobs=JobStore(db),
        blobs=None,  # type: ignore[arg-type]
        data_dir=tmp_path,
        own_ad=None,  # type: ignore[arg-type]
        policy=None,  # type: ignore[arg-type]
        preferences=Preferences,
        ledger=None,  # type: ignore[arg-type]
        publish_receipt=None,  # type: ignore[arg-type]
        publish_evidence=None,  # type: ignore[arg-type]
        unit_keys=UnitKeys(db, bytes(identity.signing_key)),
    )


@pytest.fixture
def ctx(tmp_path: Path) -> WorkContext:
    return _ctx(tmp_path)


def _lifecycle(ctx: WorkContext) -> tuple[Lifecycle, list[int]]:
    """The owner's lifecycle with the default modes (a woken engine is counted)."""
    woken: list[int] = []
    modes: dict[str, JobMode] = {}
    life = Lifecycle(ctx, lambda job: modes[job.mode if job else "single"])
    placement = Placement(ctx, life, Reputation(ctx.jobs.db))
    parts = OwnerParts(ctx, life, placement, None, None, lambda: woken.append(1))  # type: ignore[arg-type]
    modes.update({mode.name: mode for mode in (make(parts) for make in MODES)})
    return life, woken


def _job_with_unit(ctx: WorkContext, worker: str = WORKER):
    job = ctx.jobs.create("j", {"requirements": {"max_hours": 1.0}}, "auto", {}, [])
    unit = ctx.jobs.add_unit(job.id, worker, 30, deadline=time.time() + 3600)
    ctx.remember_unit_key(job.id, unit.unit_id, b"k" * 32)
    return job, unit


def test_transition_is_compare_and_set(ctx: WorkContext) -> None:
    job = ctx.jobs.create("j", {}, "auto", {}, [])
    assert ctx.jobs.transition(job.id, ("running",), state="completed") is None
    running = ctx.jobs.transition(job.id, ("queued",), "go", state="running")
    assert running is not None and running.state == "running"
    assert running.timeline[-1]["note"] == "go"
    # an update from a stale copy is refused instead of undoing the change
    with pytest.raises(StaleJob):
        ctx.jobs.update(job, state="failed")
    assert ctx.jobs.get(job.id).state == "running"


def test_writes_touch_only_the_named_columns(ctx: WorkContext) -> None:
    job = ctx.jobs.create("j", {}, "auto", {}, [])
    ctx.jobs.amend(job.id, ("queued",), reason="waiting")
    ctx.jobs.amend(job.id, ("queued",), progress={"step": 3})
    fresh = ctx.jobs.get(job.id)
    assert (fresh.reason, fresh.progress) == ("waiting", {"step": 3})
    with pytest.raises(ValueError, match="unknown job fields"):
        ctx.jobs.amend(job.id, ("queued",), nonsense=1)
    with pytest.raises(ValueError, match="unknown job fields"):
        ctx.jobs.transition(job.id, ("queued",), state="running", nonsense=1)


def test_two_results_for_one_unit_one_wins(ctx: WorkContext) -> None:
    _, unit = _job_with_unit(ctx)
    first = ctx.jobs.unit_transition(unit.unit_id, ("offered", "running"), state="verifying")
    second = ctx.jobs.unit_transition(unit.unit_id, ("offered", "running"), state="verifying")
    assert first is not None and first.state == "verifying"
    assert second is None


def test_lease_renewal_never_passes_the_deadline(ctx: WorkContext) -> None:
    job = ctx.jobs.create("j", {}, "auto", {}, [])
    deadline = time.time() + 10
    unit = ctx.jobs.add_unit(job.id, WORKER, 5, deadline=deadline)
    renewed = ctx.jobs.renew_lease(unit.unit_id, time.time() + 3600)
    assert renewed is not None and renewed.lease_expires == pytest.approx(deadline)
    ctx.jobs.unit_transition(unit.unit_id, ("offered",), state="expired")
    assert ctx.jobs.renew_lease(unit.unit_id, time.time() + 1) is None


def test_a_heartbeat_during_the_result_check_does_not_shorten_its_allowance(
    ctx: WorkContext,
) -> None:
    job = ctx.jobs.create("j", {}, "auto", {}, [])
    unit = ctx.jobs.add_unit(job.id, WORKER, 5, deadline=time.time() + 3600)
    checking_until = time.time() + 900
    ctx.jobs.unit_transition(
        unit.unit_id, ("offered",), state="verifying", lease_expires=checking_until
    )
    renewed = ctx.jobs.renew_lease(unit.unit_id, time.time() + 15)  # a late heartbeat
    assert renewed is not None and renewed.lease_expires == pytest.approx(checking_until)


def test_cancel_during_the_offer_stays_cancelled(ctx: WorkContext) -> None:
    life, _ = _lifecycle(ctx)
    job, unit = _job_with_unit(ctx)
    life.cancel(job.id)
    assert life.start(unit, "accepted") is None  # the worker's yes arrives too late
    assert ctx.jobs.get(job.id).state == "cancelled"
    assert ctx.jobs.unit(unit.unit_id).state == "cancelled"
    assert (job.id, unit.unit_id) not in ctx.grant_keys
    assert ctx.unit_keys.load() == {}


def test_cancel_during_the_weights_fetch_gives_no_completion(ctx: WorkContext) -> None:
    life, _ = _lifecycle(ctx)
    job, unit = _job_with_unit(ctx)
    life.start(unit, "accepted")
    ctx.jobs.unit_transition(unit.unit_id, ("running",), state="verifying")
    life.cancel(job.id)
    assert life.done(unit.unit_id, ("verifying",), "ab" * 32, {}, "claimed", "ok") is None
    fresh = ctx.jobs.get(job.id)
    assert (fresh.state, fresh.weights_sha256) == ("cancelled", "")


def test_an_expired_lease_during_the_offer_is_not_revived(ctx: WorkContext) -> None:
    life, woken = _lifecycle(ctx)
    job, unit = _job_with_unit(ctx)
    life.lost(unit.unit_id, "worker vanished", "expired")
    assert life.start(unit, "accepted") is None
    fresh = ctx.jobs.get(job.id)
    assert fresh.state == "queued" and WORKER in fresh.excluded
    assert woken


def test_a_lost_unit_requeues_until_the_attempts_run_out(ctx: WorkContext) -> None:
    life, _ = _lifecycle(ctx)
    job = ctx.jobs.create("j", {}, "auto", {}, [])
    for attempt in range(MAX_ATTEMPTS):
        unit = ctx.jobs.add_unit(job.id, f"{WORKER}{attempt}", 30, deadline=time.time() + 99)
        assert life.start(unit, "accepted") is not None
        life.lost(unit.unit_id, f"lost {attempt}")
    fresh = ctx.jobs.get(job.id)
    assert fresh.state == "failed" and fresh.attempts == MAX_ATTEMPTS
    assert "giving up" in fresh.timeline[-1]["note"]


def test_fatal_fails_the_job_once(ctx: WorkContext) -> None:
    life, _ = _lifecycle(ctx)
    job, unit = _job_with_unit(ctx)
    life.start(unit, "accepted")
    life.fatal(unit.unit_id, "spec broken")
    life.fatal(unit.unit_id, "again")  # a duplicate failure changes nothing
    fresh = ctx.jobs.get(job.id)
    assert (fresh.state, fresh.reason) == ("failed", "spec broken")


def test_a_transient_decline_leaves_no_unit_row(ctx: WorkContext) -> None:
    job, unit = _job_with_unit(ctx)
    assert ctx.jobs.forget_unit(unit.unit_id)
    assert ctx.jobs.units_of(job.id) == []
    started, _ = _job_with_unit(ctx)
    running = ctx.jobs.units_of(started.id)[0]
    ctx.jobs.unit_transition(running.unit_id, ("offered",), state="running")
    assert not ctx.jobs.forget_unit(running.unit_id)  # a unit that ran is history


def test_backoff_doubles_per_peer_and_is_capped() -> None:
    backoff = Backoff()
    now = 1000.0
    delays = [backoff.failed("job", "peer", now) for _ in range(10)]
    assert delays[:3] == [1.0, 2.0, 4.0] and max(delays) == BACKOFF_MAX_S
    assert backoff.waiting("job", now) == {"peer"}
    assert backoff.waiting("job", now + BACKOFF_MAX_S + 1) == set()
    backoff.succeeded("job", "peer")
    assert backoff.failed("job", "peer", now) == 1.0


def test_a_decline_for_now_holds_the_peer_for_every_job_a_shorter_while() -> None:
    backoff = Backoff()
    now = 1000.0
    for _ in range(10):
        backoff.failed("job", "peer", now)
    # another job waits too, but at most PEER_BACKOFF_MAX_S: busy is the peer's state
    assert backoff.waiting("other", now) == {"peer"} == backoff.busy(now)
    later = now + PEER_BACKOFF_MAX_S + 1
    assert backoff.waiting("other", later) == set()
    assert backoff.waiting("job", later) == {"peer"}
    # a unit of ours on it ended: it has room again, for every job but the one waiting
    backoff.failed("job", "peer", now)
    backoff.freed("peer")
    assert backoff.waiting("other", now) == set() and backoff.waiting("job", now) == {"peer"}


def test_offers_to_one_peer_take_turns() -> None:
    backoff = Backoff()
    held: list[str] = []

    async def offer(job: str) -> None:
        async with backoff.turn("peer"):
            held.append(f"{job} in")
            await trio.sleep(0.01)
            held.append(f"{job} out")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for job in ("a", "b", "c"):
                nursery.start_soon(offer, job)

    trio.run(main)
    # in whatever order trio runs them, one offer ends before the next begins
    assert sorted(held) == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert all(held[i + 1] == held[i].replace(" in", " out") for i in range(0, 6, 2)), held
    assert not backoff._turns  # no lock is kept for a peer nobody is asking


def test_unit_keys_are_sealed_at_rest(tmp_path: Path) -> None:
    seed = b"s" * 32
    ctx = _ctx(tmp_path, seed)
    key = b"K" * 32
    ctx.remember_unit_key("a" * 16, "b" * 16, key)
    raw = (tmp_path / "node.db").read_bytes()
    assert key not in raw
    assert UnitKeys(sqlite_utils.Database(tmp_path / "node.db"), seed).load() == {
        ("a" * 16, "b" * 16): key
    }
    stranger = UnitKeys(sqlite_utils.Database(tmp_path / "node.db"), b"x" * 32)
    assert stranger.load() == {}


def test_recovery_keeps_units_with_keys_and_loses_the_rest(tmp_path: Path) -> None:
    seed = b"r" * 32
    ctx = _ctx(tmp_path, seed)
    life, _ = _lifecycle(ctx)
    kept_job, kept = _job_with_unit(ctx)
    life.start(kept, "accepted")
    lost_job = ctx.jobs.create("j2", {}, "auto", {}, [])
    lost = ctx.jobs.add_unit(lost_job.id, WORKER, 30, deadline=time.time() + 99)
    life.start(lost, "accepted")  # no key remembered for this one
    # a restart: new context over the same node.db
    again = _ctx(tmp_path, seed)
    relife, _ = _lifecycle(again)
    Leases(again, relife, None).recover()  # type: ignore[arg-type]  (no heartbeats here)
    assert again.jobs.unit(kept.unit_id).state == "running"
    assert again.grant_keys[(kept_job.id, kept.unit_id)] == b"k" * 32
    assert again.jobs.get(kept_job.id).state == "running"
    assert again.jobs.unit(lost.unit_id).state == "expired"
    assert again.jobs.get(lost_job.id).state == "queued"


def test_unit_dir_refuses_anything_but_an_id(ctx: WorkContext) -> None:
    assert ctx.unit_dir("0123456789abcdef").name == "0123456789abcdef"
    for bad in ("../../etc", "/tmp/x", "abc\x00def0123456789", "A" * 16, "ab", "a" * 33):
        with pytest.raises(ValueError, match="not a unit id"):
            ctx.unit_dir(bad)


class _RelayedHost:
    """Stands in for a `MeshHost` that reaches one peer only through a relay, with no
    hole punch under way (a symmetric NAT; tests/netlab/ has the real one)."""

    class relay:  # noqa: N801 (the attribute MeshHost has)
        @staticmethod
        def punching(peer_id: str) -> bool:
            return False

        @staticmethod
        def remote_ips(peer_id: str) -> set[str]:
            return set()

    async def reach(self, peer_id: str) -> None:
        return None

    def path_to(self, peer_id: str) -> str:
        return "relayed"


def test_a_blob_over_the_jobs_relay_limit_is_not_fetched_through_a_relay(
    tmp_path: Path,
) -> None:
    ctx = dataclasses.replace(
        _ctx(tmp_path),
        host=_RelayedHost(),  # type: ignore[arg-type]
        peers=PeerTable(sqlite_utils.Database(memory=True), ttl_s=60),
        blobs=BlobStore(tmp_path),
    )
    grant = BlobGrant(
        job_id="j",
        unit_id="u",
        owner=WORKER,
        grantee=ctx.peer_id,
        blobs=["ab" * 32],
        max_bytes=40 << 20,
        expires_at=time.time() + 60,
        data_port=0,
    )

    async def fetch(relay_max_bytes: int) -> None:
        await fetch_granted(
            ctx, WORKER, grant, b"sealed grant", b"k" * 32, grant.blobs, grant.max_bytes,
            relay_max_bytes,
        )  # fmt: skip

    with pytest.raises(TransferError) as refused:
        trio.run(fetch, 16 << 20)
    assert refused.value.reason == "relayed"
    assert "at most 16 MiB of a blob (requirements.relay_blob_mb)" in str(refused.value)
    assert "40 MiB" in str(refused.value)
    assert not ctx.blobs.has(grant.blobs[0])


def test_the_owners_timeline_names_the_path_each_served_blob_took(ctx: WorkContext) -> None:
    data = "d" * 64
    job = ctx.jobs.create("j", {"requirements": {}}, "auto", {}, [data])
    unit = ctx.jobs.add_unit(job.id, WORKER, 30, deadline=time.time() + 3600)
    ctx.jobs.transition(job.id, ("queued",), state="running")
    grant = BlobGrant(job.id, unit.unit_id, ctx.peer_id, WORKER, [data], 3 << 20, 0.0, 0)
    life, _ = _lifecycle(ctx)
    for sha, path in ((data, "through a relay"), ("e" * 64, "direct channel")):
        note_served(ctx, life.mode_of, Authorized(grant, WORKER, sha, 3 << 20, b""), path)
    notes = [e["note"] for e in ctx.jobs.get(job.id).timeline]
    assert f"the data (3 MiB) fetched by {WORKER} (through a relay)" in notes
    assert f"blob {'e' * 12} (3 MiB) fetched by {WORKER} (direct channel)" in notes
    other = Authorized(dataclasses.replace(grant, job_id="elsewhere"), WORKER, data, 1, b"")
    note_served(ctx, life.mode_of, other, "direct channel")  # a job this node does not own
    assert len(ctx.jobs.get(job.id).timeline) == len(notes)


def test_a_node_db_with_the_old_receipts_column_keeps_its_receipts(tmp_path: Path) -> None:
    """`receipts.envelope` (its name before `cosigned`) is renamed in place."""
    db = sqlite_utils.Database(tmp_path / "node.db")
    db.execute(
        "CREATE TABLE receipts (unit_id TEXT PRIMARY KEY, job_id TEXT, role TEXT, "
        "owner TEXT, worker TEXT, envelope BLOB, issued_at FLOAT)"
    )
    db.execute("INSERT INTO receipts VALUES ('u1', 'j1', 'owner', 'o', 'w', ?, 1.0)", [b"signed"])
    db.conn.commit()
    jobs = JobStore(sqlite_utils.Database(tmp_path / "node.db"))
    assert jobs.receipt("u1") == b"signed"
    jobs.add_receipt("u2", "j1", "worker", "o", "w", b"co-signed")
    assert jobs.receipt("u2") == b"co-signed"
    again = sqlite_utils.Database(tmp_path / "node.db")
    assert "envelope" not in again["receipts"].columns_dict
    assert JobStore(again).receipt("u1") == b"signed"


def test_an_owner_past_its_daily_transfer_cap_keeps_its_job_queued(tmp_path: Path) -> None:
    """Its workers would fetch the job's data from it: the job waits, saying why, and
    is offered to nobody; the bytes counted survive a restart (node.db)."""
    ctx = _ctx(tmp_path)
    ctx.preferences = lambda: Preferences(daily_transfer_gb=1)
    ctx.transferred.add(2**30)  # moved by a transfer thread today
    life, _ = _lifecycle(ctx)
    placement = Placement(ctx, life, Reputation(ctx.jobs.db))
    job = ctx.jobs.create("j", {"requirements": {"max_hours": 1.0}}, "auto", {}, [])
    trio.run(placement.place, job.id, None)
    job = ctx.jobs.get(job.id)
    assert job.state == "queued" and ctx.jobs.units_of(job.id) == []
    assert job.reason == "waits: today's 1 GB of job data transfer are used"
    restarted = _ctx(tmp_path)
    assert restarted.transferred.today() == 2**30
