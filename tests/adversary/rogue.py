"""A rogue worker for the adversary tests: a real libp2p host built from our own
protocol modules, which advertises itself, accepts every offer, and answers with
whatever results a test makes it send."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass, field
from typing import Any

import trio
from factories import capacity_ad
from nacl.signing import SigningKey

from node.client import request_json
from node.demo.localnet import LocalNode, free_port
from node.identity import Identity
from node.net.host import MeshHost
from node.work.blobs import BlobStore, serve_blobs_libp2p
from protocol import encode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import BlobGrant
from protocol.crypto import open_from
from protocol.names import (
    ADS_PROTOCOL,
    CAPACITY_TOPIC,
    PROBE_PROTOCOL,
    RESULT_PROTOCOL,
    TASK_PROTOCOL,
)
from protocol.work import WORK_LIMITS, OfferReply, ReceiptReply, Result, WorkOffer, WorkPackage
from training.spec.examples import digits_toml


async def api(node: LocalNode, path: str) -> Any:
    return await trio.to_thread.run_sync(node.get, path)


async def until(condition: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    """Await `condition()` (sync, run in a thread) until truthy; fails naming `what`."""
    deadline = trio.current_time() + timeout
    while True:
        value = await trio.to_thread.run_sync(condition)
        if value:
            return value
        if trio.current_time() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await trio.sleep(interval)


def query(node: LocalNode, sql: str, *args: Any) -> list[tuple]:
    """Read the node's node.db (read-only, beside the running node)."""
    uri = f"file:{node.data_dir / 'node.db'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        return db.execute(sql, args).fetchall()


@dataclass
class RogueWorker:
    """Advertises itself, accepts every offer, serves whatever weights it is told to."""

    identity: Identity
    store: BlobStore
    host: MeshHost | None = None
    packages: dict[str, WorkPackage] = field(default_factory=dict)  # by job id
    seq: int = 0

    @property
    def key(self) -> SigningKey:
        return self.identity.signing_key

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    determinism: str = ""  # the class its ads claim

    def ad(self) -> bytes:
        assert self.host is not None
        self.seq += 1
        ad = capacity_ad(
            self.peer_id, self.seq, addrs=self.host.addrs(), determinism=self.determinism
        )
        return seal(ad, self.key)

    async def serve_table(self, peer: str, request: bytes) -> bytes:
        return encode([self.ad()])

    async def serve_probe(self, peer: str, request: bytes) -> bytes:
        return self.ad()

    async def publish_ads(self) -> None:
        assert self.host is not None
        while True:
            await self.host.publish(CAPACITY_TOPIC, self.ad())
            await trio.sleep(0.5)

    async def handle_offer(self, peer: str, data: bytes) -> bytes:
        offer = open_envelope(data, WorkOffer, expected_signer=peer, limits=WORK_LIMITS).message
        inner = open_from(public_key_from_peer_id(peer), self.key, offer.sealed)
        package = open_envelope(
            inner, WorkPackage, expected_signer=peer, limits=WORK_LIMITS
        ).message
        assert offer.worker == self.peer_id
        assert (package.job_id, package.unit_id) == (offer.job_id, offer.unit_id)
        self.packages[package.job_id] = package
        return seal(OfferReply(package.job_id, package.unit_id, True, ""), self.key)

    def job_key(self, job_id: str, unit_id: str) -> bytes | None:
        package = self.packages.get(job_id)
        return package.job_key if package and package.unit_id == unit_id else None

    def serve(self, data: bytes, under: str | None = None) -> tuple[str, int]:
        """Store `data` for the blob server, under its own sha256 or the name `under`."""
        if under is None:
            return self.store.put_bytes(data), len(data)
        path = self.store.location(under)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return under, len(data)

    def result(
        self,
        package: WorkPackage,
        owner: str,
        sha: str,
        size: int,
        checkpoints: list[str] | None = None,
    ) -> Result:
        grant = BlobGrant(
            job_id=package.job_id,
            unit_id=package.unit_id,
            owner=self.peer_id,
            grantee=owner,
            blobs=[sha, *(checkpoints or [])],
            max_bytes=max([size, *(self.store.size(c) for c in checkpoints or [])]),
            expires_at=time.time() + 3600,
        )
        return Result(
            job_id=package.job_id,
            unit_id=package.unit_id,
            ok=True,
            error="",
            weights_sha256=sha,
            weights_size=size,
            weights_grant=seal(grant, self.key),
            metrics={"val_accuracy": 0.99, "val_loss": 0.01},
            steps=20,
            samples=1280,
            wall_time_s=1.0,
            device="cpu",
            checkpoints=list(checkpoints or []),
        )

    async def send_result(self, owner: LocalNode, envelope: bytes) -> ReceiptReply:
        assert self.host is not None
        raw = await self.host.request(
            owner.peer_id, RESULT_PROTOCOL, envelope, WORK_LIMITS.max_bytes, timeout=60
        )
        return open_envelope(
            raw, ReceiptReply, expected_signer=owner.peer_id, limits=WORK_LIMITS
        ).message


