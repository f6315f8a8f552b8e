"""Capacity gossip on `meshminer/capacity/1`: validate, publish, exchange on connect.

Every ad is checked before GossipSub delivers or forwards it: size, encoding,
signature, signer = sending peer, ad's peer id = signer, freshness, and sequence
number newer than the last one seen (replay). Rejections are counted per reason.

Ads go out on change and on a slow refresh, because each delivered message costs
every node ~9 ms of CPU. A change of load alone (a unit began or ended) goes out
`LOAD_SETTLE_S` later, and at most every `LOAD_AD_S`, only if the load then differs
from the one last published: a worker of short units back to back (an elastic job's
shares, a second or less each) otherwise sent two ads a unit, and every node paid
for each; it now says "busy" once, and "free" once it is. So that a joining node
does not wait a refresh period, both ends of every new connection fetch each other's
table over `/meshminer/ads/1`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio

from node.metrics import NodeMetrics
from node.net.discovery.cost import DiscoveryCost
from node.net.host import HostError, MeshHost
from node.net.peers import DIRECTORY_TTL_FACTOR, PeerTable
from protocol import (
    AD_LIMITS,
    CapacityAd,
    Limits,
    ProtocolError,
    ReplayedMessage,
    SignerMismatch,
    StaleMessage,
    TooLarge,
    decode,
    encode,
    open_envelope,
)
from protocol.names import ADS_PROTOCOL, CAPACITY_TOPIC, PROBE_PROTOCOL

log = logging.getLogger(__name__)

MAX_CLOCK_SKEW_S = 60.0
LOAD_SETTLE_S = 1.0  # a change of load alone is published this much later...
LOAD_AD_S = 5.0  # ... and at most this often, if the load then is not the one published
PROBE_FRESH_S = 2.0  # a probe gets an ad at most this old (a new one costs a signature)
MAX_TABLE_ADS = 1024
_TABLE_LIMITS = Limits(
    max_bytes=MAX_TABLE_ADS * (AD_LIMITS.max_bytes + 8) + 8,  # + msgpack bin/array headers
    max_depth=2,
    max_container_len=MAX_TABLE_ADS,
    max_bin_len=AD_LIMITS.max_bytes,
)


class PeerMismatch(SignerMismatch):
    """The ad describes a peer other than the one that signed it."""

    reason = "peer_mismatch"


class DuplicateAd(ProtocolError):
    """The very ad already in the table, arriving again by another path: harmless."""

    reason = "duplicate"

    def __init__(self, message: str, peer_id: str = "") -> None:
        super().__init__(message)
        self.peer_id = peer_id  # whose ad it is


class OlderAd(ReplayedMessage):
    """A genuine ad of a peer, older than the one in the table."""

    def __init__(self, message: str, peer_id: str = "") -> None:
        super().__init__(message)
        self.peer_id = peer_id


REJECT_REASONS = (
    "oversized",
    "malformed",
    "bad_signature",
    "signer_mismatch",
    "peer_mismatch",
    "stale",
    "replay",
)


def check_ad(
    data: bytes, sender: str | None, peers: PeerTable, now: float
) -> tuple[CapacityAd, bytes]:
    """Verify an ad envelope; `sender` is the gossip origin (None for relayed tables).
    An ad may be as old as its TTL in `peers` (`PeerTable.ttl_for`) plus clock skew."""
    if len(data) > AD_LIMITS.max_bytes:
        raise TooLarge(f"ad of {len(data)} bytes exceeds {AD_LIMITS.max_bytes}")
    signed = open_envelope(data, CapacityAd, expected_signer=sender, limits=AD_LIMITS)
    ad = signed.message
    if ad.peer_id != signed.signer:
        raise PeerMismatch(f"ad for {ad.peer_id[:60]} is signed by {signed.signer}")
    max_age_s = peers.ttl_for(ad) + MAX_CLOCK_SKEW_S
    if ad.timestamp < now - max_age_s or ad.timestamp > now + MAX_CLOCK_SKEW_S:
        raise StaleMessage(f"ad from {ad.peer_id} is dated {now - ad.timestamp:+.0f} s ago")
    current = peers.get(ad.peer_id)
    if current is not None and ad.seq <= current.ad.seq:
        if ad.seq == current.ad.seq and signed.raw == current.envelope:
            raise DuplicateAd(f"ad {ad.seq} from {ad.peer_id} is already known", ad.peer_id)
        raise OlderAd(
            f"ad from {ad.peer_id} has seq {ad.seq}, already saw {current.ad.seq}", ad.peer_id
        )
    return ad, signed.raw


class CapacityGossip:
    def __init__(
        self,
        host: MeshHost,
        peers: PeerTable,
        metrics: NodeMetrics,
        make_ad: Callable[[], bytes],
        publish_interval_s: float,
        cost: DiscoveryCost,
        gossip_own_ad: Callable[[], bool] = lambda: True,
        slow_refresh: Callable[[], bool] = lambda: False,
        shares_all_ads: Callable[[], bool] = lambda: True,
    ) -> None:
        self.host = host
        self.peers = peers
        self.metrics = metrics
        self._make_ad = make_ad
        self.publish_interval_s = publish_interval_s
        self.cost = cost
        self._wake = trio.Event()
        self._waiting: trio.CancelScope | None = None  # the publish loop's wait
        self._published_at = -math.inf  # trio time of the last ad published
        self._load_due = math.inf  # when a change of load is to be published
        self._load = self._published_load = 0  # the node's load now; in the last ad
        self._own_ad = make_ad()
        self._own_ad_at = time.monotonic()
        # False once directories say the network is large (`Registration.gossip_own_ad`)
        self.gossip_own_ad = gossip_own_ad
        # True for a directory in a large network: it refreshes its ad more slowly
        self.slow_refresh = slow_refresh
        # False in a large network: new connections get directories' ads only
        self.shares_all_ads = shares_all_ads
        for reason in REJECT_REASONS:  # export every series from the start, at 0
            metrics.ads_rejected.labels(reason)

    def changed(self) -> None:
        """The local ad changed (policy, capacity, availability): publish it now."""
        self._wake.set()

    def load_changed(self, load_pct: int) -> None:
        """Only the load changed, to `load_pct`: published `LOAD_SETTLE_S` from now (no
        sooner than `LOAD_AD_S` after the last ad) unless it is back to the load the
        last ad says by then."""
        self._load = load_pct
        due = max(trio.current_time() + LOAD_SETTLE_S, self._published_at + LOAD_AD_S)
        self._load_due = min(self._load_due, due)
        if self._waiting is not None:
            self._waiting.deadline = min(self._waiting.deadline, self._load_due)

    async def start(self) -> None:
        """Register the ad exchange and the validated subscription (before any dial).
        The peers restored from `node.db` go into the peerstore, so that a restarted
        node dials the peers it knew: a bootstrap node has no bootstrap of its own, and
        its peers wait a minute before redialling a connection they lost."""
        for entry in self.peers.entries():
            self.host.remember(entry.ad.peer_id, entry.ad.addrs)
        self.host.serve(ADS_PROTOCOL, self._serve_table, max_request=64)
        self.host.serve(PROBE_PROTOCOL, self._serve_probe, max_request=64)
        await self.host.subscribe(CAPACITY_TOPIC, self._validate_gossip)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop)
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._connection_loop, nursery)
            nursery.start_soon(self._expire_loop)

    # -- inbound -------------------------------------------------------------------

    def _validate_gossip(self, sender: str, data: bytes) -> bool:
        if sender == self.host.peer_id:
            return True
        self.cost.received(data)
        try:
            with self.cost.checking():
                check_ad(data, sender, self.peers, time.time())
        except DuplicateAd:
            return True  # let GossipSub forward it; the table already has it
        except ReplayedMessage:
            # a genuine, signed, fresh ad that lost a race with a newer one: py-libp2p's
            # validators can only accept or reject, and a rejection would dent the
            # forwarding peer's score for an honest reordering, so it passes and
            # `_receive_loop` (which checks again) does not use it
            self.metrics.ads_ignored.labels("out_of_order").inc()
            return True
        except ProtocolError as exc:
            self.metrics.ads_rejected.labels(exc.reason).inc()
            log.info("ad rejected from %s: %s (%s)", sender, exc.reason, exc)
            return False
        return True

    async def _receive_loop(self) -> None:
        async for sender, data in self.host.messages(CAPACITY_TOPIC):
            with self.cost.checking():
                try:
                    # checked again: another ad from the same peer may have landed since
                    ad, raw = check_ad(data, sender, self.peers, time.time())
                except ProtocolError:
                    continue
                self._ingest(ad, raw, via="gossip")

    def _ingest(self, ad: CapacityAd, raw: bytes, via: str) -> None:
        if ad.peer_id == self.host.peer_id:
            return
        change = self.peers.accept(ad, raw, via)
        if change is None:
            return
        self.metrics.ads_accepted.labels(via).inc()
        self.metrics.peers.set(len(self.peers))
        self.host.remember(ad.peer_id, ad.addrs)
        if change == "joined":
            devices = ", ".join(g.name for g in ad.gpus) or "no devices"
            log.info(
                "peer joined: %s (%s, %.3f TFLOP/s, load %d%%)",
                ad.peer_id,
                devices,
                ad.tflops,
                ad.load_pct,
            )

    def ingest_checked(self, data: bytes, sender: str | None, via: str) -> str:
        """Check an ad that came by request (a probe's answer: `sender` is the peer
        asked; a directory's copy: None) and take it if newer. The ad's peer id when
        the table now holds this very ad or a newer one of the peer, else ""."""
        with self.cost.checking():
            try:
                ad, raw = check_ad(data, sender, self.peers, time.time())
            except (DuplicateAd, OlderAd) as exc:
                if sender is not None:
                    self.peers.touch(sender, via)
                return exc.peer_id
            except ProtocolError as exc:
                self.metrics.ads_rejected.labels(exc.reason).inc()
                log.info("ad rejected (%s): %s (%s)", via, exc.reason, exc)
                return ""
            self._ingest(ad, raw, via=via)
            return ad.peer_id

    async def _serve_probe(self, peer: str, request: bytes) -> bytes:
        """This node's current ad, for an owner about to offer work (late binding)."""
        if time.monotonic() - self._own_ad_at > PROBE_FRESH_S:
            self._refresh_own_ad()
        self.cost.sent(self._own_ad, "probe")
        return self._own_ad

    def _refresh_own_ad(self) -> None:
        self._own_ad = self._make_ad()
        self._own_ad_at = time.monotonic()

    # -- ad exchange on connect ----------------------------------------------------

    async def _serve_table(self, peer: str, request: bytes) -> bytes:
        # in a large network ads reach owners through directories: hand on only
        # theirs, all a joiner needs (PeerTable.envelopes)
        shared = self.peers.envelopes(directories_only=not self.shares_all_ads())
        return encode([self._own_ad, *shared[: MAX_TABLE_ADS - 1]])

    async def _connection_loop(self, nursery: trio.Nursery) -> None:
        first = True
        async for event, peer in self.host.connection_events:
            self.metrics.connections.set(len(self.host.connected_peers()))
            if event == "connected":
                nursery.start_soon(self._fetch_table, peer, first)
                first = False
            else:
                log.debug("connection to %s closed", peer)

    async def _fetch_table(self, peer: str, publish_after: bool) -> None:
        await self._exchange_table(peer)
        if publish_after:
            # our first connection: publish so peers beyond this one learn of us now;
            # after the table, which names the directories, so that in a large
            # network the ad goes to them, not to everyone
            self.changed()

    async def _exchange_table(self, peer: str) -> None:
        try:
            raw = await self.host.request(peer, ADS_PROTOCOL, b"", _TABLE_LIMITS.max_bytes)
            self.cost.received(raw, "table")
            table = decode(raw, _TABLE_LIMITS)
            if not isinstance(table, list):
                raise ProtocolError("ad table is not a list")
        except (HostError, ProtocolError) as exc:
            log.debug("ad exchange with %s failed: %s", peer, exc)
            return
        with self.cost.checking(), self.peers.batch():
            self._ingest_table(table)

    def _ingest_table(self, table: list) -> None:
        now = time.time()
        for item in table:
            if not isinstance(item, bytes):
                continue
            try:
                ad, env = check_ad(item, None, self.peers, now)
            except ProtocolError as exc:
                # relayed tables hold older copies of ads we may have: not an attack
                if not isinstance(exc, ReplayedMessage | DuplicateAd):
                    self.metrics.ads_rejected.labels(exc.reason).inc()
                continue
            self._ingest(ad, env, via="exchange")

    # -- outbound ------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        while True:
            factor = DIRECTORY_TTL_FACTOR if self.slow_refresh() else 1
            refresh_at = trio.current_time() + self.publish_interval_s * factor
            with trio.CancelScope(deadline=min(refresh_at, self._load_due)) as self._waiting:
                await self._wake.wait()
            self._waiting, self._load_due = None, math.inf
            for_load = not self._wake.is_set() and trio.current_time() < refresh_at
            if for_load and self._load == self._published_load:
                continue  # back to what the last ad says: nothing to tell
            self._wake = trio.Event()
            self._refresh_own_ad()
            self._published_at, self._published_load = trio.current_time(), self._load
            if not self.gossip_own_ad():
                continue  # a large network: the ad goes to directories only
            try:
                await self.host.publish(CAPACITY_TOPIC, self._own_ad)
                self.metrics.ads_published.inc()
                self.cost.sent(self._own_ad)
            except Exception as exc:  # a failed publish must not stop the loop
                log.warning("publishing capacity ad failed: %s", exc)

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(min(1.0, self.peers.ttl_s / 4))
            for peer_id in self.peers.expire():
                log.info("peer left: %s (no ad for %.0f s)", peer_id, self.peers.ttl_s)
            self.metrics.peers.set(len(self.peers))
            self.cost.sample()
