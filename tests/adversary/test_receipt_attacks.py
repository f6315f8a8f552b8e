"""Receipts from hostile peers: forged, altered, relayed by a stranger, or garbage, on
the receipts topic and on the owner's receipt stream. None changes a ledger or an audit
table; each gossip rejection is counted under its reason; the nodes keep running."""

from __future__ import annotations

import os
from functools import partial

import pytest
import trio
from factories import rejections
from nacl.signing import SigningKey

from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, free_port, wait_for
from node.identity import Identity
from node.net.host import MeshHost
from protocol import decode
from protocol.names import RECEIPT_PROTOCOL, RECEIPTS_TOPIC
from protocol.receipts import CoSignedReceipt, parse_cosigned
from protocol.work import decode_ack
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow

SPEC = digits_toml("receipt-target", steps=10, hidden=(8,))


def _rejections(node: LocalNode) -> dict[str, float]:
    return rejections(node.api, "meshminer_receipts_rejected")


def _counted_all(node: LocalNode) -> bool:
    seen = _rejections(node)
    return (
        seen.get("bad_signature", 0) >= 2
        and seen.get("signer_mismatch", 0) >= 1
        and seen.get("malformed", 0) >= 1
        and seen.get("oversized", 0) >= 1
    )


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 1]) + data[index + 1 :]


async def _attack(owner: LocalNode, auditor: LocalNode, genuine: bytes) -> str:
    parsed = parse_cosigned(genuine)
    forged_sig = CoSignedReceipt(
        parsed.receipt, parsed.credit, parsed.owner_sig, _flip(parsed.worker_sig, 5)
    ).to_bytes()
    inflated = CoSignedReceipt(
        parsed.receipt, parsed.credit * 10, parsed.owner_sig, parsed.worker_sig
    ).to_bytes()
    identity = Identity(SigningKey.generate())
    async with MeshHost.start(identity, f"/ip4/127.0.0.1/tcp/{free_port()}") as host:
        for node in (owner, auditor):
            await host.connect(node.multiaddr)
        with trio.fail_after(15):
            while host.topic_peers(RECEIPTS_TOPIC) < 2:
                await trio.sleep(0.1)
        for data in (forged_sig, inflated, genuine, b"\xc1" * 64, os.urandom(20_000)):
            await host.publish(RECEIPTS_TOPIC, data)
        # the owner's receipt stream: a stranger hands in someone else's receipt
        raw = await host.request(owner.peer_id, RECEIPT_PROTOCOL, genuine, 4096)
        ok, reason = decode_ack(raw)
        assert not ok
        # the host stays up until both have read everything (a closed host drops
        # what it has not yet written)
        await trio.to_thread.run_sync(
            partial(wait_for, lambda: all(_counted_all(n) for n in (owner, auditor)), 30,
                    "every rejection to be counted")
        )  # fmt: skip
        return reason


def test_hostile_receipts_change_nothing(localnet: LocalNetwork) -> None:
    owner = localnet.add(["--not-accepting"])
    worker = localnet.add()
    auditor = localnet.add(["--not-accepting"])  # a third party: it only audits
    localnet.wait_all_see_each_other(timeout=20)
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": SPEC})
    job = wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job['id']}"))["state"] in ("completed", "failed") and j
        ),
        120,
        "the job to finish",
    )
    assert job["state"] == "completed", job["reason"]

    def audited(node: LocalNode) -> dict:
        return node.get("/api/v1/ledger/balances")["network"]

    wait_for(lambda: audited(auditor), 30, "the genuine receipt on the auditor")
    entries = {n.name: n.get("/api/v1/ledger")["entries"] for n in (owner, worker, auditor)}
    audit_before = {n.name: audited(n) for n in (owner, auditor)}
    genuine = bytes.fromhex(
        next(e for e in entries[owner.name] if e["kind"] == "work_received")["payload"]
    )
    assert decode(genuine)  # it is the co-signed receipt, as stored

    reason = trio.run(_attack, owner, auditor, genuine)
    assert "names other peers" in reason

    for node in (owner, worker, auditor):
        assert node.proc is not None and node.proc.poll() is None
        assert node.get("/api/v1/ledger")["entries"] == entries[node.name]
        assert node.get("/api/v1/ledger/verify")["ok"]
    for node in (owner, auditor):
        assert audited(node) == audit_before[node.name]
        assert node.get("/api/v1/ledger/balances")["conflicts"] == []
