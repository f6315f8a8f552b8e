"""The peer table: the latest valid capacity ad of every peer, with expiry.

Held in memory for the trio thread and written through to `node.db`, so a restarted
node shows what it last knew. Entries restored from disk are marked `stale` until
the peer is heard from again, and are dropped if it is not heard within one TTL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlite_utils

from protocol import AD_LIMITS, CapacityAd, ProtocolError, open_envelope
from protocol.schema import to_plain

log = logging.getLogger(__name__)


@dataclass
class PeerEntry:
    ad: CapacityAd
    envelope: bytes  # the signed bytes as received, re-served to newly connected peers
    last_seen: float
    stale: bool = False
    refreshed_at: float = 0.0  # expiry clock: last_seen, or the restart time if stale

    def to_json(self) -> dict:
        ad = self.ad
        return {
            "peer_id": ad.peer_id,
            "addrs": list(ad.addrs),
            "gpus": [to_plain(g) for g in ad.gpus],
            "tflops": ad.tflops,
            "load": ad.load_pct,
            "policy": to_plain(ad.policy),
            "torch_version": ad.torch_version,
            "cuda_version": ad.cuda_version,
            "version": ad.version,
            "seq": ad.seq,
            "ad_timestamp": ad.timestamp,
            "last_seen": self.last_seen,
            "stale": self.stale,
        }


class PeerTable:
    def __init__(
        self, db: sqlite_utils.Database, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = db
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, PeerEntry] = {}
        self._restore()

    def _restore(self) -> None:
        now = self._clock()
        for row in self._db["peers"].rows:
            try:
                signed = open_envelope(row["envelope"], CapacityAd, limits=AD_LIMITS)
            except ProtocolError as exc:
                log.warning("dropping unreadable stored ad for %s: %s", row["peer_id"], exc)
                self._db["peers"].delete(row["peer_id"])
                continue
            self._entries[signed.signer] = PeerEntry(
                ad=signed.message,
                envelope=signed.raw,
                last_seen=row["last_seen"],
                stale=True,
                refreshed_at=now,
            )
        if self._entries:
            log.info("restored %d peers from node.db (stale until heard from)", len(self._entries))

    def get(self, peer_id: str) -> PeerEntry | None:
        return self._entries.get(peer_id)

    def accept(self, ad: CapacityAd, envelope: bytes) -> str | None:
        """Store a verified ad if it is newer; returns "joined", "updated" or None."""
        current = self._entries.get(ad.peer_id)
        if current is not None and ad.seq <= current.ad.seq:
            return None
        now = self._clock()
        self._entries[ad.peer_id] = PeerEntry(ad, envelope, last_seen=now, refreshed_at=now)
        self._db["peers"].upsert(
            {"peer_id": ad.peer_id, "seq": ad.seq, "envelope": envelope, "last_seen": now},
            pk="peer_id",
        )
        return "updated" if current is not None and not current.stale else "joined"

    def expire(self) -> list[str]:
        """Drop peers not heard from within the TTL; returns their ids."""
        cutoff = self._clock() - self.ttl_s
        gone = [pid for pid, e in self._entries.items() if e.refreshed_at < cutoff]
        for pid in gone:
            del self._entries[pid]
            self._db["peers"].delete_where("peer_id = ?", [pid])
        return gone

    def entries(self) -> list[PeerEntry]:
        return sorted(self._entries.values(), key=lambda e: e.ad.peer_id)

    def envelopes(self) -> list[bytes]:
        return [e.envelope for e in self._entries.values() if not e.stale]

    def __len__(self) -> int:
        return len(self._entries)
