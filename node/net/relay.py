"""Reaching peers behind NATs: circuit relay v2 and hole punching (DCUtR) on our host.

py-libp2p 0.8.1 ships the protocols but not the wiring (docs/nat.md has what was
measured): `host.connect` refuses `/p2p-circuit` addresses, so circuits are dialled
through the relay transport here; reservations are made explicitly (the library's
auto-reserve looks at peers only every 5 minutes) and made again when the relay
connection drops; DCUtR gets a 3 s dial timeout (its 10 s default goes on a
futile dial of the peer's private LAN address before every hole punch), and a hole
punch starts with every relayed dial (the library's own loop punches one peer at a
time). The library gives up on a peer after three tries until the connection drops;
both ends try at once and refuse each other's session while their own runs, and a
loaded machine misses a try's timing, so a peer still reached only through a relay is
punched again after `REPUNCH_FIRST_S`, then at doubling waits up to `REPUNCH_MAX_S`
(behind a symmetric NAT none will succeed; one try in minutes costs a few dials).

Every node answers circuits (the STOP side); a node serves as a relay (HOP) when its
settings say so, within `RelayOptions` limits.
"""

from __future__ import annotations

import logging
import random
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service

from node.net import libp2p_fixes

log = logging.getLogger(__name__)

CIRCUIT = "/p2p-circuit"
RESERVATION_TTL_S = 600  # a relay forgets a reservation not refreshed this long
DIAL_TIMEOUT_S = 10.0
HOLE_PUNCH_DIAL_TIMEOUT_S = 3
REPUNCH_FIRST_S = 10.0  # after the library's own tries are spent
REPUNCH_MAX_S = 300.0
REPUNCH_SCAN_S = 2.0


@dataclass(frozen=True)
class RelayOptions:
    """What this node does for others as a relay (`serve`), and within which limits."""

    serve: bool = False
    max_reservations: int = 64  # peers that may hold a slot here at once
    max_circuits: int = 8  # circuits to one peer at once
    circuit_bytes: int = 1 << 30  # per circuit, both ways (never 0: the library reads 0 as none)
    circuit_s: int = 3600  # per circuit


def is_circuit(addr: str) -> bool:
    return CIRCUIT in addr


#: the paths of `Relay.path`, as a job's timeline says them
PATH_WORDS = {"direct": "direct connection", "relayed": "through a relay", "none": "not connected"}


def stream_path(stream: Any) -> str:
    """ "direct" or "relayed": the path of the connection `stream` runs on."""
    return "direct" if _is_direct(stream.muxed_conn) else "relayed"


def _is_direct(conn: Any) -> bool:
    try:
        return not any(is_circuit(str(a)) for a in conn.get_transport_addresses())
    except Exception:  # a connection closing under us
        return False


