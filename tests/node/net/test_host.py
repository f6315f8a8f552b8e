"""The libp2p wrapper's lifecycle, in process: the listener really closes on shutdown,
and a request over a connection that closed dials again."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio
from libp2p.peer.id import ID

from node.demo.localnet import free_port
from node.identity import load_or_create_identity
from node.net.host import HostError, MeshHost

pytestmark = pytest.mark.process  # libp2p hosts, in this process


def _dial(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_listener_is_closed_after_shutdown(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path)
    port = free_port()

    async def main() -> list[str]:
        async with MeshHost.start(identity, f"/ip4/127.0.0.1/tcp/{port}") as host:
            assert await trio.to_thread.run_sync(_dial, port)
            return host.addrs()

    addrs = trio.run(main)
    assert addrs == [f"/ip4/127.0.0.1/tcp/{port}/p2p/{identity.peer_id}"]
    # py-libp2p leaves the listener open after host.run() exits; MeshHost closes it
    assert not _dial(port), "a dial to a stopped host still connects"


def test_port_already_in_use_is_a_clear_error(tmp_path: Path) -> None:
    identity = load_or_create_identity(tmp_path)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]

        async def main() -> None:
            async with MeshHost.start(identity, f"/ip4/127.0.0.1/tcp/{port}"):
                pass

        with pytest.raises(HostError, match="Is another node using this port"):
            trio.run(main)


def test_a_request_over_a_connection_that_closed_dials_again(tmp_path: Path) -> None:
    """py-libp2p keeps a closed connection listed, and then refuses a stream instead of
    dialling ("No valid connections"); a request drops it and dials."""
    one = load_or_create_identity(tmp_path / "one")
    two = load_or_create_identity(tmp_path / "two")
    ports = free_port(), free_port()

    async def echo(peer: str, data: bytes) -> bytes:
        return data[::-1]

    async def main() -> list[bytes]:
        async with (
            MeshHost.start(one, f"/ip4/127.0.0.1/tcp/{ports[0]}") as asker,
            MeshHost.start(two, f"/ip4/127.0.0.1/tcp/{ports[1]}") as answerer,
        ):
            answerer.serve("/test/echo/1", echo, 64)
            peer = await asker.connect(f"/ip4/127.0.0.1/tcp/{ports[1]}/p2p/{two.peer_id}")
            first = await asker.request(peer, "/test/echo/1", b"abc", 64)
            network = asker._host.get_network()
            (conn,) = network.connections[ID.from_base58(peer)]
            conn.event_closed.set()  # closed as py-libp2p sees it, still listed
            second = await asker.request(peer, "/test/echo/1", b"xyz", 64)
            assert network.connections[ID.from_base58(peer)] != [conn]
            return [first, second]

    assert trio.run(main) == [b"cba", b"zyx"]
