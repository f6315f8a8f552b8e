"""Serving as a directory: keep the capacity ads volunteers register, answer owners.

A directory is an ordinary node with `directory = true` (a public one, like a relay
or a bootstrap node). In a large network volunteers stop gossiping their ads and
register them here instead (`node.net.discovery.registration`), so a volunteer's
discovery cost no longer grows with the network: see docs/architecture.md, "Finding
peers at scale".

Registrations are checked exactly like gossiped ads (`check_ad`: size, signature,
signer = registering peer, freshness, sequence), and kept in an in-memory `PeerTable`
whose entries expire `ttl_s` after their last refresh. A query returns the registered
peers that fit the job in the order of its seed (`listing.rank_key`): a random sample
for an owner, so that owners asking at once do not all crowd the same few peers
(owners probe what they get before offering work), and a check a volunteer can make
of its own listing.
"""

from __future__ import annotations

import logging
import os
import time

import sqlite_utils
import trio

from node.identity import Identity
from node.metrics import NodeMetrics
from node.net.discovery.cost import DiscoveryCost
from node.net.discovery.gossip import DuplicateAd, check_ad
from node.net.discovery.listing import SEED_BYTES, rank_key
from node.net.host import MeshHost
from node.net.peers import PeerTable, unfit_reason
from protocol import AD_LIMITS, ProtocolError, open_envelope, seal
from protocol.directory import DIRECTORY_LIMITS, DirectoryQuery, DirectoryReply
from protocol.names import QUERY_PROTOCOL, REGISTER_PROTOCOL

log = logging.getLogger(__name__)

MAX_REGISTRATIONS = 16384  # a 10,000-peer network with two directories per volunteer: 4+ of these
# about a quarter of a core: one real directory took 15% at 500, 33% at 1,000, 49% at
# 2,000 (benchmarks/directory_load.py), and its answers' p99 grew past 0.7 s
COMFORTABLE_REGISTRATIONS = 900


class Directory:
    def __init__(
        self,
        host: MeshHost,
        identity: Identity,
        metrics: NodeMetrics,
        cost: DiscoveryCost,
        ttl_s: float,
        max_registrations: int = MAX_REGISTRATIONS,
    ) -> None:
        self.host = host
        self.identity = identity
        self.metrics = metrics
        self.cost = cost
        self.table = PeerTable(
            sqlite_utils.Database(memory=True), ttl_s, max_peers=max_registrations
        )

    def start(self) -> None:
        self.host.serve(REGISTER_PROTOCOL, self._register, max_request=AD_LIMITS.max_bytes)
        self.host.serve(QUERY_PROTOCOL, self._query, max_request=1024)

    def crowded(self) -> bool:
        """More registrations than a directory serves within a quarter of a core: the
        network needs another directory, and nothing but an operator makes one."""
        return len(self.table) > COMFORTABLE_REGISTRATIONS

    async def run(self) -> None:
        was_crowded = False
        while True:
            await trio.sleep(1.0)
            gone = self.table.expire()
            if gone:
                log.debug("directory: %d registrations expired", len(gone))
            if self.crowded() and not was_crowded:
                log.warning(
                    "directory: %d registrations, more than the %d one serves within a "
                    "quarter of a core; the network needs another directory (any public "
                    "node started with --directory)",
                    len(self.table),
                    COMFORTABLE_REGISTRATIONS,
                )
            was_crowded = self.crowded()

    def _reply(self, ads: list[bytes] | None = None) -> bytes:
        reply = DirectoryReply(len(self.table), self.table.ttl_s, ads or [])
        return seal(reply, self.identity.signing_key)

    async def _register(self, peer: str, request: bytes) -> bytes:
        self.cost.received(request, "register")
        with self.cost.checking():
            try:
                ad, raw = check_ad(request, peer, self.table, time.time())
                self.table.accept(ad, raw)
            except DuplicateAd:
                self.table.touch(peer)
            except ProtocolError as exc:
                self.metrics.ads_rejected.labels(exc.reason).inc()
                log.info("directory: registration from %s refused: %s", peer, exc)
                raise  # the stream is closed: the peer's request fails
        return self._reply()

    async def _query(self, peer: str, request: bytes) -> bytes:
        self.cost.received(request, "query")
        with self.cost.checking():
            query = open_envelope(
                request, DirectoryQuery, expected_signer=peer, limits=DIRECTORY_LIMITS
            ).message
            requirements = query.requirements()
            fitting = [
                entry
                for entry in self.table.entries()
                if entry.ad.peer_id != peer and unfit_reason(entry.ad, requirements) is None
            ]
            seed = query.seed or os.urandom(SEED_BYTES)
            if query.gpu == "preferred":  # GPUs first, each group in the seed's order
                fitting.sort(
                    key=lambda e: (
                        not any(g.kind == "cuda" for g in e.ad.gpus),
                        rank_key(seed, e.ad.peer_id),
                    )
                )
            else:
                fitting.sort(key=lambda e: rank_key(seed, e.ad.peer_id))
            reply = self._reply([e.envelope for e in fitting[: query.want]])
        self.cost.sent(reply, "query")
        return reply
