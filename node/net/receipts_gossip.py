"""Receipt gossip on `meshminer/receipts/1`: every node audits the network's credit.

A co-signed receipt authenticates itself (owner and worker both signed it), so it is
published bare. The validator checks, before GossipSub delivers or forwards it, its
size, its encoding, both signatures, and that the publisher is the receipt's owner or
worker. Accepted receipts land in the audit table, where two receipts that disagree
about one unit are flagged as a conflict.

Every receipt costs every subscriber about what an ad does (9 ms of CPU), so in a
large network, where ads go to directories only, so do receipts: a node other than
a directory leaves the topic while `audits()` says no, and keeps only its own
receipts. Publishing still works then (GossipSub's fanout reaches the directories,
which stay subscribed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ledger.audit import AuditLog
from node.metrics import NodeMetrics
from node.net.host import MeshHost
from protocol import MeshminerError, ProtocolError, TooLarge
from protocol.names import RECEIPTS_TOPIC
from protocol.receipts import COSIGNED_LIMITS, open_cosigned

log = logging.getLogger(__name__)

REJECT_REASONS = ("oversized", "malformed", "bad_signature", "signer_mismatch")
AUDIT_CHECK_S = 5.0


class PublisherMismatch(ProtocolError):
    """The receipt was published by a peer that is neither its owner nor its worker."""

    reason = "signer_mismatch"


def check_receipt(data: bytes, sender: str) -> None:
    if len(data) > COSIGNED_LIMITS.max_bytes:
        raise TooLarge(f"receipt of {len(data)} bytes exceeds {COSIGNED_LIMITS.max_bytes}")
    verified = open_cosigned(data)
    if sender not in (verified.owner, verified.worker):
        raise PublisherMismatch(
            f"receipt for unit {verified.unit_id} published by {sender}, "
            "who is neither its owner nor its worker"
        )


class ReceiptGossip:
    def __init__(
        self,
        host: MeshHost,
        audit: AuditLog,
        metrics: NodeMetrics,
        audits: Callable[[], bool] = lambda: True,
    ) -> None:
        self.host = host
        self.audit = audit
        self.metrics = metrics
        self.audits = audits  # whether to take every node's receipts now
        self.listening = False
        self._taking = False  # a task reads the subscription
        for reason in REJECT_REASONS:
            metrics.receipts_rejected.labels(reason)

    async def start(self) -> None:
        """Subscribe before any dial, unless a large network is remembered."""
        if self.audits():
            await self._listen()

    async def run(self) -> None:
        """Take the network's receipts while `audits()`, looking again every few
        seconds (the network's size is heard with each registration)."""
        async with trio.open_nursery() as nursery:
            while True:
                wanted = self.audits()
                if wanted and not self.listening:
                    await self._listen()
                elif not wanted and self.listening:
                    self.listening = False
                    await self.host.unsubscribe(RECEIPTS_TOPIC)
                    log.info("the network is large: only directories take its receipts now")
                if self.listening and not self._taking:
                    self._taking = True
                    nursery.start_soon(self._take)
                await trio.sleep(AUDIT_CHECK_S)

    async def _listen(self) -> None:
        await self.host.subscribe(RECEIPTS_TOPIC, self._validate)
        self.listening = True

    async def _take(self) -> None:
        try:
            async for _sender, data in self.host.messages(RECEIPTS_TOPIC):
                await self._keep(data)
        finally:
            self._taking = False

    async def publish(self, cosigned: bytes) -> None:
        """Tell the network (and our own audit table) about a receipt we hold."""
        await self._keep(cosigned)
        try:
            await self.host.publish(RECEIPTS_TOPIC, cosigned)
        except Exception as exc:  # gossip is best effort; the ledgers hold the truth
            log.warning("publishing a receipt failed: %s", exc)

    def _validate(self, sender: str, data: bytes) -> bool:
        if sender == self.host.peer_id:
            return True
        try:
            check_receipt(data, sender)
        except ProtocolError as exc:
            self.metrics.receipts_rejected.labels(exc.reason).inc()
            log.info("receipt rejected from %s: %s (%s)", sender, exc.reason, exc)
            return False
        return True

    async def _keep(self, data: bytes) -> None:
        """Check (two signatures) and store in a worker thread: never on the trio
        thread, where a flood of receipts would stall the node's networking."""
        try:
            outcome = await trio.to_thread.run_sync(self.audit.add, data)
        except MeshminerError as exc:
            log.info("receipt not kept in the audit table: %s", exc)
            return
        if outcome == "conflict":
            log.warning("conflicting receipts for one unit (see /api/v1/ledger/balances)")
        self.metrics.receipts_seen.labels(outcome).inc()