class Relay:
    """The relay and hole-punching protocols of one host, and our reservations."""

    def __init__(self, host: IHost, options: RelayOptions) -> None:
        libp2p_fixes.apply()
        self._host = host
        self.options = options
        limits = RelayLimits(
            duration=options.circuit_s,
            data=max(1, options.circuit_bytes),
            max_circuit_conns=options.max_circuits,
            max_reservations=options.max_reservations,
            reservation_ttl=RESERVATION_TTL_S,
        )
        self._protocol = CircuitV2Protocol(host, limits=limits, allow_hop=options.serve)
        # STOP only: with CLIENT, every dial through a relay would also reserve a slot there
        self._transport = CircuitV2Transport(
            host, self._protocol, RelayConfig(roles=RelayRole.STOP)
        )
        self._dcutr = DCUtRProtocol(host, dial_timeout=HOLE_PUNCH_DIAL_TIMEOUT_S)
        self._nursery: trio.Nursery | None = None
        self.reservations: dict[str, str] = {}  # relay peer id -> our circuit address there

    @asynccontextmanager
    async def running(self) -> Any:
        async with (
            background_trio_service(self._protocol),
            background_trio_service(self._dcutr),
            trio.open_nursery() as nursery,
        ):
            await self._protocol.event_started.wait()
            self._nursery = nursery  # the reservations' refreshers run here
            nursery.start_soon(self._punch_again)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    async def reserve(self, relay_addr: str) -> str:
        """Hold a slot on the relay at `relay_addr` (connected already); returns our
        circuit address there. Raises `RuntimeError` when the relay refuses."""
        assert self._nursery is not None, "reserve inside running()"
        relay_id = relay_addr.rsplit("/p2p/", 1)[-1]
        pid = ID.from_base58(relay_id)
        with trio.fail_after(DIAL_TIMEOUT_S):
            stream = await self._host.new_stream(pid, [HOP_PROTOCOL])
            try:
                ok = await self._transport.reserve(stream, pid, self._nursery)
            finally:
                with suppress(Exception):
                    await stream.close()
        if not ok:
            raise RuntimeError(f"relay {relay_id} refused a reservation")
        circuit = f"{relay_addr}{CIRCUIT}/p2p/{self._host.get_id()}"
        self.reservations[relay_id] = circuit
        return circuit

    async def dial(self, circuit: str) -> None:
        """Connect to a peer through the relay its circuit address names, and start
        a hole punch to it at once."""
        with trio.fail_after(DIAL_TIMEOUT_S):
            conn = await self._transport.dial(multiaddr.Multiaddr(circuit))
        if self._nursery is not None:
            self._nursery.start_soon(self._punch, conn.muxed_conn.peer_id)

    async def _punch(self, peer: ID) -> None:
        """The library drives hole punches itself, but one peer at a time: behind a
        peer whose NAT defeats them (three rounds of 5 s, three times) the others
        wait a minute. Ours run side by side, one per relayed dial."""
        with suppress(Exception):
            await self._dcutr.initiate_hole_punch(peer)

    async def _punch_again(self) -> None:
        """Punch again, at growing waits, to each peer reached only through a relay
        whose tries the library has spent (it resets them only when the peer
        disconnects). The waits are jittered so that the two ends do not collide."""
        due: dict[ID, tuple[float, float]] = {}  # peer -> (when, the wait after that)
        while True:
            await trio.sleep(REPUNCH_SCAN_S)
            now = trio.current_time()
            spent = set(self._spent_relayed_peers())
            for peer in set(due) - spent:
                del due[peer]
            for peer in spent:
                when, wait = due.setdefault(peer, (now + _jitter(REPUNCH_FIRST_S), REPUNCH_FIRST_S))
                if now < when:
                    continue
                wait = min(wait * 2, REPUNCH_MAX_S)
                due[peer] = (now + _jitter(wait), wait)
                log.debug("hole punch to %s again (next in about %.0f s)", peer, wait)
                self._dcutr._hole_punch_attempts.pop(peer, None)
                self._nursery.start_soon(self._punch, peer)

    def _spent_relayed_peers(self) -> list[ID]:
        attempts = self._dcutr._hole_punch_attempts
        return [
            peer
            for peer, count in list(attempts.items())
            if count >= MAX_HOLE_PUNCH_ATTEMPTS
            and peer not in self._dcutr._in_progress
            and self.path(peer.to_base58()) == "relayed"
        ]

    def punching(self, peer_id: str) -> bool:
        """A hole punch with `peer_id` is under way (either side began it)."""
        with suppress(Exception):
            return ID.from_base58(peer_id) in self._dcutr._in_progress
        return False

    def remote_ips(self, peer_id: str) -> set[str]:
        """The IPs our direct connections to `peer_id` reach it at."""
        ips = set()
        for conn in self._connections(peer_id):
            with suppress(Exception):
                for addr in conn.get_transport_addresses():
                    if not is_circuit(str(addr)):
                        ips.add(addr.value_for_protocol("ip4"))
        return ips

    def _connections(self, peer_id: str) -> list[Any]:
        conns = self._host.get_network().connections.get(ID.from_base58(peer_id)) or []
        return conns if isinstance(conns, list) else [conns]

    def path(self, peer_id: str) -> str:
        """How we are connected to `peer_id` now: "direct", "relayed" or "none"."""
        conns = self._connections(peer_id)
        if not conns:
            return "none"
        return "direct" if any(_is_direct(conn) for conn in conns) else "relayed"


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.75, 1.25)
