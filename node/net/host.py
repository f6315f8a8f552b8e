"""Our one wrapper around py-libp2p 0.8.1: lifecycle, pubsub and request/response.

It owns the library's traps (docs/architecture.md, "py-libp2p traps"):
- Pubsub and GossipSub run *before* any connect (a constructed but idle Pubsub
  makes `connect()` hang).
- Leaving `host.run()` does not close the TCP listener, so shutdown closes the host
  and its network explicitly: a dial to a stopped node must fail.
- GossipSub silently drops more than 10 msgs/s per peer and topic by default; the
  limit is set from `gossip_rate_limit` on purpose. The heartbeat defaults to 120 s
  (and "adaptive gossip" stretches it to 30-60 s); meshes form on a fixed 1 s here.
- The TCP listener sets SO_REUSEPORT, so a second node on the same port would start
  and share the connections: `start` refuses a port that is already in use.
- A node receives its own publishes: `messages()` filters them out.
- Subscription queues hold 32 messages then drop: `messages()` is meant to be
  consumed by a task that does no I/O per message beyond quick table updates.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import INetConn, INetStream, INotifee
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.address_validation import expand_wildcard_address

from node.identity import Identity
from node.net import libp2p_fixes
from node.net.inbound import InboundLimiter
from node.net.reachability import ReachabilityProbe
from node.net.relay import Relay, RelayOptions, is_circuit
from protocol import TooLarge

log = logging.getLogger(__name__)

GOSSIPSUB_PROTOCOLS = [TProtocol("/meshsub/1.1.0"), TProtocol("/meshsub/1.2.0")]
_LEN = struct.Struct(">I")
RELAY_AFTER_S = 0.5  # a NAT'd peer's relay is dialled this long after its own addresses

Handler = Callable[[str, bytes], Awaitable[bytes]]
StreamHandler = Callable[[str, INetStream], Awaitable[None]]


class HostError(Exception):
    """A dial, stream or request failed; the message says which peer and why."""


class _ConnectionWatcher(INotifee):
    """Forwards connection events into a trio channel (notifees must not block), and
    notes when each peer last opened a stream (`MeshHost.connection_idle_s`)."""

    def __init__(
        self, send: trio.MemorySendChannel[tuple[str, str]], last_stream: dict[str, float]
    ) -> None:
        self._send = send
        self._last_stream = last_stream

    def _emit(self, event: str, conn: INetConn) -> None:
        with suppress(trio.WouldBlock, trio.ClosedResourceError, AttributeError):
            self._send.send_nowait((event, conn.muxed_conn.peer_id.to_base58()))

    def _touch(self, conn_or_stream: INetConn | INetStream) -> None:
        with suppress(AttributeError):
            peer = conn_or_stream.muxed_conn.peer_id.to_base58()
            self._last_stream[peer] = trio.current_time()

    async def connected(self, network, conn) -> None:  # type: ignore[override]
        self._touch(conn)
        self._emit("connected", conn)

    async def disconnected(self, network, conn) -> None:  # type: ignore[override]
        self._emit("disconnected", conn)

    async def opened_stream(self, network, stream) -> None:  # type: ignore[override]
        self._touch(stream)

    async def closed_stream(self, network, stream) -> None:  # type: ignore[override]
        pass

    async def listen(self, network, multiaddr) -> None:  # type: ignore[override]
        pass

    async def listen_close(self, network, multiaddr) -> None:  # type: ignore[override]
        pass


class MeshHost:
    """A running libp2p host with GossipSub. Use `async with MeshHost.start(...)`."""

    def __init__(
        self,
        identity: Identity,
        listen: str,
        gossip_rate_limit: float,
        mdns: bool,
        relay: RelayOptions,
        reachability: str,
        max_connections: int | None,
    ) -> None:
        libp2p_fixes.apply()  # before the library builds anything
        self.identity = identity
        self._inbound = InboundLimiter()
        self._listen = multiaddr.Multiaddr(listen)
        key_pair = create_new_key_pair(identity.seed)
        roomy = libp2p_fixes.connection_options(max_connections) if max_connections else {}
        self._host = new_host(
            key_pair=key_pair, listen_addrs=[self._listen], enable_mDNS=mdns, **roomy
        )
        self._gossipsub = GossipSub(
            protocols=GOSSIPSUB_PROTOCOLS,
            degree=6,
            degree_low=4,
            degree_high=12,
            heartbeat_interval=1,
            # "adaptive gossip" re-scores network health every 30 s and, on small or
            # quiet networks, stretches the heartbeat to 30-60 s: meshes would then
            # repair only once a minute. Keep the 1 s heartbeat.
            adaptive_gossip_enabled=False,
            max_messages_per_topic_per_second=gossip_rate_limit,
        )
        self._pubsub = Pubsub(self._host, self._gossipsub, strict_signing=True)
        self._events_send, self.connection_events = trio.open_memory_channel[tuple[str, str]](256)
        self._last_stream: dict[str, float] = {}  # peer -> when it last opened a stream
        watcher = _ConnectionWatcher(self._events_send, self._last_stream)
        self._host.get_network().register_notifee(watcher)
        self.peer_id = identity.peer_id
        self._subscriptions: dict[str, object] = {}
        self.relay = Relay(self._host, relay)
        self.reachability = ReachabilityProbe(self._host, reachability)
        self._circuits: dict[str, list[str]] = {}  # peer -> circuit addresses it advertised

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        identity: Identity,
        listen: str,
        *,
        gossip_rate_limit: float = 20.0,
        mdns: bool = False,
        relay: RelayOptions | None = None,
        reachability: str = "auto",
        max_connections: int | None = None,
    ) -> AsyncIterator[MeshHost]:
        """`max_connections`: above the library's 300 (a directory holds one to each
        of its registrants)."""
        _refuse_port_in_use(listen)
        mesh = cls(
            identity,
            listen,
            gossip_rate_limit,
            mdns,
            relay or RelayOptions(),
            reachability,
            max_connections,
        )
        try:
            async with (
                mesh._host.run(listen_addrs=[mesh._listen]),
                background_trio_service(mesh._pubsub),
                background_trio_service(mesh._gossipsub),
                mesh.relay.running(),
            ):
                await mesh._pubsub.wait_until_ready()
                try:
                    yield mesh
                finally:
                    # connections go before Pubsub stops: a message arriving while it
                    # stops made the library raise "Nursery is closed to new arrivals"
                    # out of trio.run, and the node exited with code 1
                    await mesh._close()
        finally:
            await mesh._close()  # also when starting failed; a second call does nothing

    async def _close(self) -> None:
        """Close the host (its connections, then its listener), shielded, at most 3 s."""
        with trio.CancelScope(shield=True), trio.move_on_after(3):
            await self._close_host()

    async def _close_host(self) -> None:
        try:
            await self._host.close()
        except Exception as exc:  # closing must never mask the reason we are leaving
            log.debug("host close: %s", exc)
        await self._events_send.aclose()

    # -- addresses and peers -------------------------------------------------------

    def addrs(self) -> list[str]:
        """Full multiaddrs others can dial, each ending in /p2p/<peer id>."""
        out = []
        for listen_addr in self._host.get_addrs():
            # a wildcard listen (0.0.0.0, ::) is not dialable: advertise each interface
            for addr in expand_wildcard_address(listen_addr):
                text = str(addr)
                if "/p2p/" not in text:
                    text = f"{text}/p2p/{self.peer_id}"
                out.append(text)
        return out + list(self.relay.reservations.values())

    def observed_addrs(self) -> list[str]:
        """The addresses peers see us at (identify), without our peer id."""
        manager = getattr(self._host, "_observed_addr_manager", None)
        if manager is None:
            return []
        with suppress(Exception):
            return sorted({str(a) for a in manager.addrs(min_observers=1)})
        return []

    def connected_peers(self) -> set[str]:
        return {p.to_base58() for p in self._host.get_connected_peers()}

    def behind_nat(self, peer_id: str) -> bool:
        """The peer advertised circuit addresses: it is reached through relays."""
        return bool(self._circuits.get(peer_id))

    def connection_idle_s(self) -> dict[str, float]:
        """Each connected peer: seconds since it last opened a stream (either way) or
        connected; 0 while a stream other than GossipSub's is open (a circuit, a
        transfer, a request in flight). Peers no longer connected are forgotten here."""
        now = trio.current_time()
        network = self._host.get_network()
        idle = {}
        for pid in self._host.get_connected_peers():
            peer = pid.to_base58()
            streams = (s for c in network.get_connections(pid) for s in c.get_streams())
            if any(s.get_protocol() not in GOSSIPSUB_PROTOCOLS for s in streams):
                idle[peer] = 0.0
            else:
                idle[peer] = now - self._last_stream.get(peer, now)
        for gone in self._last_stream.keys() - idle.keys():
            del self._last_stream[gone]
        return idle

    async def disconnect(self, peer_id: str) -> None:
        """Close every connection to `peer_id` (best effort: it may be closing already)."""
        try:
            await self._host.disconnect(ID.from_base58(peer_id))
        except Exception as exc:
            log.debug("disconnect %s: %s", peer_id, exc)

    def known_dialable_peers(self) -> dict[str, list[str]]:
        """Peers in the peerstore with addresses (filled by mDNS and by `remember`)."""
        store = self._host.get_peerstore()
        out = {}
        for pid in store.peers_with_addrs():
            if pid.to_base58() != self.peer_id:
                out[pid.to_base58()] = [str(a) for a in store.addrs(pid)]
        return out

    def remember(self, peer_id: str, addrs: list[str]) -> None:
        """Put a peer's addresses in the peerstore so it can be dialled later (its
        circuit addresses beside it: the peerstore's dialler cannot use them)."""
        circuits = [a for a in addrs if is_circuit(a) and a.endswith(f"/p2p/{peer_id}")]
        if circuits:
            self._circuits[peer_id] = circuits
        maddrs = []
        for text in addrs:
            if is_circuit(text):
                continue
            try:
                maddr = multiaddr.Multiaddr(text.split("/p2p/")[0])
            except Exception:
                continue
            maddrs.append(maddr)
        if maddrs:
            self._host.get_peerstore().add_addrs(ID.from_base58(peer_id), maddrs, 3600)

    async def connect(self, addr: str) -> str:
        """Dial a full multiaddr (with /p2p/<id>); returns the peer id."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            raise HostError(
                f"{addr!r} is not a dialable multiaddr ending in /p2p/<peer id>"
            ) from exc
        if is_circuit(addr):
            await self._dial_circuits([addr], addr)
        else:
            await self._dial(info, addr)
        return info.peer_id.to_base58()

    async def connect_known(self, peer_id: str) -> None:
        """Dial a peer whose addresses are in the peerstore, and through a relay when it
        advertised one (behind a NAT): the relay `RELAY_AFTER_S` after the direct dial,
        whichever connects first wins. A probe has 3 s: waiting out a direct dial to a
        NAT'd peer's private addresses first left it none for the relay."""
        pid = ID.from_base58(peer_id)
        addrs = self._direct_addrs(peer_id)
        circuits = self._circuits.get(peer_id)
        if not circuits:
            if not addrs:
                raise HostError(f"no direct address of {peer_id} is known")
            await self._dial(PeerInfo(pid, addrs), peer_id, 5.0)
            return
        errors: list[str] = []
        won = False

        async def attempt(dial: Callable[[], Awaitable[None]], delay: float) -> None:
            nonlocal won
            await trio.sleep(delay)
            try:
                await dial()
            except HostError as exc:
                errors.append(str(exc))
                return
            won = True
            race.cancel_scope.cancel()

        async with trio.open_nursery() as race:
            if addrs:
                direct = PeerInfo(pid, addrs)
                race.start_soon(attempt, lambda: self._dial(direct, peer_id, 3.0), 0.0)
            relayed = RELAY_AFTER_S if addrs else 0.0
            race.start_soon(attempt, lambda: self._dial_circuits(circuits, peer_id), relayed)
        if not won:
            raise HostError("; ".join(errors))

    async def _dial(self, info: PeerInfo, label: str, timeout: float = 10.0) -> None:
        try:
            with trio.fail_after(timeout):
                await self._host.connect(info)
        except Exception as exc:
            raise HostError(f"could not connect to {label}: {type(exc).__name__}: {exc}") from exc

    async def _dial_circuits(self, circuits: list[str], label: str) -> None:
        errors = []
        for circuit in circuits:
            try:
                await self.relay.dial(circuit)
                return
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        raise HostError(f"could not connect to {label} through a relay: {'; '.join(errors)}")

    async def reach(self, peer_id: str) -> None:
        """Be connected to `peer_id`: directly if we can, else through a relay it
        advertised. Raises `HostError`."""
        if peer_id in self.connected_peers():
            return
        await self.connect_known(peer_id)

    @property
    def relaying(self) -> bool:
        """This node relays for peers behind NATs now: it may, and it is public."""
        return self.relay.options.serve and self.reachability.now.state == "public"

    def path_to(self, peer_id: str) -> str:
        """ "direct", "relayed" or "none": how we are connected to `peer_id` now."""
        return self.relay.path(peer_id)

    # -- gossip ----------------------------------------------------------------------

    async def subscribe(self, topic: str, validator: Callable[[str, bytes], bool]) -> None:
        """Subscribe to `topic`; `validator(sender_peer_id, data)` runs before delivery."""

        def _validate(forwarder: ID, msg) -> bool:
            return validator(ID(msg.from_id).to_base58(), msg.data)

        self._pubsub.set_topic_validator(topic, _validate, False)
        self._subscriptions[topic] = await self._pubsub.subscribe(topic)

    async def unsubscribe(self, topic: str) -> None:
        """Leave `topic`: its messages are no longer delivered, forwarded or paid for,
        and `messages(topic)` ends. Peers are told, so they stop sending them."""
        if self._subscriptions.pop(topic, None) is not None:
            await self._pubsub.unsubscribe(topic)

    async def messages(self, topic: str) -> AsyncIterator[tuple[str, bytes]]:
        """Validated messages on `topic` from other peers: (sender peer id, data),
        until `unsubscribe(topic)`."""
        subscription = self._subscriptions[topic]
        while True:
            try:
                msg = await subscription.get()  # type: ignore[attr-defined]
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            sender = ID(msg.from_id).to_base58()
            if sender != self.peer_id:
                yield sender, msg.data

    async def publish(self, topic: str, data: bytes) -> None:
        await self._pubsub.publish(topic, data)

    def topic_peers(self, topic: str) -> int:
        return len(self._pubsub.peer_topics.get(topic, ()))

    # -- request/response streams --------------------------------------------------

    def serve(
        self, protocol: str, handler: Handler, max_request: int, timeout: float = 30.0
    ) -> None:
        """Answer one length-prefixed request per stream on `protocol`."""

        async def answer(peer: str, stream: INetStream) -> None:
            with trio.fail_after(timeout):
                request = await read_frame(stream, max_request)
                await write_frame(stream, await handler(peer, request))

        self.serve_stream(protocol, answer, quiet=True)

    async def request(
        self, peer_id: str, protocol: str, data: bytes, max_response: int, timeout: float = 15.0
    ) -> bytes:
        """Open a stream, send one request, read one bounded response."""
        try:
            with trio.fail_after(timeout):
                await self._reach_by_relay(peer_id)
                stream = await self._new_stream(peer_id, protocol)
                try:
                    await write_frame(stream, data)
                    return await read_frame(stream, max_response)
                finally:
                    await stream.close()
        except TooLarge:
            raise
        except Exception as exc:
            raise HostError(
                f"{protocol} request to {peer_id} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _new_stream(self, peer_id: str, protocol: str) -> INetStream:
        """A stream to the peer; its connections dropped and dialled again once when
        every one has closed (py-libp2p keeps closed connections listed and refuses a
        stream then instead of dialling: "No valid connections")."""
        pid = ID.from_base58(peer_id)
        network = self._host.get_network()
        listed = network.connections.get(pid) or []
        if listed and all(conn.is_closed for conn in listed):
            await network.close_peer(pid)
        return await self._host.new_stream(pid, [TProtocol(protocol)])

    async def _reach_by_relay(self, peer_id: str) -> None:
        """Before a stream to a peer we are not connected to that advertises circuit
        addresses (it is behind a NAT): dial it, its own addresses briefly and then
        through its relays (libp2p's own dial cannot use circuits)."""
        if self._circuits.get(peer_id) and peer_id not in self.connected_peers():
            self.allow_redial(peer_id)
            await self.connect_known(peer_id)

    def _direct_addrs(self, peer_id: str) -> list[multiaddr.Multiaddr]:
        try:
            return list(self._host.get_peerstore().addrs(ID.from_base58(peer_id)))
        except Exception:  # the peerstore raises for a peer it has no entry for
            return []

    @property
    def listen_ip(self) -> str:
        """The IP address of the listen multiaddr (other channels bind it too)."""
        for proto in ("ip4", "ip6"):
            try:
                return self._listen.value_for_protocol(proto)
            except Exception:
                continue
        return "127.0.0.1"

    def allow_redial(self, peer_id: str) -> None:
        """Forget that dialling `peer_id` failed recently: py-libp2p refuses to dial a
        peer for 60 s after one failed attempt, too long for a peer we must reach
        again (an owner that restarted)."""
        with suppress(Exception):
            self._host.get_network().unblock_peer(ID.from_base58(peer_id))

    def serve_stream(self, protocol: str, handler: StreamHandler, quiet: bool = False) -> None:
        """Hand each incoming stream on `protocol` to `handler(remote peer id, stream)`.

        For exchanges that are more than one small request and response (bulk blob
        transfer): the handler reads and writes the raw stream itself, with its own
        size bounds and timeouts. The peer id is the one libp2p authenticated (Noise
        handshake), so the handler may rely on it. When the handler returns, the stream
        is closed; if it raises, the error is logged (at debug level when `quiet`) and
        the stream reset. Streams past the per-peer and total caps (`InboundLimiter`)
        are reset before the handler sees them."""
        level = logging.DEBUG if quiet else logging.INFO

        async def _on_stream(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id.to_base58()
            with self._inbound.slot(peer, protocol) as admitted:
                if not admitted:
                    with suppress(Exception):
                        await stream.reset()
                    return
                try:
                    await handler(peer, stream)
                except Exception as exc:
                    log.log(
                        level,
                        "%s stream from %s failed: %s: %s",
                        protocol,
                        peer,
                        type(exc).__name__,
                        exc,
                    )
                    with suppress(Exception):
                        await stream.reset()
                    return
                with suppress(Exception):
                    await stream.close()

        self._host.set_stream_handler(TProtocol(protocol), _on_stream)

    async def open_stream(
        self, peer_id: str, protocol: str, *, timeout: float = 15.0
    ) -> INetStream:
        """Open a stream to `peer_id` on `protocol` (dialling it if needed) for the caller
        to read and write; the caller closes or resets it. Raises `HostError`."""
        try:
            pid = ID.from_base58(peer_id)
        except Exception as exc:
            raise HostError(f"{peer_id[:80]!r} is not a peer id") from exc
        try:
            with trio.fail_after(timeout):
                await self._reach_by_relay(peer_id)
                return await self._host.new_stream(pid, [TProtocol(protocol)])
        except Exception as exc:
            raise HostError(
                f"could not open a {protocol} stream to {peer_id}: {type(exc).__name__}: {exc}"
            ) from exc


def _refuse_port_in_use(listen: str) -> None:
    """Bind the TCP port once without SO_REUSEPORT: fails if any socket listens on it."""
    maddr = multiaddr.Multiaddr(listen)
    port = int(maddr.value_for_protocol("tcp") or 0)
    if port == 0:
        return
    family, host = socket.AF_INET, "0.0.0.0"
    for proto, value in (("ip4", socket.AF_INET), ("ip6", socket.AF_INET6)):
        try:
            host, family = maddr.value_for_protocol(proto), value
            break
        except Exception:
            continue
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR lets the probe bind over TIME_WAIT leftovers of our own previous
        # run (a restart), but not over a socket that is listening now
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise HostError(
                f"cannot listen on {listen}: {exc.strerror}. Is another node using this "
                "port? Pick another with --listen."
            ) from exc


async def write_frame(stream: INetStream, data: bytes) -> None:
    await stream.write(_LEN.pack(len(data)) + data)


async def read_frame(stream: INetStream, limit: int) -> bytes:
    """Read one length-prefixed frame, refusing (before reading it) one over `limit`."""
    (length,) = _LEN.unpack(await _read_exactly(stream, _LEN.size))
    if length > limit:
        raise TooLarge(f"frame of {length} bytes exceeds the {limit}-byte limit")
    return await _read_exactly(stream, length)


async def _read_exactly(stream: INetStream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            raise HostError(f"stream closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
