"""Circuit relay v2 on our host, in process on loopback: a peer known only by its
circuit address is reached through the relay, a request works over it, and the hole
punch begun with the relayed dial upgrades the connection to a direct one.
(Through real NATs, in network namespaces: tests/netlab/.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from nacl.signing import SigningKey

from node.demo.localnet import free_port
from node.identity import Identity
from node.net.host import MeshHost
from node.net.relay import RelayOptions


def _identity() -> Identity:
    return Identity(SigningKey(os.urandom(32)))


def _listen() -> str:
    return f"/ip4/127.0.0.1/tcp/{free_port()}"


@pytest.mark.process  # libp2p hosts
def test_a_peer_known_only_by_its_circuit_address_is_reached_through_the_relay(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[bytes, str, str, str]:
        async with (
            MeshHost.start(_identity(), _listen(), relay=RelayOptions(serve=True)) as relay,
            MeshHost.start(_identity(), _listen()) as hidden,
            MeshHost.start(_identity(), _listen()) as dialer,
        ):
            await hidden.connect(relay.addrs()[0])
            circuit = await hidden.relay.reserve(relay.addrs()[0])
            assert circuit in hidden.addrs()

            async def answer(peer: str, data: bytes) -> bytes:
                return b"hidden got " + data + b" from " + peer.encode()

            hidden.serve("/test/ask/1", answer, max_request=64)
            dialer.remember(hidden.peer_id, [circuit])  # as an ad would tell it
            with trio.fail_after(20):
                reply = await dialer.request(hidden.peer_id, "/test/ask/1", b"hi", 128)
            first = dialer.path_to(hidden.peer_id)
            with trio.fail_after(15):  # the hole punch begun with the relayed dial
                while dialer.path_to(hidden.peer_id) != "direct":
                    await trio.sleep(0.1)
            status = await dialer.reachability.check([relay.peer_id])
            return reply, first, circuit, status.state

    reply, path, circuit, reachable = trio.run(main)
    assert reply.startswith(b"hidden got hi from ")
    assert path in ("relayed", "direct"), circuit  # direct once the punch is through
    assert reachable == "public"  # on loopback the relay's dial-back reaches the dialer
