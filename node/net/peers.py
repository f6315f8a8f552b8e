"""The peer table: the latest valid capacity ad of every peer, with expiry.

Held in memory for the trio thread and written through to `node.db`, so a restarted
node shows what it last knew. Entries restored from disk are marked `stale` until
the peer is heard from again, and are dropped if it is not heard within one TTL.

The table holds at most `max_peers` entries. One identity holds one entry (its
newest ad), so a flood of fresh identities is what could fill it: when it is full,
a newcomer displaces a stale entry if there is one, else the most recently joined
peer. Established peers are never the ones evicted, so a flood churns only among
its own identities.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from node.net.relay import is_circuit
from protocol import AD_LIMITS, CapacityAd, ProtocolError, open_envelope
from protocol.schema import to_plain

log = logging.getLogger(__name__)

MAX_PEERS = 4096
#: a directory's ad lasts this many times the TTL: in a large network directories are
#: the only nodes that gossip, and they do it this much more slowly
#: (node.net.discovery.gossip)
DIRECTORY_TTL_FACTOR = 10


@dataclass
class PeerEntry:
    ad: CapacityAd
    envelope: bytes  # the signed bytes as received, re-served to newly connected peers
    last_seen: float
    stale: bool = False
    refreshed_at: float = 0.0  # expiry clock: last_seen, or the restart time if stale
    joined_at: float = 0.0  # when this node first took an ad of it (this run)
    via: str = "gossip"  # how the ad came: gossip, exchange, directory (a copy) or probe

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
            "reachability": ad.reachability,
            "relay": ad.relay,
            "paused": ad.paused,
            "directory": ad.directory,
            "name": ad.name,
            "team": ad.team,
            "via": self.via,
            "last_seen": self.last_seen,
            "stale": self.stale,
        }


class PeerTable:
    def __init__(
        self,
        db: sqlite_utils.Database,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        max_peers: int = MAX_PEERS,
    ) -> None:
        self._db = db
        self.ttl_s = ttl_s
        self.max_peers = max_peers
        self.evicted = 0
        self._clock = clock
        self._entries: dict[str, PeerEntry] = {}
        self._classes: dict[str, str] = {}  # peer -> determinism class, outliving its entry
        self._pending: dict[str, dict] | None = None  # rows to write at the end of a batch
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

    def determinism_of(self, peer_id: str) -> str:
        """The determinism class `peer_id` last declared, also after its entry expired
        (under load a worker's ad can lapse while its result is being checked); "" for
        a peer never heard from."""
        entry = self._entries.get(peer_id)
        return entry.ad.determinism if entry is not None else self._classes.get(peer_id, "")

    def accept(self, ad: CapacityAd, envelope: bytes, via: str = "gossip") -> str | None:
        """Store a verified ad if it is newer; returns "joined", "updated" or None."""
        current = self._entries.get(ad.peer_id)
        if current is not None and ad.seq <= current.ad.seq:
            return None
        now = self._clock()
        if current is None and len(self._entries) >= self.max_peers:
            self._evict_one()
        joined = now if current is None or current.stale else current.joined_at
        self._entries[ad.peer_id] = PeerEntry(
            ad, envelope, last_seen=now, refreshed_at=now, joined_at=joined, via=via
        )
        self._classes.pop(ad.peer_id, None)
        self._classes[ad.peer_id] = ad.determinism
        if len(self._classes) > 2 * self.max_peers:
            del self._classes[next(iter(self._classes))]
        row = {"peer_id": ad.peer_id, "seq": ad.seq, "envelope": envelope, "last_seen": now}
        if self._pending is not None:
            self._pending[ad.peer_id] = row
        else:
            self._db["peers"].upsert(row, pk="peer_id")
        return "updated" if current is not None and not current.stale else "joined"

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Write the ads accepted in the block to node.db together: a joiner's first
        table of 1,024 ads costs a few commits, not 1,024 (each one an fsync)."""
        self._pending = {}
        try:
            yield
        finally:
            rows, self._pending = list(self._pending.values()), None
            if rows:
                self._db["peers"].upsert_all(rows, pk="peer_id")

    def touch(self, peer_id: str, via: str = "probe") -> None:
        """The peer itself just answered with the ad we hold: it is alive now."""
        entry = self._entries.get(peer_id)
        if entry is not None:
            entry.last_seen = entry.refreshed_at = self._clock()
            entry.stale = False
            entry.via = via

    def forget(self, peer_id: str) -> None:
        """Drop a peer that did not answer when asked (it comes back with its next ad)."""
        if self._entries.pop(peer_id, None) is not None:
            self._db["peers"].delete_where("peer_id = ?", [peer_id])

    def _evict_one(self) -> None:
        victim = max(self._entries.values(), key=lambda e: (e.stale, e.joined_at))
        del self._entries[victim.ad.peer_id]
        if self._pending is not None:
            self._pending.pop(victim.ad.peer_id, None)
        self._db["peers"].delete_where("peer_id = ?", [victim.ad.peer_id])
        self.evicted += 1

    def ttl_for(self, ad: CapacityAd) -> float:
        """How long an ad lasts without a newer one."""
        return self.ttl_s * (DIRECTORY_TTL_FACTOR if ad.directory else 1)

    def expire(self) -> list[str]:
        """Drop peers not heard from within their TTL; returns their ids."""
        now = self._clock()
        gone = [
            pid for pid, e in self._entries.items() if e.refreshed_at < now - self.ttl_for(e.ad)
        ]
        for pid in gone:
            del self._entries[pid]
            self._db["peers"].delete_where("peer_id = ?", [pid])
        return gone

    def entries(self) -> list[PeerEntry]:
        return sorted(self._entries.values(), key=lambda e: e.ad.peer_id)

    def envelopes(self, directories_only: bool = False) -> list[bytes]:
        """The live ads, as handed to a new connection; `directories_only` in a large
        network, where every copy handed on costs the peer a signature check for
        nothing (an owner that probes 16 peers it is not connected to would hand each
        of them the 16 copies a directory just gave it)."""
        return [
            e.envelope
            for e in self._entries.values()
            if not e.stale and (e.ad.directory or not directories_only)
        ]

    def __len__(self) -> int:
        return len(self._entries)

    def relays(self) -> list[str]:
        """Direct addresses of peers whose ads offer relaying (public ones)."""
        return [
            addr
            for entry in self.entries()
            if entry.ad.relay and entry.ad.reachability == "public"
            for addr in entry.ad.addrs[:1]
            if not is_circuit(addr)
        ]


def unfit_reason(
    ad: CapacityAd, requirements: dict[str, Any], count_load: bool = True
) -> str | None:
    """Why `ad`'s node cannot take a job with `requirements`, or None if it can.
    Without `count_load`, its load is not held against it: an owner whose unit the
    node has just finished knows the load in the ad may be that unit's (a node whose
    units follow each other advertises itself busy throughout), and the node
    declines if it is full."""
    policy = ad.policy
    if not policy.accepting:
        return "not accepting work"
    if ad.paused:
        return f"paused: {ad.paused}"
    if count_load and ad.load_pct >= policy.load_limit_pct:
        return f"at its load limit ({ad.load_pct}% of {policy.load_limit_pct}%)"
    max_hours = float(requirements.get("max_hours", 1.0))
    if max_hours > policy.max_job_hours:
        return f"takes jobs up to {policy.max_job_hours:g} h, this one may run {max_hours:g} h"
    if requirements.get("gpu") == "required":
        need_mb = float(requirements.get("min_gpu_memory_gb", 0)) * 1024
        if not any(g.kind == "cuda" and g.memory_total_mb >= need_mb for g in ad.gpus):
            return f"no GPU with >= {need_mb / 1024:g} GB"
    return None


def fitting(
    entries: Iterable[PeerEntry],
    requirements: dict[str, Any],
    excluded: set[str],
    loaded_ok: Collection[str] = (),
) -> list[PeerEntry]:
    """The live entries whose ads can take a job with `requirements`, but `excluded`;
    the load of those in `loaded_ok` is not held against them (`unfit_reason`)."""
    return [
        e
        for e in entries
        if not e.stale
        and e.ad.peer_id not in excluded
        and unfit_reason(e.ad, requirements, e.ad.peer_id not in loaded_ok) is None
    ]


def free_tflops(ad: CapacityAd) -> float:
    """The throughput an ad says is free now: what its load leaves of its TFLOP/s."""
    return ad.tflops * (1 - ad.load_pct / 100)
