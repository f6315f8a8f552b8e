"""A rogue owner against a volunteer's eager elastic share: the round's weights it
names in its answers to the share's heartbeats are fetched only under a grant sealed
by that owner, for that job, unit and node and that one blob, and no larger than the
weights the worker holds plus 64 KiB (docs/threat-model.md).

The rogue owner is a libp2p host in this process, built from our own protocol
modules. It offers a real worker node round 1 of an elastic digits job, slot 0,
starting eagerly from round 0's weights and the slot's delta of round 0 (made here
by the runner's own elastic tasks), and answers each heartbeat with one hostile
variant after another, three heartbeats each: a grant signed by another key, for
another unit, another job, another node, two blobs, another blob than the one named,
and a blob over the size bound. Its blob server records every blob it is asked for
(before it checks them): none of the named weights is asked for, the worker
logs each refusal and stays up, and its runner waits. Then the honest answer: the
weights are fetched, the share takes them and sends its result.
"""

from __future__ import annotations

import secrets
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
from nacl.signing import SigningKey
from rogue import assert_alive, stored_blobs

import node.work.blobs.libp2p as blob_server
from node.demo.localnet import LocalNetwork, LocalNode, free_port
from node.identity import Identity
from node.net.host import MeshHost
from node.work.blobs import BlobStore, serve_blobs_libp2p
from node.work.taken_weights import SIZE_MARGIN
from protocol import encode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import REQUEST_LIMITS, BlobGrant, BlobRequest
from protocol.crypto import new_job_key, seal_to
from protocol.names import PROGRESS_PROTOCOL, RESULT_PROTOCOL, TASK_PROTOCOL
from protocol.rounds import RoundShare
from protocol.work import (
    WORK_LIMITS,
    OfferReply,
    Progress,
    ProgressAck,
    ReceiptReply,
    Result,
    WorkOffer,
    WorkPackage,
    encode_progress_ack,
)
from tests.elastic_tasks import run_task
from training.spec.examples import elastic_toml
from training.spec.job import parse_spec, spec_to_plain

pytestmark = pytest.mark.slow

HEARTBEATS_EACH = 3
UNCHECKED = "\n[trust]\ncheckpoints = 0\nspot_check_budget = 0\n"


