"""Staying connected: bootstrap peers with retry and backoff, then peers learned from
ads and mDNS (both land in the peerstore) until `target_peers` are connected.

Bootstrap peers are a way in, not connections to hold: once `target_peers` are open, a
lost bootstrap connection is not redialled. A bootstrap node with every joiner of a
large network connected closes the idle ones (`node/net/connections.py`), and peers
that dialled it straight back would undo that every few seconds. For the same reason a
peer whose connection closed is not redialled for `LOST_WAIT_S` (a dead one would not
answer anyway), while this node still has other connections; except a peer behind a
NAT, whose relayed connection is redialled at once, as before (a relayed connection
drops more often, and work to and from such a peer needs it).

py-libp2p's mDNS only fills the peerstore; connecting is up to us, and every dial
costs both ends a handshake's CPU (about 11 ms each), so dials are few and failures
back off.
"""

from __future__ import annotations

import logging
import time

import trio

from node.net.host import HostError, MeshHost

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
SCAN_INTERVAL_S = 2.0
MAX_DIALS = 4  # discovered peers dialled at once
LOST_WAIT_S = 60.0


async def keep_connected(host: MeshHost, bootstrap: list[str], target_peers: int) -> None:
    async with trio.open_nursery() as nursery:
        for addr in bootstrap:
            nursery.start_soon(_keep_bootstrap, host, addr, target_peers)
        nursery.start_soon(_fill_from_peerstore, host, target_peers)


async def _keep_bootstrap(host: MeshHost, addr: str, target_peers: int) -> None:
    """Connect to one bootstrap address; retry with exponential backoff; reconnect
    while fewer than `target_peers` (at least one) connections are open."""
    delay = BACKOFF_START_S
    peer_id = addr.rsplit("/p2p/", 1)[-1]
    was_connected = False
    while True:
        connected = host.connected_peers()
        if peer_id in connected or len(connected) >= max(target_peers, 1):
            was_connected = peer_id in connected
            delay = BACKOFF_START_S
            await trio.sleep(SCAN_INTERVAL_S)
            continue
        if was_connected and connected:
            was_connected = False
            await trio.sleep(LOST_WAIT_S)
            continue
        host.allow_redial(peer_id)  # our backoff paces the dials, not libp2p's 60 s cache
        try:
            await host.connect(addr)
            log.info("connected to bootstrap peer %s", addr)
            delay = BACKOFF_START_S
        except HostError as exc:
            log.warning("bootstrap %s: %s; retrying in %.0f s", addr, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)


async def _fill_from_peerstore(host: MeshHost, target_peers: int) -> None:
    """Dial peers the peerstore knows, several at once: a dial to a peer behind a NAT
    waits out its private address before going through a relay."""
    retry_at: dict[str, tuple[float, float]] = {}  # peer -> (next try, backoff)
    dialling: set[str] = set()

    async def dial(peer_id: str) -> None:
        host.allow_redial(peer_id)
        try:
            await host.connect_known(peer_id)
            retry_at.pop(peer_id, None)
            log.debug("connected to discovered peer %s", peer_id)
        except HostError as exc:
            backoff = min(retry_at.get(peer_id, (0.0, BACKOFF_START_S / 2))[1] * 2, BACKOFF_MAX_S)
            retry_at[peer_id] = (time.monotonic() + backoff, backoff)
            log.debug("dial %s failed: %s", peer_id, exc)
        finally:
            dialling.discard(peer_id)

    before: set[str] = set()
    async with trio.open_nursery() as nursery:
        while True:
            await trio.sleep(SCAN_INTERVAL_S)
            connected = host.connected_peers()
            now = time.monotonic()
            for lost in before - connected:
                if not host.behind_nat(lost):  # a relayed connection is mended at once
                    retry_at[lost] = (now + LOST_WAIT_S, BACKOFF_START_S)
            before = connected
            for peer_id in host.known_dialable_peers():
                if len(connected) + len(dialling) >= target_peers or len(dialling) >= MAX_DIALS:
                    break
                if peer_id in connected or peer_id in dialling:
                    continue
                if retry_at.get(peer_id, (0.0, 0.0))[0] > now:
                    continue
                dialling.add(peer_id)
                nursery.start_soon(dial, peer_id)
