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
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import msgpack
import pytest
import trio
from cheats import Claim, initial_weights, lazy, other_seed
from nacl.signing import SigningKey
from rogue import RogueWorker, api, query, submit_and_accept, until

from node.identity import Identity
from node.localnet import LocalNetwork, LocalNode, free_port
from node.net.host import MeshHost
from node.work.blobs import BlobStore
from node.work.transfer import serve_blobs_libp2p
from protocol import open_envelope, seal
from protocol.evidence import EVIDENCE_LIMITS, Evidence, claimed_result
from protocol.names import ADS_PROTOCOL, CAPACITY_TOPIC, TASK_PROTOCOL
from protocol.work import WORK_LIMITS
from training.examples import digits_toml
from training.execute import run_job
from training.spec import parse_spec

pytestmark = pytest.mark.slow

SPEC = digits_toml("cheat-target", steps=200, hidden=(16,), lr=3e-3, gpu="none")
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


async def _cheat_once(owner: LocalNode, honest: LocalNode, name: str, root: Path) -> str:
    """One cheat plays one job; returns the job id once everything about the catch
    is asserted."""
    rogue = RogueWorker(Identity(SigningKey.generate()), BlobStore(root / name, durable=False))
    rogue.determinism = owner.get("/api/v1/status")["capacity"]["determinism"]  # strict checks
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(rogue.identity, listen) as host, trio.open_nursery() as nursery:
        rogue.host = host
        host.serve(ADS_PROTOCOL, rogue.serve_table, max_request=64)
        host.serve(TASK_PROTOCOL, rogue.handle_offer, WORK_LIMITS.max_bytes)
        serve_blobs_libp2p(host, rogue.store, rogue.job_key)
        await host.subscribe(CAPACITY_TOPIC, lambda sender, data: True)
        await host.connect(owner.multiaddr)
        nursery.start_soon(rogue.publish_ads)
        await until(lambda: rogue.peer_id in owner.peer_ids(), 15, "the owner to list the cheat")

        package = await submit_and_accept(owner, rogue, name, SPEC)
        spec = parse_spec(tomllib.loads(SPEC))
        claim = await trio.to_thread.run_sync(CHEATS[name], spec, root / name / "work")
        weights = rogue.store.put_file(claim.weights)
        checkpoints = [rogue.store.put_file(path) for path in claim.checkpoints]
        result = rogue.result(
            package, owner.peer_id, weights, claim.weights.stat().st_size, checkpoints
        )
        envelope = seal(result, rogue.key)
        reply = await rogue.send_result(owner, envelope)
        nursery.cancel_scope.cancel()

    assert not reply.accepted and reply.receipt == b"", reply
    assert "spot check failed" in reply.reason, reply.reason
    job_id = package.job_id
    assert query(owner, "select count(*) from receipts where job_id = ?", job_id) == [(0,)]
    (entry,) = [r for r in _ledger_rows(owner, "invalidated") if r[1] == package.unit_id]
    assert entry[:4] == (job_id, package.unit_id, rogue.peer_id, 0.0)
    payload = msgpack.unpackb(entry[4])
    evidence = open_envelope(
        payload["evidence"], Evidence, expected_signer=owner.peer_id, limits=EVIDENCE_LIMITS
    ).message
    assert claimed_result(evidence).weights_sha256 == weights  # the cheat's own signed claim
    assert evidence.worker == rogue.peer_id
    sql = "select invalid, streak, excluded_until from reputation where peer = ?"
    (rep,) = query(owner, sql, rogue.peer_id)
    assert rep[0] == 1 and rep[1] == 0 and rep[2] > time.time() + 3600, rep
    await until(
        lambda: query(honest, "select reports from reputation where peer = ?", rogue.peer_id),
        20,
        "the honest node to hear the evidence on gossip",
    )
    job = await api(owner, f"/api/v1/jobs/{job_id}")
    assert job["state"] != "completed" and rogue.peer_id in " ".join(
        e["note"] for e in job["timeline"]
    )
    return job_id


def test_cheats_are_caught_and_the_jobs_complete_with_honest_weights(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    honest = localnet.add([])
    localnet.wait_all_see_each_other(timeout=20)

    async def play() -> list[str]:
        return [await _cheat_once(owner, honest, name, tmp_path) for name in CHEATS]

    job_ids = trio.run(play)
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
