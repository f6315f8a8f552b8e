"""Circuit relay v2 on our host, in process on loopback: a peer known only by its
circuit address is reached through the relay, a request works over it, and the hole
punch begun with the relayed dial upgrades the connection to a direct one, or a later
one when the library's own tries are spent. (Through real NATs, in network namespaces:
tests/netlab/.)"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import MAX_HOLE_PUNCH_ATTEMPTS, DCUtRProtocol
from nacl.signing import SigningKey

from node.demo.localnet import free_port
from node.identity import Identity
from node.net import relay as relay_module
from node.net.host import MeshHost
from node.net.relay import RelayOptions


def _identity() -> Identity:
    return Identity(SigningKey(os.urandom(32)))


def _listen() -> str:
    return f"/ip4/127.0.0.1/tcp/{free_port()}"


@asynccontextmanager
async def _behind_relay() -> AsyncIterator[tuple[MeshHost, MeshHost, MeshHost, str]]:
    """A relay, a hidden host holding a slot there, and a dialer; the hidden host's
    circuit address."""
    async with (
        MeshHost.start(_identity(), _listen(), relay=RelayOptions(serve=True)) as relay,
        MeshHost.start(_identity(), _listen()) as hidden,
        MeshHost.start(_identity(), _listen()) as dialer,
    ):
        await hidden.connect(relay.addrs()[0])
        circuit = await hidden.relay.reserve(relay.addrs()[0])
        yield relay, hidden, dialer, circuit


async def _until_direct(dialer: MeshHost, peer_id: str, seconds: float) -> None:
    with trio.fail_after(seconds):
        while dialer.path_to(peer_id) != "direct":
            await trio.sleep(0.1)


@pytest.mark.process  # libp2p hosts
def test_a_peer_known_only_by_its_circuit_address_is_reached_through_the_relay(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[bytes, str, str, str]:
        async with _behind_relay() as (relay, hidden, dialer, circuit):
            assert circuit in hidden.addrs()

            async def answer(peer: str, data: bytes) -> bytes:
                return b"hidden got " + data + b" from " + peer.encode()

            hidden.serve("/test/ask/1", answer, max_request=64)
            dialer.remember(hidden.peer_id, [circuit])  # as an ad would tell it
            with trio.fail_after(20):
                reply = await dialer.request(hidden.peer_id, "/test/ask/1", b"hi", 128)
            first = dialer.path_to(hidden.peer_id)
            await _until_direct(dialer, hidden.peer_id, 15)  # the punch begun with the dial
            status = await dialer.reachability.check([relay.peer_id])
            return reply, first, circuit, status.state

    reply, path, circuit, reachable = trio.run(main)
    assert reply.startswith(b"hidden got hi from ")
    assert path in ("relayed", "direct"), circuit  # direct once the punch is through
    assert reachable == "public"  # on loopback the relay's dial-back reaches the dialer


@pytest.mark.process  # libp2p hosts
def test_a_circuit_that_ends_leaves_the_relays_other_circuits_to_that_peer_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two peers reach a hidden one through the same relay; the first's circuit ends.
    The relay once kept one circuit per peer and closed the peer's newest with any
    that ended (node/net/libp2p_fixes.py): the second peer's circuit went down with it.
    No hole punch here, so that both connections stay relayed."""

    async def no_punch(self: DCUtRProtocol, peer_id: ID) -> bool:
        return False

    monkeypatch.setattr(DCUtRProtocol, "initiate_hole_punch", no_punch)

    async def main() -> tuple[bytes, int, str]:
        async with (
            MeshHost.start(_identity(), _listen(), relay=RelayOptions(serve=True)) as relay,
            MeshHost.start(_identity(), _listen()) as hidden,
            MeshHost.start(_identity(), _listen()) as first,
            MeshHost.start(_identity(), _listen()) as second,
        ):
            await hidden.connect(relay.addrs()[0])
            circuit = await hidden.relay.reserve(relay.addrs()[0])

            async def echo(peer: str, stream: INetStream) -> None:
                while data := await stream.read(64):
                    await stream.write(data)

            hidden.serve_stream("/test/echo/1", echo)
            hidden_id = ID.from_base58(hidden.peer_id)
            for dialer in (first, second):
                dialer.remember(hidden.peer_id, [circuit])
                with trio.fail_after(20):
                    await dialer.reach(hidden.peer_id)
                assert dialer.path_to(hidden.peer_id) == "relayed"
            kept = await second._host.new_stream(hidden_id, [TProtocol("/test/echo/1")])
            await kept.write(b"one")
            with trio.fail_after(10):
                assert await kept.read(64) == b"one"
            slots = relay.relay._protocol.resource_manager.get_reservation(hidden_id)
            assert slots.active_connections == 2
            await first._host.get_network().close_peer(hidden_id)
            with trio.fail_after(20):  # the relay has let the first circuit go
                while slots.active_connections > 1:
                    await trio.sleep(0.05)
            await kept.write(b"two")
            with trio.fail_after(10):
                echoed = await kept.read(64)
            return echoed, slots.active_connections, second.path_to(hidden.peer_id)

    echoed, circuits, path = trio.run(main)
    assert echoed == b"two"
    assert circuits == 1
    assert path == "relayed"


@pytest.mark.process  # libp2p hosts
def test_a_peer_whose_hole_punch_tries_are_spent_is_punched_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every try of the library's fails at first and spends its whole budget, as two
    ends colliding or a loaded machine missing the timing do three times in a row; the
    library would then keep the relayed connection for good. A later punch of ours
    makes it direct."""
    monkeypatch.setattr(relay_module, "REPUNCH_FIRST_S", 1.0)
    punch = DCUtRProtocol.initiate_hole_punch
    tries: list[bool] = []

    async def failing_first(self: DCUtRProtocol, peer_id: ID) -> bool:
        tries.append(any(tries) or len(tries) >= 3)
        if not tries[-1]:
            self._hole_punch_attempts[peer_id] = MAX_HOLE_PUNCH_ATTEMPTS
            return False
        return await punch(self, peer_id)

    monkeypatch.setattr(DCUtRProtocol, "initiate_hole_punch", failing_first)

    async def main() -> tuple[str, str]:
        async with _behind_relay() as (_, hidden, dialer, circuit):
            dialer.remember(hidden.peer_id, [circuit])
            with trio.fail_after(20):
                await dialer.reach(hidden.peer_id)
            first = dialer.path_to(hidden.peer_id)
            await _until_direct(dialer, hidden.peer_id, 30)
            return first, dialer.path_to(hidden.peer_id)

    first, then = trio.run(main)
    assert first == "relayed"
    assert then == "direct"
    assert tries[:3] == [False, False, False] and tries[3]
