"""Evidence gossip on `meshminer/evidence/1`: owners tell the network who was caught.

An `Evidence` message is the owner's signed account of a failed spot check around the
worker's own signed result. Before GossipSub delivers or forwards it, the validator
checks its size, both signatures, that the publisher is the owner who signs it, and
that the disputed hash is one the worker committed to. A node that receives it puts
the worker back on probation (`Reputation.reported`); it does not exclude the worker
on another owner's word, since it cannot replay the segment without that job's data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from node.net.host import MeshHost
from protocol import ProtocolError, TooLarge, open_envelope
from protocol.evidence import EVIDENCE_LIMITS, Evidence, claimed_result
from protocol.names import EVIDENCE_TOPIC

log = logging.getLogger(__name__)


def check_evidence(data: bytes, sender: str) -> Evidence:
    """The evidence in `data`, published by `sender`, checked; raises `ProtocolError`."""
    if len(data) > EVIDENCE_LIMITS.max_bytes:
        raise TooLarge(f"evidence of {len(data)} bytes exceeds {EVIDENCE_LIMITS.max_bytes}")
    evidence = open_envelope(data, Evidence, expected_signer=sender, limits=EVIDENCE_LIMITS)
    claimed_result(evidence.message)
    return evidence.message


class EvidenceGossip:
    def __init__(self, host: MeshHost, on_evidence: Callable[[Evidence], None]) -> None:
        self.host = host
        self._on_evidence = on_evidence

    async def start(self) -> None:
        await self.host.subscribe(EVIDENCE_TOPIC, self._validate)

    async def run(self) -> None:
        async for sender, data in self.host.messages(EVIDENCE_TOPIC):
            try:
                evidence = check_evidence(data, sender)
            except ProtocolError:
                continue
            log.warning(
                "evidence from %s: %s failed a spot check (%s)",
                sender,
                evidence.worker,
                evidence.reason,
            )
            self._on_evidence(evidence)

    async def publish(self, envelope: bytes) -> None:
        try:
            await self.host.publish(EVIDENCE_TOPIC, envelope)
        except Exception as exc:  # best effort: the ledger entry holds the evidence
            log.warning("publishing evidence failed: %s", exc)

    def _validate(self, sender: str, data: bytes) -> bool:
        if sender == self.host.peer_id:
            return True
        try:
            check_evidence(data, sender)
        except ProtocolError as exc:
            log.info("evidence rejected from %s: %s", sender, exc)
            return False
        return True
