"""Cheating workers against a real owner node: each is caught by a spot check.

A cheat is a libp2p host in the test process (`rogue.RogueWorker`) that accepts a job,
"trains" it as `cheats` says (10% of the steps, none, another seed), commits to the
checkpoint chain that gives, and returns a signed result. The owner, a real node
process, must refuse it with a reason, record an `invalidated` ledger entry whose
evidence anyone can check, give no receipt, exclude the cheat, tell the network,
and get the job done by an honest node (a real process) with weights bitwise equal
to `train-local`.
"""

from __future__ import annotations

import sqlite3
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, closing
from pathlib import Path

import msgpack
import pytest
import trio
from cheats import Claim, honest, initial_weights, lazy, lazy_share, other_seed
from nacl.signing import SigningKey
from rogue import RogueWorker, api, query, running, until

from node.demo.localnet import LocalNetwork, LocalNode, wait_for
from node.identity import Identity
from node.work.blobs import BlobStore
from protocol import open_envelope, seal
from protocol.evidence import EVIDENCE_LIMITS, Evidence, claimed_result
from protocol.names import PROGRESS_PROTOCOL
from protocol.work import Progress, ReceiptReply, WorkPackage, decode_progress_ack
from training.elastic.rounds import init_weights
from training.model.weights import file_sha256
from training.run.execute import prepare, run_job
from training.run.local import train_local
from training.spec.examples import digits_toml, elastic_toml, sweep_toml
from training.spec.job import parse_spec

pytestmark = pytest.mark.slow

SPEC = digits_toml("cheat-target", steps=100, hidden=(16,), lr=3e-3, gpu="none")
CHEATS: dict[str, Callable[..., Claim]] = {
    "lazy (10% of the steps)": lazy,
    "initial weights": initial_weights,
    "another seed": other_seed,
}


def _ledger_rows(node: LocalNode, kind: str) -> list[tuple]:
    uri = f"file:{node.data_dir / 'ledger.db'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        sql = "select job_id, unit_id, worker, credit, payload from entries where kind = ?"
        return db.execute(sql, (kind,)).fetchall()


@asynccontextmanager
async def _rogue(owner: LocalNode, root: Path) -> AsyncIterator[RogueWorker]:
    """A rogue worker listed by `owner`, claiming the owner's determinism class (so
    its results are checked bitwise); it accepts every offer while the block runs."""
    rogue = RogueWorker(Identity(SigningKey.generate()), BlobStore(root, durable=False))
    rogue.determinism = owner.get("/api/v1/status")["capacity"]["determinism"]
    async with running(rogue, owner):
        yield rogue


async def _claim(
    rogue: RogueWorker, owner: LocalNode, package: WorkPackage, claim: Claim
) -> ReceiptReply:
    """Send the result `claim` makes, signed by the rogue; the owner's answer."""
    weights = rogue.store.put_file(claim.weights)
    checkpoints = [rogue.store.put_file(path) for path in claim.checkpoints]
    size = claim.weights.stat().st_size
    result = rogue.result(package, owner.peer_id, weights, size, checkpoints)
    return await rogue.send_result(owner, seal(result, rogue.key))


async def _cheat(owner: LocalNode, honest: LocalNode, root: Path) -> list[str]:
    """One rogue takes a job per cheat (it ranks above the honest node), cheats on
    each its own way, and sends the three results at once; the job ids, once
    everything about each catch is asserted."""
    spec = parse_spec(tomllib.loads(SPEC))
    caught = []
    async with _rogue(owner, root / "rogue") as rogue:
        jobs = [await trio.to_thread.run_sync(owner.submit_spec, SPEC) for _ in CHEATS]
        packages = [(await _offered([rogue], job))[0] for job in jobs]

        # one after another: training seeds and flags torch's process-wide state
        claims = await trio.to_thread.run_sync(
            lambda: [cheat(spec, root / name) for name, cheat in CHEATS.items()]
        )

        async def play(package: WorkPackage, claim: Claim) -> None:
            caught.append((package, await _claim(rogue, owner, package, claim), claim))

        async with trio.open_nursery() as nursery:
            for package, claim in zip(packages, claims, strict=True):
                nursery.start_soon(play, package, claim)
    for package, reply, claim in caught:
        await _assert_caught(owner, honest, rogue, package, reply, claim)
    return jobs


