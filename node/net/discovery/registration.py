"""The volunteer's and the owner's side of directories: register, estimate, query.

Each node registers its signed ad with `directory_peers` directories, chosen by
rendezvous (highest-random-weight) hashing of its peer id with theirs, so that every
volunteer spreads evenly over the directories it knows, and a directory that leaves
moves only its own volunteers. Registration repeats every `interval_s`, well inside the
directories' TTL, and at once when the chosen set changes (a directory joined, one
stopped answering).

The directories' replies say how many peers each holds; from that the node estimates
the network's size, and `gossip_own_ad()` tells capacity gossip whether this node's
ad still goes to everyone (a small network: as before directories existed) or only
to the directories (a large one).
"""

from __future__ import annotations

import hashlib
import logging
import random
import statistics
import time
from collections.abc import Callable

import trio

from node.identity import Identity
from node.net.discovery.cost import DiscoveryCost
from node.net.host import HostError, MeshHost
from node.net.peers import PeerTable
from protocol import ProtocolError, open_envelope, seal
from protocol.directory import DIRECTORY_LIMITS, MAX_WANT, DirectoryQuery, DirectoryReply
from protocol.names import QUERY_PROTOCOL, REGISTER_PROTOCOL

log = logging.getLogger(__name__)

QUERY_DIRECTORIES = 2  # an owner asks this many at once: one may hide peers, or be gone
REQUEST_TIMEOUT_S = 5.0
RETRY_FIRST_S = 5.0  # a directory that did not answer is skipped this long, doubling
FAILED_PAUSE_S = 120.0  # up to this


def rendezvous_order(own: str, candidates: list[str]) -> list[str]:
    """`candidates` ordered by highest random weight for `own`: each node's own stable
    order, uniform across nodes."""

    def weight(other: str) -> bytes:
        return hashlib.sha256(f"{own}|{other}".encode()).digest()

    return sorted(candidates, key=weight, reverse=True)