def _record_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every blob a request to this process's blob servers names, before the server
    checks anything of it (a grant this server would refuse still counts)."""
    asked: list[str] = []
    authorize = blob_server.authorize

    def recording(request: bytes, **checks: Any) -> Any:
        asked.append(open_envelope(request, BlobRequest, limits=REQUEST_LIMITS).message.sha256)
        return authorize(request, **checks)

    monkeypatch.setattr(blob_server, "authorize", recording)
    return asked


def _spec(seed: int) -> dict[str, Any]:
    raw = tomllib.loads(
        elastic_toml("eager", workers=1, inner_steps=8, rounds=3, seed=seed) + UNCHECKED
    )
    return spec_to_plain(parse_spec(raw))


class RogueOwner:
    """Offers one eager share and answers its heartbeats from a schedule of acks."""

    def __init__(self, root: Path) -> None:
        self.identity = Identity(SigningKey.generate())
        self.stranger = Identity(SigningKey.generate())
        self.store = BlobStore(root / "rogue", durable=False)
        self.asked: list[str] = []  # the blobs requests named (`_record_requests`)
        self.job_id, self.unit_id = secrets.token_hex(8), secrets.token_hex(8)
        self.job_key = new_job_key()
        self.acks: list[tuple[str, ProgressAck]] = []  # (variant, ack), in order
        self.answered: dict[str, int] = {}  # variant -> heartbeats answered with it
        self.asked_before_honest: list[str] | None = None
        self.result: Result | None = None
        self.worker = ""  # its peer id, once `prepare` knows it

    @property
    def key(self) -> SigningKey:
        return self.identity.signing_key

    def grant(self, blobs: list[str], max_bytes: int, **changed: Any) -> bytes:
        fields = {
            "job_id": self.job_id,
            "unit_id": self.unit_id,
            "owner": self.identity.peer_id,
            "grantee": self.worker,
            "blobs": blobs,
            "max_bytes": max_bytes,
            "expires_at": time.time() + 3600,
        }
        signer = changed.pop("signer", self.key)
        return seal(BlobGrant(**(fields | changed)), signer)

    def prepare(self, root: Path, worker: str) -> None:
        """Round 0's weights and slot 0's delta of round 0 (the eager start), other
        weights of the same model (what the answers name), and a blob over the bound."""
        self.worker = worker
        self.spec = _spec(seed=0)
        init = run_task(root, self.spec, "init", "elastic_init", {})["folder"] / "out.bin"
        self.weights = self.store.put_file(init)
        share = run_task(
            root,
            self.spec,
            "r0s0",
            "elastic_inner",
            {self.weights: init},
            job_id=self.job_id,
            round=0,
            slot=0,
            weights=self.weights,
            state_out="state.safetensors",
        )
        self.delta = self.store.put_file(share["folder"] / "out.bin")
        other = run_task(root, _spec(seed=1), "other", "elastic_init", {})
        self.taken = self.store.put_file(other["folder"] / "out.bin")
        bound = self.store.size(self.weights) + SIZE_MARGIN
        self.oversized = self.store.put_bytes(secrets.token_bytes(bound + 1))

    def schedule(self) -> None:
        size = self.store.size(self.taken)
        named = {"weights_sha256": self.taken}
        stranger = self.stranger.signing_key

        def ack(grant: bytes, **fields: str) -> ProgressAck:
            return ProgressAck(True, **(named | fields), weights_grant=grant)

        self.acks = [
            ("another signer", ack(self.grant([self.taken], size, signer=stranger))),
            ("another unit", ack(self.grant([self.taken], size, unit_id=secrets.token_hex(8)))),
            ("another job", ack(self.grant([self.taken], size, job_id=secrets.token_hex(8)))),
            ("another node", ack(self.grant([self.taken], size, grantee=self.stranger.peer_id))),
            ("two blobs", ack(self.grant([self.taken, self.delta], size))),
            ("another blob", ack(self.grant([self.delta], size))),
            (
                "over the bound",
                ack(
                    self.grant([self.oversized], 1 << 30),
                    weights_sha256=self.oversized,
                ),
            ),
            ("honest", ack(self.grant([self.taken], size))),
        ]  # fmt: skip

    async def handle_progress(self, peer: str, data: bytes) -> bytes:
        open_envelope(data, Progress, expected_signer=peer, limits=WORK_LIMITS)
        done = {v for v, n in self.answered.items() if n >= HEARTBEATS_EACH} - {"honest"}
        variant, ack = next((v, a) for v, a in self.acks if v not in done)
        if variant == "honest" and self.asked_before_honest is None:
            self.asked_before_honest = list(self.asked)
        self.answered[variant] = self.answered.get(variant, 0) + 1
        return encode_progress_ack(ack)

    async def handle_result(self, peer: str, data: bytes) -> bytes:
        self.result = open_envelope(data, Result, expected_signer=peer, limits=WORK_LIMITS).message
        return seal(ReceiptReply(False, "this owner keeps no receipts", b""), self.key)

    def offer(self) -> WorkOffer:
        blobs = [self.weights, self.delta]
        size = max(self.store.size(sha) for sha in blobs)
        package = WorkPackage(
            self.job_id,
            self.unit_id,
            encode(self.spec),
            blobs,
            self.grant(blobs, size),
            self.job_key,
            1.0,
            15.0,
            RoundShare(1, 0, self.weights, start_delta_sha256=self.delta),
        )
        sealed = seal_to(public_key_from_peer_id(self.worker), self.key, seal(package, self.key))
        return WorkOffer(self.job_id, self.unit_id, self.worker, sealed, time.time())

    def job_key_for(self, job_id: str, unit_id: str) -> bytes | None:
        return self.job_key if job_id == self.job_id else None


async def _attack(rogue: RogueOwner, worker: LocalNode) -> None:
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(rogue.identity, listen) as host:
        host.serve(PROGRESS_PROTOCOL, rogue.handle_progress, WORK_LIMITS.max_bytes)
        host.serve(RESULT_PROTOCOL, rogue.handle_result, WORK_LIMITS.max_bytes)
        serve_blobs_libp2p(host, rogue.store, rogue.job_key_for)
        await host.connect(worker.multiaddr)
        offer = rogue.offer()
        raw = await host.request(
            worker.peer_id, TASK_PROTOCOL, seal(offer, rogue.key), WORK_LIMITS.max_bytes
        )
        reply = open_envelope(raw, OfferReply, expected_signer=worker.peer_id, limits=WORK_LIMITS)
        assert reply.message.accepted, reply.message.reason
        with trio.fail_after(180):
            while rogue.result is None:
                await trio.sleep(0.1)
        await assert_alive(worker)


def test_a_rogue_owner_cannot_make_an_eager_share_fetch_other_weights(
    localnet: LocalNetwork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = localnet.add()
    rogue = RogueOwner(tmp_path)
    rogue.asked = _record_requests(monkeypatch)
    rogue.prepare(tmp_path / "made", worker.peer_id)
    rogue.schedule()
    trio.run(_attack, rogue, worker)

    hostile = [variant for variant, _ in rogue.acks if variant != "honest"]
    assert all(rogue.answered.get(v) == HEARTBEATS_EACH for v in hostile), rogue.answered
    before = rogue.asked_before_honest
    assert before is not None
    assert rogue.taken not in before  # no grant but the honest one fetched the weights
    assert set(before) <= {rogue.weights, rogue.delta, rogue.oversized}, before
    assert rogue.oversized not in stored_blobs(worker)  # asked for, never kept
    # each refusal is logged with its reason (a heartbeat's answer that comes while the
    # last one's fetch is still refused is passed over, so not every answer gets a line)
    refusals = [
        line for line in worker.log_path.read_text(errors="replace").splitlines()
        if "the round's weights not fetched" in line
    ]  # fmt: skip
    signer = [line for line in refusals if f"but was sent by {rogue.identity.peer_id}" in line]
    other = [line for line in refusals if "is not for this share" in line]
    large = [line for line in refusals if f"blob {rogue.oversized}; at most" in line]
    assert signer and large and len(other) >= 5, worker.log_tail(60)
    assert len(signer) + len(other) + len(large) == len(refusals), refusals

    assert rogue.taken in rogue.asked  # the honest grant: fetched, and taken
    assert rogue.result is not None and rogue.result.ok, rogue.result
    assert rogue.result.steps == 8