async def _assert_caught(
    owner: LocalNode,
    honest: LocalNode,
    rogue: RogueWorker,
    package: WorkPackage,
    reply: ReceiptReply,
    claim: Claim,
) -> None:
    assert not reply.accepted and reply.receipt == b"", reply
    assert "spot check failed" in reply.reason, reply.reason
    job_id = package.job_id
    unit_id = package.unit_id
    assert query(owner, "select count(*) from receipts where unit_id = ?", unit_id) == [(0,)]
    (entry,) = [r for r in _ledger_rows(owner, "invalidated") if r[1] == package.unit_id]
    assert entry[:4] == (job_id, package.unit_id, rogue.peer_id, 0.0)
    payload = msgpack.unpackb(entry[4])
    evidence = open_envelope(
        payload["evidence"], Evidence, expected_signer=owner.peer_id, limits=EVIDENCE_LIMITS
    ).message
    weights = file_sha256(claim.weights)
    assert claimed_result(evidence).weights_sha256 == weights  # the cheat's own signed claim
    assert evidence.worker == rogue.peer_id
    (rep,) = [r for r in await api(owner, "/api/v1/reputation") if r["peer"] == rogue.peer_id]
    assert rep["invalid"] >= 1 and rep["streak"] == 0 and not rep["trusted"], rep
    assert rep["excluded_until"] > time.time() + 3600 and rep["last_reason"], rep
    await until(
        lambda: query(honest, "select reports from reputation where peer = ?", rogue.peer_id),
        20,
        "the honest node to hear the evidence on gossip",
    )
    job = await api(owner, f"/api/v1/jobs/{job_id}")
    assert job["weights_sha256"] != weights
    assert rogue.peer_id in " ".join(e["note"] for e in job["timeline"])


