"""Fixes for py-libp2p 0.8.1 bugs that NAT traversal runs into (docs/nat.md), and for
defaults that a large network cannot afford.

Applied once, before any host exists (`apply`). Each says what is broken, where, and
what we do instead; remove one when the library's release fixes it.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import multiaddr
import trio

_APPLIED = False
DIAL_BACK_TIMEOUT_S = 5.0
PEERSTORE_PEERS = 1 << 16  # peers a node remembers (the library: 1,000)
TASKS_PER_SERVICE = 1 << 16  # a service's child tasks, one per connected peer (1,000)


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _wake_readers_of_reset_yamux_streams()
    _a_circuit_ends_only_itself()
    _autonat_dials_back_on_a_new_connection()
    _no_auto_connector_dials()
    _no_wait_after_the_last_address()
    _room_for_many_peers()
    _APPLIED = True


def _wake_readers_of_reset_yamux_streams() -> None:
    """`Yamux._finalize_stream_locked` (yamux.py:974) drops a reset stream's event
    without setting it, so a task blocked in `read()` on it sleeps forever. A relay
    that ends a circuit at its byte or time limit resets both legs while one of its
    tasks reads: that task hangs and the circuit's slot is never given back, so after
    `max_circuit_conns` such ends the peer cannot be reached through that relay."""
    from libp2p.stream_muxer.yamux.yamux import Yamux

    original = Yamux._finalize_stream_locked

    def finalize(self: Any, stream: Any, *, fully_closed: bool) -> None:
        event = self.stream_events.get(stream.stream_id)
        original(self, stream, fully_closed=fully_closed)
        if event is not None and stream.stream_id not in self.stream_events:
            event.set()

    Yamux._finalize_stream_locked = finalize  # type: ignore[method-assign]


def _a_circuit_ends_only_itself() -> None:
    """A relay keeps one pair of streams per *peer* (`CircuitV2Protocol._active_relays`,
    protocol.py:672 and :722), overwritten by each new circuit of that peer, and a
    circuit that ends closes the pair stored under its two peers (protocol.py:928): so
    when any circuit of a peer ends, the relay closes that peer's newest circuit too,
    whoever is on its other end. An owner's hole punch to one NAT'd worker (its relayed
    connection is closed once the direct one stands) took down its relayed connection
    to another one, and an offer on it failed. Each circuit now closes its own two
    streams, and leaves the table only its own entries."""
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

    original = CircuitV2Protocol._relay_data

    class _OneCircuit:
        """The relay as `_relay_data` sees it: every attribute the relay's, except a
        table of active relays holding only this circuit."""

        def __init__(self, relay: Any, peer_id: Any, streams: tuple[Any, Any]) -> None:
            self._relay = relay
            self._active_relays = {peer_id: streams}

        def __getattr__(self, name: str) -> Any:
            return getattr(self._relay, name)

    async def relay_data(self: Any, src: Any, dst: Any, peer_id: Any, *args: Any) -> None:
        try:
            await original(_OneCircuit(self, peer_id, (src, dst)), src, dst, peer_id, *args)
        finally:
            stored = self._active_relays.get(peer_id)
            if stored is not None and stored[0] in (src, dst):
                del self._active_relays[peer_id]

    CircuitV2Protocol._relay_data = relay_data  # type: ignore[method-assign]


def _autonat_dials_back_on_a_new_connection() -> None:
    """AutoNAT's dial-back (autonat.py:396) calls `host.connect`, which returns the
    connection the asking peer already has open to us: every address passes, and a
    node behind a NAT is told it is public. Dial the address on a fresh connection,
    and close it again."""
    from libp2p.host.autonat.autonat import AutoNATService

    async def try_dial(self: Any, peer_id: Any, addrs: list[bytes]) -> bytes | None:
        network = self.host.get_network()
        for raw in addrs:
            try:
                with trio.fail_after(DIAL_BACK_TIMEOUT_S):
                    conn = await network.dial_addr(multiaddr.Multiaddr(raw), peer_id)
            except Exception:
                continue
            with suppress(Exception):
                await conn.close()
            return bytes(raw)
        return None

    AutoNATService._try_dial = try_dial  # type: ignore[method-assign]


def _no_auto_connector_dials() -> None:
    """The swarm's `AutoConnector` (auto_connector.py:262) dials peers from the
    peerstore until (low + high watermark) / 2 = 200 connections are open, every 30 s
    and after every disconnect. Every ad and table puts its peer in the peerstore, so
    every node of a 30- or 50-node network was connected to every other, at 18 ms of
    CPU a connection a minute, whatever `target_peers` said.
    `node/net/discovery/bootstrap.py` dials (to `target_peers`, with its own backoff and
    relays) and `node/net/connections.py` closes idle connections; the library dials
    nothing."""
    from libp2p.network.auto_connector import AutoConnector

    async def maybe_connect(self: Any) -> None:
        return None

    AutoConnector.maybe_connect = maybe_connect  # type: ignore[method-assign]


def _no_wait_after_the_last_address() -> None:
    """`Swarm.dial_peer` (swarm.py:935) gives each address it dials a 250 ms head start
    before it dials the next, and waits those 250 ms after the last one too, connected
    or not: every new connection took at least 250 ms, though the handshakes take about
    30 ms on loopback. The head start does not save a dial either (only a failure ends
    it early, so every selected address is dialled anyway), so all are dialled at once,
    and a dial returns when they have connected or failed. An owner probing candidates
    it is not connected to waited those 250 ms on every one."""
    import libp2p.network.swarm as swarm

    swarm._HAPPY_EYEBALLS_DELAY = 0.0


def _room_for_many_peers() -> None:
    """Two caps that end the node itself at about 1,000 peers, where a directory of a
    10,000-peer network holds 2,000 and an owner probes thousands over its life: the
    peerstore keeps 1,000 peers (peerstore.py) and evicts those without addresses
    first, this node's own entry among them, after which identify raises and the node
    exits; and a service's manager (anyio_service) allows 1,000 child tasks, Pubsub
    one per connected peer, beyond which the node exits with TooManyChildrenException.
    Both become 65,536."""
    from libp2p.peer.peerstore import PeerStore
    from libp2p.tools.anyio_service.manager import AnyIOManager
    from libp2p.tools.anyio_service.trio_manager import TrioManager

    for manager in (AnyIOManager, TrioManager):  # (max_children_per_task, logger)
        manager.__init__.__defaults__ = (TASKS_PER_SERVICE, None)
    store_init = PeerStore.__init__

    def roomy_store(self: Any, *args: Any, **kwargs: Any) -> None:
        store_init(self, 2 * PEERSTORE_PEERS, PEERSTORE_PEERS)  # (max_records, max_peers)

    PeerStore.__init__ = roomy_store  # type: ignore[method-assign]


def connection_options(max_connections: int) -> dict[str, Any]:
    """`new_host` options for a node that holds `max_connections` at once (a
    directory: one to each registrant): the swarm's own cap is 300 connections, 250
    of them inbound, and its resource manager's 256 established inbound ones.

    Not fixed yet: `Swarm._do_handle_inbound_connection` (swarm.py:2044) keeps its
    handler, and with it the inbound slot taken in `_handle_inbound_connection`
    (swarm.py:1982), until the swarm stops, whether or not the connection is still
    open, so a node takes `max_connections` - 50 inbound connections in its life:
    250 on a volunteer, 17,358 on a directory. The fix is a handler that ends with
    its connection; not done yet."""
    import libp2p.rcmgr as rcmgr
    from libp2p.network.config import ConnectionConfig
    from libp2p.rcmgr.connection_limits import ConnectionLimits

    config = ConnectionConfig(max_connections=max_connections, high_watermark=max_connections)
    limits = ConnectionLimits(
        max_pending_inbound=64,
        max_pending_outbound=64,
        max_established_inbound=max_connections,
        max_established_outbound=max_connections,
        max_established_per_peer=8,
        max_established_total=max_connections,
    )
    manager = rcmgr.new_resource_manager(
        limits=rcmgr.ResourceLimits(max_connections, 512, 4 * max_connections),
        connection_limits=limits,
    )
    return {"connection_config": config, "resource_manager": manager}
