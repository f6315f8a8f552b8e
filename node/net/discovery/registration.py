"""A node's standing with directories: which to register with, what their counts
say of the network's size, which of them to trust (the owner's query is `search`).

Each node registers its signed ad with `directory_peers` directories, chosen by
rendezvous (highest-random-weight) hashing of its peer id with theirs, so that every
volunteer spreads evenly over the directories it knows, and a directory that leaves
moves only its own volunteers. Registration repeats every `interval_s`, well inside the
directories' TTL, and at once when the chosen set changes (a directory joined, one
stopped answering). Each directory is asked in a task of its own with a short
timeout, so a dead one delays no other; directories that answered are preferred to
ones never heard from, and those that do not answer rest, so that signed directory
ads with dead addresses (cheap to make) cost a joiner a few timeouts, not its
registration.

The directories' replies say how many peers each holds; from that the node estimates
the network's size, and `gossip_own_ad()` tells capacity gossip whether this node's
ad still goes to everyone (a small network: as before directories existed) or only
to the directories (a large one). Gossip is what a hostile directory would like to
start (every ad to every node: more than two cores each at 10,000 peers), so the
rules lean the other way (docs/design/discovery.md, "Against strangers"):
- no network-wide gossip until every directory known (at most eight) answered;
- the estimate is the largest of the directories' counts heard lately, so a directory
  can raise it (a count it could not hold is ignored) but never lower it;
- a large verdict is remembered in node.db for a day, across restarts.

A directory can also take a registration and leave the node out of its answers: after
registering, the node checks as a stranger that it is listed (`listing`), and leaves a
directory that hides it for hours; those that list it are the ones it asks first.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import trio

from node.identity import Identity
from node.net.discovery.cost import DiscoveryCost
from node.net.discovery.directory import MAX_REGISTRATIONS
from node.net.discovery.listing import REQUEST_TIMEOUT_S, check_query, lists_me, open_reply
from node.net.discovery.memory import (
    REMEMBER_S,
    keep_answered,
    keep_size,
    recall_answered,
    recall_size,
)
from node.net.host import HostError, MeshHost
from node.net.peers import PeerTable
from protocol import AD_LIMITS, ProtocolError, open_envelope
from protocol.capacity import CapacityAd
from protocol.directory import DIRECTORY_LIMITS
from protocol.names import REGISTER_PROTOCOL

log = logging.getLogger(__name__)

RETRY_FIRST_S = 5.0  # a directory that did not answer is skipped this long, doubling
FAILED_PAUSE_S = 120.0  # up to this
TRIED_AT_ONCE = 8  # untried directories registered with at once while too few answer
RATED_AFTER = 8  # peers a directory returned, probed, before its answers are judged
MIN_LIVE_SHARE = 0.5  # of those, at least this share must answer
COUNT_FRESH_S = 900.0  # a directory's count is used this long after it was heard
CHECK_EVERY_S = 1800.0  # a directory's listing of this node is checked this often
HIDING_REST_S = 6 * 3600.0  # a directory that hid this node is not used this long


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
        db: Any = None,
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
        self.on_change: Callable[[], None] = lambda: None  # `gossip_own_ad()` may have flipped
        self.registered: dict[str, int] = {}  # directory -> peers it held when last heard
        self._heard_at: dict[str, float] = {}
        self._registered_at: dict[str, float] = {}
        self._failed_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}  # directory -> failures in a row
        # directories that answered with a count they could hold (also before a restart)
        self._good: set[str] = recall_answered(db)
        self._in_flight: set[str] = set()
        self._vouched: dict[str, tuple[int, int]] = {}  # directory -> (answered, probed)
        self._checked_at: dict[str, float] = {}  # directory -> its last listing check
        self.listed: set[str] = set()  # directories that listed this node to a stranger
        self._db = db
        self._remembered = recall_size(db)  # (size, time.time() when heard) of a large network

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
        """The directories to register with: by rendezvous among those that answered
        before, then among those never heard from; while fewer than `directory_peers`
        answered, up to `TRIED_AT_ONCE` untried ones at once. In a network not known
        to be large with at most `TRIED_AT_ONCE` directories, all of them: each one's
        count is heard before this node gossips its ad (`gossip_own_ad`)."""
        usable = self.usable(now)
        if len(usable) <= TRIED_AT_ONCE and not self.large():
            return rendezvous_order(self.identity.peer_id, usable)
        good = rendezvous_order(self.identity.peer_id, [d for d in usable if d in self._good])
        untried = [d for d in usable if d not in self._good]
        picked = good[: self.directory_peers]
        if len(picked) < self.directory_peers:
            more = TRIED_AT_ONCE if len(self._good) < self.directory_peers else 0
            wanted = max(self.directory_peers - len(picked), more)
            picked += rendezvous_order(self.identity.peer_id, untried)[:wanted]
        return picked

    def _fresh_counts(self) -> dict[str, int]:
        now = time.monotonic()
        known = set(self.directories())
        return {
            d: count
            for d, count in self.registered.items()
            if d in known and now - self._heard_at.get(d, -1e18) <= COUNT_FRESH_S
        }

    def network_size(self) -> int:
        """Peers in the network as the directories see it (0: none answered lately):
        each volunteer registers with `directory_peers` of the M directories, so one
        holds about N x directory_peers / M. The largest such estimate: a hostile
        directory that hides its registrations and reports few cannot make the network
        look small, and one that reports more than it could hold is not heard."""
        counts = self._fresh_counts()
        if not counts:
            return 0
        known = len(self.directories())
        return round(max(counts.values()) * known / min(self.directory_peers, known))

    def large(self) -> bool:
        """The directories count `gossip_max_peers` or more (a directory counts its own),
        now or within the last day (remembered across restarts)."""
        size = max(self.network_size(), self.own_count())
        if size >= self.gossip_max_peers:
            self._remember(size)
            return True
        size_then, heard = self._remembered
        return size_then >= self.gossip_max_peers and time.time() - heard <= REMEMBER_S

    def gossip_own_ad(self) -> bool:
        """Whether this node's ad still goes to every node by gossip: in a network
        without directories, or once every known directory (at most `TRIED_AT_ONCE`)
        said the network is small; never while it is, or lately was, large. Not when
        some said so: two hostile directories that answer first with small counts
        would turn gossip on for every joiner, and a directory that never answers
        (dead, or resting after a bad answer) keeps it off, the safe way."""
        if self.is_directory or self.directory_peers == 0:
            return True
        if self.large():
            return False
        known = self.directories()
        fresh = self._fresh_counts()
        return len(known) <= TRIED_AT_ONCE and all(d in fresh for d in known)

    def slow_refresh(self) -> bool:
        """A directory in a large network: the only gossip left, so it goes slowly."""
        return self.is_directory and self.large()

    def audits_receipts(self) -> bool:
        """Whether this node takes every node's receipts (`ReceiptGossip`): a directory
        always; another node while the network is not large."""
        return self.is_directory or self.directory_peers == 0 or not self.large()

    def shares_all_ads(self) -> bool:
        """Whether a new connection gets every ad this node holds, or only directories':
        every ad only where ads are still gossiped. A directory of a large network
        hands on none of the volunteers' ads it got by exchange on connect; owners
        find volunteers through its answers."""
        return self.gossip_own_ad() and not self.slow_refresh()

    def status(self) -> dict[str, object]:
        return {
            "directories": len(self.directories()),
            "registered_with": sorted(self._registered_at),
            "listed_by": sorted(self.listed & set(self._registered_at)),
            "network_size": self.network_size(),
            "gossips_own_ad": self.gossip_own_ad(),
            "audits_receipts": self.audits_receipts(),
        }

    def _remember(self, size: int) -> None:
        now = time.time()
        if self._remembered[0] >= self.gossip_max_peers and now - self._remembered[1] < 60:
            return  # written within the minute
        self._remembered = (size, now)
        keep_size(self._db, size, now)

    def heard(self, directory: str, count: int) -> bool:
        """A directory said it holds `count` peers: kept (and the directory preferred)
        if it could hold that many and counts this node (at least 1); else it is
        treated as one that did not answer. True when kept."""
        if not 1 <= count <= MAX_REGISTRATIONS:
            pause = self.failed(directory)
            log.info("directory %s counts %d peers, which it cannot hold; skipped for %g s",
                     directory, count, pause)  # fmt: skip
            return False
        before = self.gossip_own_ad()
        self.answered(directory)
        if directory not in self._good:
            self._good.add(directory)
            keep_answered(self._db, self._good)
        self.registered[directory] = count
        self._heard_at[directory] = time.monotonic()
        self.peers.touch(directory)  # it answered itself: its ad stays fresh
        if self.gossip_own_ad() != before:
            self.on_change()
        return True

    # -- registering ---------------------------------------------------------------

    async def run(self) -> None:
        """Register with the chosen directories every `interval_s`, and at once with
        a newly chosen one, each in a task of its own."""
        if self.directory_peers == 0:
            return
        async with trio.open_nursery() as nursery:
            while True:
                now = time.monotonic()
                chosen = self.chosen(now)
                for gone in set(self._registered_at) - set(chosen):
                    del self._registered_at[gone]
                due = [d for d in chosen if self._next_due(d) <= now and d not in self._in_flight]
                if due:
                    ad = self._make_ad()
                    for directory in due:
                        self._in_flight.add(directory)
                        nursery.start_soon(self._register, directory, ad)
                # on time for the next one, and within a second for a newly chosen one
                wake = min((self._next_due(d) for d in chosen), default=1e18)
                await trio.sleep(min(1.0, max(0.05, wake - time.monotonic())))

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
        if directory in self._good:
            self._good.discard(directory)
            keep_answered(self._db, self._good)
        self.registered.pop(directory, None)
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
                reply = open_reply(raw, directory)
        except (HostError, ProtocolError) as exc:
            self._registered_at.pop(directory, None)
            pause = self.failed(directory)
            log.info("registering with directory %s failed (again in %g s): %s",
                     directory, pause, exc)  # fmt: skip
            return
        finally:
            self._in_flight.discard(directory)
        if not self.heard(directory, reply.registered):
            self._registered_at.pop(directory, None)
            return
        if directory not in self._registered_at:
            log.info("registered with directory %s (%d peers there)", directory, reply.registered)
        self._registered_at[directory] = sent_at
        if time.monotonic() - self._checked_at.get(directory, -1e18) >= CHECK_EVERY_S:
            await self._check_listing(directory, ad, reply.registered)

    async def _check_listing(self, directory: str, ad: bytes, registered: int) -> None:
        """Ask `directory`, as a stranger, whether it lists this node (`listing`); one
        that does not is hiding it, and rests `HIDING_REST_S`."""
        query = check_query(open_envelope(ad, CapacityAd, limits=AD_LIMITS).message, registered)
        entry = self.peers.get(directory)
        if query is None or entry is None:
            return  # this node fits no job now; the next registration checks
        self._checked_at[directory] = time.monotonic()
        self.cost.sent(b"", "listing")
        try:
            listed = await lists_me(
                directory, entry.ad.addrs, self.identity.peer_id, query, REQUEST_TIMEOUT_S
            )
        except HostError as exc:
            self._checked_at.pop(directory, None)
            pause = self.failed(directory)
            log.info("listing check of directory %s failed (again in %g s): %s",
                     directory, pause, exc)  # fmt: skip
            return
        if listed:
            if directory not in self.listed:
                log.info("directory %s lists this node to strangers", directory)
            self.listed.add(directory)
        else:
            self.hiding(directory)

    def hiding(self, directory: str) -> None:
        """`directory` took this node's registration and left it out of an answer to a
        stranger: neither registered with nor asked for `HIDING_REST_S`."""
        self.failed(directory)
        self._failed_until[directory] = time.monotonic() + HIDING_REST_S
        self.listed.discard(directory)
        self._registered_at.pop(directory, None)
        log.warning("directory %s hides this node from owners (left out of an answer to a "
                    "stranger); not used for %g h", directory, HIDING_REST_S / 3600)  # fmt: skip

    # -- asking --------------------------------------------------------------------

    def vouched(self, directory: str, live: bool) -> None:
        """A peer `directory` returned was probed; `live`: it answered. A directory
        whose peers mostly do not answer (dead or made-up ads) rests as one that
        failed, after `RATED_AFTER` of them."""
        answered, probed = self._vouched.get(directory, (0, 0))
        answered, probed = answered + live, probed + 1
        if probed >= RATED_AFTER and answered < MIN_LIVE_SHARE * probed:
            del self._vouched[directory]
            pause = self.failed(directory)
            log.info("directory %s returned %d peers of which %d answered; skipped for %g s",
                     directory, probed, answered, pause)  # fmt: skip
        else:
            self._vouched[directory] = (answered, probed)

    def ask_order(self, now: float) -> list[str]:
        """The usable directories in the order an owner asks them: those that listed
        this node to a stranger (honest, as far as this node can tell), then those
        that answered, then the rest; random within each group."""
        usable = self.usable(now)
        groups = (
            [d for d in usable if d in self.listed],
            [d for d in usable if d in self._good and d not in self.listed],
            [d for d in usable if d not in self._good and d not in self.listed],
        )
        return [d for group in groups for d in random.sample(group, len(group))]