def test_cheats_are_caught_and_the_jobs_complete_with_honest_weights(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    honest = localnet.add([])
    localnet.wait_all_see_each_other(timeout=20)

    job_ids = trio.run(_cheat, owner, honest, tmp_path)
    local = run_job(parse_spec(tomllib.loads(SPEC)), None, tmp_path / "local.safetensors")
    for job_id in job_ids:
        job = owner.wait_job_end(job_id, 180)
        assert job["state"] == "completed", job["reason"]
        assert job["worker"] == honest.peer_id
        assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
        assert job["metrics_status"] == "verified"
        assert job["metrics"]["val_loss"] == pytest.approx(local["metrics"]["val_loss"])
    work = query(owner, "select count(*) from receipts where role = 'owner'")[0][0]
    assert work >= len(CHEATS)  # the honest worker's receipts, and only those
    credited = {row[2] for row in _ledger_rows(owner, "work_received")}
    assert credited == {honest.peer_id}


def _replica_spec(name: str, trust: str) -> str:
    extra = f"\n[trust]\nreplicas = 2\n{trust}"
    return digits_toml(name, steps=100, hidden=(16,), lr=3e-3, gpu="none", extra=extra)


async def _offered(rogues: list[RogueWorker], job_id: str) -> list[WorkPackage]:
    with trio.fail_after(30):
        while not all(job_id in r.packages for r in rogues):
            await trio.sleep(0.05)
    return [r.packages[job_id] for r in rogues]


def test_replicas_colluding_with_one_fake_are_each_caught_and_a_liar_is_found_by_bisection(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """`trust.replicas = 2`. Two colluders return the same fake (their initial weights):
    each is caught by its own spot check, agreement proves nothing. A lazy worker
    paired with an honest one, with spot checks off: the chains part, the owner
    replays the first segment they disagree on, and only the liar is caught."""
    owner = localnet.add(["--not-accepting"])
    honest = localnet.add_many(2, [])
    localnet.wait_all_see_each_other(timeout=20)
    colluded = _replica_spec("replicas", "")
    bisected = _replica_spec("bisected", "spot_check_budget = 0\n")

    async def play() -> tuple[str, str]:
        async with _rogue(owner, tmp_path / "a") as a, _rogue(owner, tmp_path / "b") as b:
            job = await trio.to_thread.run_sync(owner.submit_spec, colluded)
            packages = await _offered([a, b], job)
            spec = parse_spec(tomllib.loads(colluded))
            fake = await trio.to_thread.run_sync(initial_weights, spec, tmp_path / "fake")
            replies = {}
            async with trio.open_nursery() as both:
                for rogue, package in zip((a, b), packages, strict=True):

                    async def send(rogue: RogueWorker = rogue, package: WorkPackage = package):
                        replies[rogue.peer_id] = await _claim(rogue, owner, package, fake)

                    both.start_soon(send)
        for rogue, package in zip((a, b), packages, strict=True):
            await _assert_caught(owner, honest[0], rogue, package, replies[rogue.peer_id], fake)

        async with _rogue(owner, tmp_path / "c") as liar:
            other = await trio.to_thread.run_sync(owner.submit_spec, bisected)
            (package,) = await _offered([liar], other)
            spec = parse_spec(tomllib.loads(bisected))
            claim = await trio.to_thread.run_sync(lazy, spec, tmp_path / "lazy")
            reply = await _claim(liar, owner, package, claim)
        await _assert_caught(owner, honest[0], liar, package, reply, claim)
        assert "replica disagreed" in reply.reason, reply.reason
        return job, other

    job_ids = trio.run(play)
    for job_id, spec in zip(job_ids, (colluded, bisected), strict=True):
        local = run_job(parse_spec(tomllib.loads(spec)), None, tmp_path / f"{job_id}.safetensors")
        job = owner.wait_job_end(job_id, 120)
        assert job["state"] == "completed", job["reason"]
        assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
    sql = "select job_id, worker from receipts where role = 'owner'"
    pair = {n.peer_id for n in honest}
    settled = wait_for(
        lambda: (
            (rows := query(owner, sql)) and {w for j, w in rows if j == job_ids[0]} == pair and rows
        ),
        10,
        "both honest replicas' receipts",
    )
    assert len({w for j, w in settled if j == job_ids[1]}) == 1  # the honest half of the pair


def test_a_trial_that_reports_false_validation_values_is_caught(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """A sweep trial's worker trains honestly but reports a better `val_loss` at its
    first report than the state it committed to gives: the owner evaluates the state
    at a reported step (always at least one), and refuses the result."""
    owner = localnet.add(["--not-accepting"])
    sweep = sweep_toml("reports", trials=1, parallel=1, steps=60, report_every=20)

    async def play() -> tuple[RogueWorker, WorkPackage, ReceiptReply, Claim]:
        async with _rogue(owner, tmp_path / "r") as rogue:
            job = await trio.to_thread.run_sync(owner.submit_spec, sweep)
            (package,) = await _offered([rogue], job)
            spec = parse_spec(msgpack.unpackb(package.spec))
            claim = await trio.to_thread.run_sync(honest, spec, tmp_path / "trial")
            assert rogue.host is not None
            beat = Progress(
                job,
                package.unit_id,
                "training",
                20,
                60,
                0.5,
                100.0,
                1280,
                time.time(),
                val_loss=0.001,
                val_step=20,
            )
            raw = await rogue.host.request(
                owner.peer_id, PROGRESS_PROTOCOL, seal(beat, rogue.key), 4096
            )
            assert decode_progress_ack(raw).ok
            await until(
                lambda: owner.get(f"/api/v1/jobs/{job}")["trials"][0]["reports"], 10, "the report"
            )
            reply = await _claim(rogue, owner, package, claim)
        return rogue, package, reply, claim

    rogue, package, reply, claim = trio.run(play)
    assert not reply.accepted and "reported val_loss 0.001 at step 20" in reply.reason, reply
    (rep,) = [r for r in owner.get("/api/v1/reputation") if r["peer"] == rogue.peer_id]
    assert rep["invalid"] == 1 and rep["excluded_until"] > time.time() + 3600, rep
    unit_id = package.unit_id
    assert query(owner, "select count(*) from receipts where unit_id = ?", unit_id) == [(0,)]
    rejected = [r for r in _ledger_rows(owner, "rejected") if r[1] == unit_id]
    assert rejected and rejected[0][2] == rogue.peer_id  # no evidence: the report was a heartbeat


def test_a_lazy_share_of_an_elastic_round_is_caught_and_the_round_ends_honest(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """A round's share is checked before its delta joins the round, when one of its
    segments is drawn (every one here, at a budget of 1): a worker that trains 10% of
    its H steps is caught (its chain does not replay), and its slot is trained again
    by an honest node; the job's weights are bitwise `train-local`'s."""
    owner = localnet.add(["--not-accepting"])
    honest = localnet.add([])
    localnet.wait_all_see_each_other(timeout=20)
    every = "\n[trust]\nspot_check_budget = 1.0\n"
    elastic = elastic_toml(
        "lazy-share", workers=2, min_workers=2, inner_steps=30, rounds=1, extra=every
    )
    spec = parse_spec(tomllib.loads(elastic))

    async def play() -> tuple[str, RogueWorker, WorkPackage, ReceiptReply, Claim]:
        async with _rogue(owner, tmp_path / "r") as rogue:
            job = await trio.to_thread.run_sync(owner.submit_spec, elastic)
            (package,) = await _offered([rogue], job)
            share = package.round_share
            assert share is not None
            start = tmp_path / "global-0.safetensors"  # round 0's weights come from the seed
            built = await trio.to_thread.run_sync(
                lambda: init_weights(prepare(spec, None, "cpu"), start)
            )
            assert built == share.weights_sha256
            claim = await trio.to_thread.run_sync(
                lambda: lazy_share(spec, tmp_path / "lazy", job, 0, share.slot, start)
            )
            reply = await _claim(rogue, owner, package, claim)
        await _assert_caught(owner, honest, rogue, package, reply, claim)
        return job, rogue, package, reply, claim

    job_id, rogue, package, reply, claim = trio.run(play)
    assert "do not give checkpoint" in reply.reason, reply.reason
    local = train_local(spec, tmp_path / "local.safetensors")
    job = owner.wait_job_end(job_id, 180)
    assert job["state"] == "completed", job["reason"]
    assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
    (closed,) = job["rounds"]
    assert closed["workers"] == [honest.peer_id, honest.peer_id], closed
    credited = {row[2] for row in _ledger_rows(owner, "work_received")}
    assert credited == {honest.peer_id}


def test_a_worker_that_commits_then_discards_its_states_gets_nothing(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """A lazy worker commits to its chain in a heartbeat as an honest one does, then
    deletes every state but the last (the owner asked it to keep some) and bluffs
    with a result that still names them all: the owner cannot replay what it drew,
    so the result is refused (a `rejected` entry), with no receipt and no credit."""
    owner = localnet.add(["--not-accepting"])
    spec = parse_spec(tomllib.loads(SPEC))

    async def play() -> tuple[RogueWorker, WorkPackage, ReceiptReply, list[int]]:
        async with _rogue(owner, tmp_path / "r") as rogue:
            job = await trio.to_thread.run_sync(owner.submit_spec, SPEC)
            (package,) = await _offered([rogue], job)
            claim = await trio.to_thread.run_sync(lazy, spec, tmp_path / "lazy")
            shas = [file_sha256(path) for path in claim.checkpoints]
            beat = Progress(
                job, package.unit_id, "training", 100, 100, 0.5, 100.0, 6400, time.time(),
                commit_from=0, commitments=shas,
            )  # fmt: skip
            assert rogue.host is not None
            raw = await rogue.host.request(
                owner.peer_id, PROGRESS_PROTOCOL, seal(beat, rogue.key), 64 * 1024
            )
            ack = decode_progress_ack(raw)
            assert ack.ok and ack.have == len(shas), ack
            weights = rogue.store.put_file(claim.weights)
            kept = [rogue.store.put_file(path) for path in claim.checkpoints]
            size = claim.weights.stat().st_size
            result = rogue.result(package, owner.peer_id, weights, size, kept)
            for sha in set(kept[:-1]) - {kept[-1]}:  # "deleted as the owner drew"
                rogue.store.remove(sha)
            reply = await rogue.send_result(owner, seal(result, rogue.key))
        return rogue, package, reply, list(ack.keep)

    rogue, package, reply, keep = trio.run(play)
    assert keep, "the owner drew no segment of 100 at 10% (p = 0.9^100)"
    assert not reply.accepted and reply.receipt == b"", reply
    assert query(owner, "select count(*) from receipts where unit_id = ?", package.unit_id) == [
        (0,)
    ]
    rows = [r for r in _ledger_rows(owner, "rejected") if r[1] == package.unit_id]
    assert rows and rows[0][2:4] == (rogue.peer_id, 0.0), rows