class Registration:
    def __init__(
        self,
        host: MeshHost,
        identity: Identity,
        peers: PeerTable,
        cost: DiscoveryCost,
        make_ad: Callable[[], bytes],
        directory_peers: int,
        interval_s: float,
        gossip_max_peers: int,
        is_directory: bool,
        own_count: Callable[[], int] = lambda: 0,
    ) -> None:
        self.host = host
        self.identity = identity
        self.peers = peers
        self.cost = cost
        self._make_ad = make_ad
        self.directory_peers = directory_peers
        self.interval_s = interval_s
        self.gossip_max_peers = gossip_max_peers
        self.is_directory = is_directory
        self.own_count = own_count  # a directory's own registrations
        self.registered: dict[str, int] = {}  # directory -> peers it held at our last call
        self._registered_at: dict[str, float] = {}
        self._failed_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}  # directory -> failures in a row

    # -- what the node knows -------------------------------------------------------

    def directories(self) -> list[str]:
        """Directories this node knows from their ads (not itself, none unheard of)."""
        return [
            e.ad.peer_id
            for e in self.peers.entries()
            if e.ad.directory and not e.stale and e.ad.peer_id != self.identity.peer_id
        ]

    def usable(self, now: float) -> list[str]:
        """The directories known and not resting after a failure (`failed`)."""
        return [d for d in self.directories() if self._failed_until.get(d, 0.0) <= now]

    def chosen(self, now: float) -> list[str]:
        return rendezvous_order(self.identity.peer_id, self.usable(now))[: self.directory_peers]

    def network_size(self) -> int:
        """Peers in the network as the directories see it (0: no directory answered):
        each volunteer registers with `directory_peers` of the M directories, so one
        holds about N x directory_peers / M. The median of their counts: one lying
        directory can neither silence a small network's gossip nor restart it in a
        large one."""
        counts = [self.registered[d] for d in self.directories() if d in self.registered]
        if not counts:
            return 0
        known = len(self.directories())
        return round(statistics.median(counts) * known / min(self.directory_peers, known))

    def large(self) -> bool:
        """The directories count `gossip_max_peers` or more (a directory counts its own)."""
        return max(self.network_size(), self.own_count()) >= self.gossip_max_peers

    def gossip_own_ad(self) -> bool:
        """Whether this node's ad still goes to every node by gossip."""
        if self.is_directory or self.directory_peers == 0:
            return True
        return not self.large()

    def slow_refresh(self) -> bool:
        """A directory in a large network: the only gossip left, so it goes slowly."""
        return self.is_directory and self.large()

    def status(self) -> dict[str, object]:
        return {
            "directories": len(self.directories()),
            "registered_with": sorted(self._registered_at),
            "network_size": self.network_size(),
            "gossips_own_ad": self.gossip_own_ad(),
        }

    # -- registering ---------------------------------------------------------------

    async def run(self) -> None:
        """Register with the chosen directories every `interval_s`, and at once with
        a newly chosen one."""
        if self.directory_peers == 0:
            return
        while True:
            now = time.monotonic()
            chosen = self.chosen(now)
            for gone in set(self._registered_at) - set(chosen):
                del self._registered_at[gone]
            due = [d for d in chosen if self._next_due(d) <= now]
            if due:
                ad = self._make_ad()
                async with trio.open_nursery() as nursery:
                    for directory in due:
                        nursery.start_soon(self._register, directory, ad)
            # on time for the next one, and within a second for a newly chosen directory
            wake = min((self._next_due(d) for d in self.chosen(time.monotonic())), default=1e18)
            await trio.sleep(min(1.0, max(0.0, wake - time.monotonic())))

    def failed(self, directory: str) -> float:
        """Skip `directory` for a while, and return how long: 5 s after one failure,
        doubling up to 120 s. A directory slow for a moment (its machine busy) is asked
        again soon: with a fixed 120 s pause, every volunteer of a 50-node network
        whose directory stalled once was registered nowhere, and unfindable, for two
        minutes. A dead one is asked rarely."""
        failures = self._failures.get(directory, 0) + 1
        self._failures[directory] = failures
        pause = min(FAILED_PAUSE_S, RETRY_FIRST_S * 2 ** (failures - 1))
        self._failed_until[directory] = time.monotonic() + pause
        return pause

    def answered(self, directory: str) -> None:
        """`directory` answered: the next failure starts again at 5 s."""
        self._failures.pop(directory, None)

    def _next_due(self, directory: str) -> float:
        return self._registered_at.get(directory, -1e18) + self.interval_s

    async def _register(self, directory: str, ad: bytes) -> None:
        sent_at = time.monotonic()
        try:
            self.cost.sent(ad, "register")
            raw = await self.host.request(
                directory, REGISTER_PROTOCOL, ad, DIRECTORY_LIMITS.max_bytes, REQUEST_TIMEOUT_S
            )
            with self.cost.checking():
                reply = self._open_reply(raw, directory)
        except (HostError, ProtocolError) as exc:
            self._registered_at.pop(directory, None)
            pause = self.failed(directory)
            log.info("registering with directory %s failed (again in %g s): %s",
                     directory, pause, exc)  # fmt: skip
            return
        self.answered(directory)
        if directory not in self._registered_at:
            log.info("registered with directory %s (%d peers there)", directory, reply.registered)
        self._registered_at[directory] = sent_at
        self.registered[directory] = reply.registered

    def _open_reply(self, raw: bytes, directory: str) -> DirectoryReply:
        return open_envelope(
            raw, DirectoryReply, expected_signer=directory, limits=DIRECTORY_LIMITS
        ).message

    # -- asking --------------------------------------------------------------------

    async def query(self, requirements: dict, want: int) -> list[bytes]:
        """Signed ads of up to `want` peers fitting `requirements`, from up to two
        directories asked at once; the caller checks each ad (`check_ad`)."""
        usable = self.usable(time.monotonic())
        asked = random.sample(usable, min(QUERY_DIRECTORIES, len(usable)))
        query = DirectoryQuery(
            want=max(1, min(want, MAX_WANT)),
            gpu=str(requirements.get("gpu", "preferred")),
            min_gpu_memory_gb=float(requirements.get("min_gpu_memory_gb", 0.0)),
            max_hours=float(requirements.get("max_hours", 1.0)),
            timestamp=time.time(),
        )
        request = seal(query, self.identity.signing_key)
        found: list[bytes] = []

        async def ask(directory: str) -> None:
            self.cost.sent(request, "query")
            try:
                raw = await self.host.request(
                    directory,
                    QUERY_PROTOCOL,
                    request,
                    DIRECTORY_LIMITS.max_bytes,
                    REQUEST_TIMEOUT_S,
                )
                self.cost.received(raw, "query")
                with self.cost.checking():
                    reply = self._open_reply(raw, directory)
            except (HostError, ProtocolError) as exc:
                pause = self.failed(directory)
                log.info("query to directory %s failed (again in %g s): %s",
                         directory, pause, exc)  # fmt: skip
                return
            self.answered(directory)
            self.registered[directory] = reply.registered
            found.extend(reply.ads)

        async with trio.open_nursery() as nursery:
            for directory in asked:
                nursery.start_soon(ask, directory)
        return found