def unchecked_digits_toml(name: str, steps: int = 20) -> str:
    """A small digits job whose results are not spot-checked: these tests are about
    what the owner refuses before any replay (format, transport, timing)."""
    trust = "\n[trust]\ncheckpoints = 0\nspot_check_budget = 0\n"
    return digits_toml(name, steps=steps, hidden=(16,), lr=3e-3, gpu="none", extra=trust)


async def submit_and_accept(
    owner: LocalNode, rogue: RogueWorker, name: str, spec: str | None = None
) -> WorkPackage:
    """Submit a job (`spec` TOML; a small digits job by default) to `owner`; returns
    the package once the rogue holds it and the owner has recorded the acceptance."""
    body = {"spec": spec or unchecked_digits_toml(name)}
    job = await trio.to_thread.run_sync(
        lambda: request_json(owner.api, "POST", "/api/v1/jobs", body)
    )
    job_id = job["id"]
    with trio.fail_after(20):
        while job_id not in rogue.packages:
            await trio.sleep(0.05)
    package = rogue.packages[job_id]
    await until(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job_id}"))["state"] == "running"
            and j["unit_id"] == package.unit_id
        ),
        10,
        f"the owner to record that {name} was accepted",
    )
    return package


def receipt_rows(node: LocalNode, job_id: str) -> list[tuple]:
    return query(node, "select unit_id, role from receipts where job_id = ?", job_id)


def receipt_count(node: LocalNode) -> int:
    return query(node, "select count(*) from receipts")[0][0]


def stored_blobs(node: LocalNode) -> set[str]:
    """Every file under the node's blob store, temporary ones included (names only)."""
    root = node.data_dir / "blobs"
    return {p.name for p in root.rglob("*") if p.is_file()} if root.exists() else set()


async def assert_alive(node: LocalNode) -> dict[str, Any]:
    assert node.proc is not None and node.proc.poll() is None, f"{node.name} died"
    status = await api(node, "/api/v1/status")
    assert status["peer_id"] == node.peer_id
    return status


@asynccontextmanager
async def running(rogue: RogueWorker, owner: LocalNode) -> AsyncIterator[MeshHost]:
    """The rogue's libp2p host, serving ads, offers and blobs, connected to `owner`
    and listed by it; it publishes its ad while the block runs."""
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(rogue.identity, listen) as host, trio.open_nursery() as nursery:
        rogue.host = host
        host.serve(ADS_PROTOCOL, rogue.serve_table, max_request=64)
        host.serve(PROBE_PROTOCOL, rogue.serve_probe, max_request=64)
        host.serve(TASK_PROTOCOL, rogue.handle_offer, WORK_LIMITS.max_bytes)
        serve_blobs_libp2p(host, rogue.store, rogue.job_key)
        await host.subscribe(CAPACITY_TOPIC, lambda sender, data: True)
        await host.connect(owner.multiaddr)
        nursery.start_soon(rogue.publish_ads)
        await until(lambda: rogue.peer_id in owner.peer_ids(), 15, "the owner to list the rogue")
        yield host
        nursery.cancel_scope.cancel()
