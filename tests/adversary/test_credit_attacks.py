"""A directory's credit table is one stranger's word: a node of a large network asks a
directory for it (`node.net.discovery.credit`) and shows it as that directory's view.

A hostile directory answers with bytes that are not a reply, a reply signed by another
key, rows it made up badly (a peer twice, markup in a name, a negative credit) and a
reply past the size bound: each is refused by name and shows nothing. An honest
directory's table (a real `CreditServer` over real libp2p hosts) comes through ranked,
cut to what was asked, and with the names of the ads it holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
from nacl.signing import SigningKey

from node.demo.localnet import free_port
from node.identity import Identity
from node.net.discovery.credit import CreditServer, ask_credit
from node.net.host import HostError, MeshHost
from protocol import ProtocolError, encode, peer_id_from_public_key, seal
from protocol.directory import CreditReply, CreditRow
from protocol.errors import TooLarge
from protocol.names import CREDIT_PROTOCOL
from protocol.schema import to_plain
from tests.protocol.test_envelope import sign_raw

pytestmark = pytest.mark.process  # real libp2p hosts, in this process

Answer = Callable[[str, bytes], Awaitable[bytes]]


def _identity() -> tuple[Identity, str]:
    key = SigningKey.generate()
    return Identity(key), peer_id_from_public_key(bytes(key.verify_key))


async def _ask(serve: Callable[[MeshHost, Identity], None]) -> CreditReply | Exception:
    """A directory host serving as `serve` says, asked once by another host: its
    reply, or the error the asker met (returned: the hosts' nurseries would wrap it)."""
    directory, directory_id = _identity()
    asker, _ = _identity()
    async with (
        MeshHost.start(directory, f"/ip4/127.0.0.1/tcp/{free_port()}") as there,
        MeshHost.start(asker, f"/ip4/127.0.0.1/tcp/{free_port()}") as here,
    ):
        serve(there, directory)
        assert await here.connect(there.addrs()[0]) == directory_id
        with trio.fail_after(20):
            try:
                return await ask_credit(here, asker, directory_id, want=2)
            except (ProtocolError, HostError) as exc:
                return exc


def _replying(make: Callable[[Identity], bytes]) -> Callable[[MeshHost, Identity], None]:
    def serve(host: MeshHost, me: Identity) -> None:
        async def answer(peer: str, request: bytes) -> bytes:
            return make(me)

        host.serve(CREDIT_PROTOCOL, answer, max_request=1024)

    return serve


_, WORKER = _identity()
ROW = to_plain(CreditRow(WORKER, credit=5.0, rac=1.0, units=2, conflicts=0))


def _signed_plain(plain: dict, me: Identity) -> bytes:
    return sign_raw(encode(plain), me.signing_key, CreditReply.TYPE, CreditReply.VERSION)


HOSTILE: dict[str, tuple[Callable[[Identity], bytes], str]] = {
    "garbage": (lambda me: b"\xc1" * 64, "not valid msgpack"),
    "signed by another key": (
        lambda me: seal(CreditReply(1, [CreditRow(**ROW)]), SigningKey.generate()),
        "signed by",
    ),
    "a peer twice": (
        lambda me: _signed_plain({"receipts": 2, "rows": [ROW, ROW]}, me),
        "CreditReply.rows lists a peer twice",
    ),
    "markup in a name": (
        lambda me: _signed_plain({"receipts": 1, "rows": [{**ROW, "name": "<b>x</b>"}]}, me),
        "CreditReply.rows[0].name must be plain text",
    ),
    "a negative credit": (
        lambda me: _signed_plain({"receipts": 1, "rows": [{**ROW, "credit": -3.0}]}, me),
        "CreditReply.rows[0].credit must be finite",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_directorys_credit_reply_is_refused_by_name(case: str) -> None:
    make, words = HOSTILE[case]
    refused = trio.run(_ask, _replying(make))
    assert isinstance(refused, ProtocolError) and words in str(refused), refused


def test_a_credit_reply_past_its_bound_is_not_read() -> None:
    refused = trio.run(_ask, _replying(lambda me: b"\x00" * (1 << 20)))
    assert isinstance(refused, TooLarge) and "exceeds" in str(refused), refused


def test_an_honest_directory_gives_its_table_ranked_and_cut_to_the_question() -> None:
    _, a = _identity()
    _, b = _identity()
    _, owner = _identity()
    figures = (
        {
            a: {"earned": 2.0, "units": 1, "conflicts": 0},
            b: {"earned": 7.5, "units": 3, "conflicts": 0},
            WORKER: {"earned": 1.0, "units": 1, "conflicts": 1},
            owner: {"earned": 0.0, "units": 0, "conflicts": 0},  # spent only: no row
        },
        {b: 4.0},
        6,
    )
    reads = []

    def serve(host: MeshHost, me: Identity) -> None:
        server = CreditServer(
            host, me, lambda: reads.append(1) or figures, lambda: {b: ("Bea", "Team B")}
        )
        server.start()

    reply = trio.run(_ask, serve)
    assert isinstance(reply, CreditReply) and reply.receipts == 6, reply
    assert [(r.peer_id, r.credit, r.rac, r.name, r.team) for r in reply.rows] == [
        (b, 7.5, 4.0, "Bea", "Team B"),
        (a, 2.0, 0.0, "", ""),
    ]  # want=2 of the three workers
    assert reads == [1]
