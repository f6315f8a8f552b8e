"""Directories are strangers too, and so is whoever registers with one.

A hostile peer registers garbage, others' ads, stale and replayed ones with a real
directory: each is refused, and the directory keeps serving the honest volunteer.
A hostile directory answers an owner's search with forged, altered, dead and impostor
ads: the owner finds only peers whose own signed ad it verified and that answered a
probe themselves, so no offer can go to a peer the directory made up.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
import trio
from factories import capacity_ad, rejections
from nacl.signing import SigningKey

from node.demo.localnet import LocalNetwork, LocalNode, free_port, wait_for
from node.identity import Identity
from node.net.host import HostError, MeshHost
from protocol import (
    AD_LIMITS,
    CapacityAd,
    encode,
    open_envelope,
    peer_id_from_public_key,
    seal,
)
from protocol.directory import DIRECTORY_LIMITS, DirectoryReply
from protocol.names import (
    ADS_PROTOCOL,
    CAPACITY_TOPIC,
    PROBE_PROTOCOL,
    QUERY_PROTOCOL,
    REGISTER_PROTOCOL,
)
from tests.adversary.rogue import api, until

pytestmark = pytest.mark.slow

LARGE = ["--gossip-max-peers", "2"]
CLOSED = "/ip4/127.0.0.1/tcp"  # + a port nobody listens on


def _identity() -> tuple[Identity, str]:
    key = SigningKey.generate()
    return Identity(key), peer_id_from_public_key(bytes(key.verify_key))


async def _holds(directory: LocalNode) -> int:
    return (await api(directory, "/api/v1/status"))["discovery"].get("directory_holds", 0)


async def _register(host: MeshHost, directory: str, data: bytes) -> str:
    """ "accepted (N held)" or why the directory closed the stream."""
    try:
        raw = await host.request(directory, REGISTER_PROTOCOL, data, DIRECTORY_LIMITS.max_bytes)
    except HostError as exc:
        return f"refused: {exc}"
    reply = open_envelope(raw, DirectoryReply, expected_signer=directory, limits=DIRECTORY_LIMITS)
    return f"accepted ({reply.message.registered} held)"


def test_a_directory_refuses_bad_registrations_and_keeps_serving(
    localnet: LocalNetwork,
) -> None:
    directory = localnet.add(["--directory"])
    honest = localnet.add(LARGE)
    me, my_id = _identity()

    async def attack() -> None:
        async with MeshHost.start(me, f"/ip4/127.0.0.1/tcp/{free_port()}") as host:
            with trio.fail_after(20):
                while await _holds(directory) < 1:
                    await trio.sleep(0.2)
            dir_id = await host.connect(directory.multiaddr)
            honest_id = await host.connect(honest.multiaddr)
            honest_ad = await host.request(honest_id, PROBE_PROTOCOL, b"", AD_LIMITS.max_bytes)
            attempts = {
                "garbage": b"\x93\x01\x02",
                "oversized": b"\x00" * (AD_LIMITS.max_bytes + 1),
                "someone else's ad": honest_ad,  # valid, but not the registering peer's
                "stale": seal(capacity_ad(my_id, 5, age_s=3600), me.signing_key),
                "not its own peer id": seal(capacity_ad(honest_id, 6), me.signing_key),
            }
            for what, data in attempts.items():
                outcome = await _register(host, dir_id, data)
                assert outcome.startswith("refused"), (what, outcome)
            # control: its own fresh ad is taken, then an older one is a replay
            assert await _register(host, dir_id, seal(capacity_ad(my_id, 9), me.signing_key)) == (
                "accepted (2 held)"
            )
            replay = await _register(host, dir_id, seal(capacity_ad(my_id, 8), me.signing_key))
            assert replay.startswith("refused"), replay
            # its ad claims a directory's role: registered as a peer, nothing more
            fake = seal(capacity_ad(my_id, 10, directory=True), me.signing_key)
            assert (await _register(host, dir_id, fake)).startswith("accepted")

    trio.run(attack)
    counted = rejections(directory.api, "meshminer_ads_rejected")
    assert counted.get("signer_mismatch", 0) >= 1 and counted.get("stale", 0) >= 1
    # the directory still holds the honest volunteer and answers an owner's search
    owner = localnet.add(LARGE)
    wait_for(lambda: directory.peer_id in owner.peer_ids(), 20, "the owner to know the directory")
    found = owner.get("/api/v1/peers/find?k=8")
    assert honest.peer_id in {p["peer_id"] for p in found["peers"]}
    assert my_id not in {p["peer_id"] for p in found["peers"]}  # it answers no probe


def test_a_hostile_directory_cannot_make_an_owner_offer_to_a_peer_it_made_up(
    localnet: LocalNetwork,
) -> None:
    honest = localnet.add(LARGE)
    owner = localnet.add(LARGE)
    me, my_id = _identity()
    victim_key = SigningKey.generate()
    victim_id = peer_id_from_public_key(bytes(victim_key.verify_key))
    ghost_key = SigningKey.generate()
    ghost_id = peer_id_from_public_key(bytes(ghost_key.verify_key))

    async def hostile_directory() -> None:
        listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
        async with MeshHost.start(me, listen) as host, trio.open_nursery() as nursery:
            own_addr = host.addrs()[0]
            ads = {
                # a real peer's ad, altered: its signature no longer holds
                "altered": bytearray(seal(capacity_ad(victim_id, 3), victim_key)),
                # an identity nobody runs, its addresses on a closed port: a dead peer
                "dead": seal(
                    capacity_ad(ghost_id, 1, addrs=[f"{CLOSED}/{free_port()}/p2p/{ghost_id}"]),
                    ghost_key,
                ),
                # an impostor: the victim's identity at this host's address (signed by us)
                "impostor": seal(
                    capacity_ad(victim_id, 4, addrs=[own_addr.replace(my_id, victim_id)]),
                    me.signing_key,
                ),
                "garbage": b"\xc1" * 40,
            }
            ads["altered"][-3] ^= 1

            def own_ad() -> bytes:
                ad = capacity_ad(my_id, int(time.time()), addrs=host.addrs(), directory=True)
                return seal(ad, me.signing_key)

            async def answer_query(peer: str, request: bytes) -> bytes:
                # a count it could hold (one it could not, say 10**9, is not heard:
                # the whole answer is dropped, tests/node/net/test_registration.py)
                reply = DirectoryReply(5, 90.0, [bytes(a) for a in ads.values()])
                return seal(reply, me.signing_key)

            async def table(peer: str, request: bytes) -> bytes:
                return encode([own_ad()])

            host.serve(ADS_PROTOCOL, table, max_request=64)
            host.serve(QUERY_PROTOCOL, answer_query, max_request=1024)

            async def swallow(peer: str, request: bytes) -> bytes:
                return b""  # takes registrations and answers nonsense

            host.serve(REGISTER_PROTOCOL, swallow, max_request=8192)
            await host.subscribe(CAPACITY_TOPIC, lambda sender, data: True)
            await host.connect(owner.multiaddr)

            async def publish() -> None:
                while True:
                    await host.publish(CAPACITY_TOPIC, own_ad())
                    await trio.sleep(0.5)

            nursery.start_soon(publish)
            await until(lambda: my_id in owner.peer_ids(), 15, "the owner to list the directory")
            found = await api(owner, "/api/v1/peers/find?k=8")
            ids = {p["peer_id"] for p in found["peers"]}
            assert ids <= {honest.peer_id, my_id}, found  # nothing the directory made up
            listed = {p["peer_id"]: p["via"] for p in await api(owner, "/api/v1/peers")}
            assert victim_id not in listed  # altered and impostor ads were refused
            # the dead one failed its probe; a later query may list its copy again, but
            # only as a directory's unconfirmed copy, which gets no offer before a probe
            assert listed.get(ghost_id, "directory") == "directory"
            nursery.cancel_scope.cancel()

    trio.run(hostile_directory)
    counted = rejections(owner.api, "meshminer_ads_rejected")
    assert counted.get("bad_signature", 0) + counted.get("malformed", 0) >= 2, counted
    assert owner.get("/api/v1/status")["peer_id"] == owner.peer_id  # alive and answering


def _published(node: LocalNode) -> float:
    """How many capacity ads `node` published by gossip (its /metrics counter)."""
    with urllib.request.urlopen(f"{node.api}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("meshminer_ads_published_total "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _hostile_directories(node: LocalNode, behaviours: list[str], task_status: Any) -> None:
    """Hostile directories that `node` hears of in one peer's ad table, one per entry
    of `behaviours` (`_lying_directory`'s, or "dead ads": its addresses are closed
    ports, which cost nothing to make): each a fresh identity with a signed directory
    ad."""
    me, my_id = _identity()
    async with trio.open_nursery() as nursery:
        listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
        async with MeshHost.start(me, listen) as host:
            own = seal(capacity_ad(my_id, 1, addrs=host.addrs()), me.signing_key)
            ads = []
            for behaviour in behaviours:
                key, peer = _identity()
                if behaviour == "dead ads":
                    addrs = [f"{CLOSED}/{free_port()}/p2p/{peer}"]
                else:
                    lying = await nursery.start(_lying_directory, key, behaviour, own)
                    addrs = lying.addrs()
                ad = capacity_ad(peer, 1, addrs=addrs, directory=True)
                ads.append(seal(ad, key.signing_key))

            async def table(peer: str, request: bytes) -> bytes:
                return encode([own, *ads])

            host.serve(ADS_PROTOCOL, table, max_request=64)
            await host.connect(node.multiaddr)
            await until(
                lambda: all(d in node.peer_ids() for d in _ids(ads)),
                20,
                "the node to list the hostile directories",
            )
            task_status.started()
            await trio.sleep_forever()


def _ids(ads: list[bytes]) -> list[str]:
    return [open_envelope(a, CapacityAd, limits=AD_LIMITS).signer for a in ads]


async def _lying_directory(key: Identity, behaviour: str, friend: bytes, task_status: Any) -> None:
    """A directory that answers every search at once and lists none of the honest:
    "zero counts" takes registrations and says it holds no one; "empty answers" takes
    none and says it holds 3 (it hides whoever registers elsewhere); "silent drop"
    takes them, says it holds 3 and returns no one; "friends only" the same, returning
    only `friend`'s ad (the attacker's peer)."""
    registered = 0 if behaviour == "zero counts" else 3
    listed = [friend] if behaviour == "friends only" else []
    async with MeshHost.start(key, f"/ip4/127.0.0.1/tcp/{free_port()}") as host:

        async def answer(peer: str, request: bytes) -> bytes:
            return seal(DirectoryReply(registered, 90.0, listed), key.signing_key)

        if behaviour != "empty answers":
            host.serve(REGISTER_PROTOCOL, answer, max_request=8192)
        host.serve(QUERY_PROTOCOL, answer, max_request=1024)
        task_status.started(host)
        await trio.sleep_forever()


@pytest.mark.parametrize(
    "hostile",
    [
        ["dead ads"] * 30,
        ["zero counts"] * 2,
        ["empty answers"] * 2,
        ["silent drop", "friends only"],
    ],
    ids=["dead ads", "zero counts", "empty answers", "silent drop, friends only"],
)
def test_hostile_directories_cannot_start_gossip_or_hide_a_joiner(
    localnet: LocalNetwork, hostile: list[str]
) -> None:
    """Beside one honest directory, hostile ones that a joiner hears of first: dead
    ads (30 of them), or two directories that say they hold no one, or two that answer
    every search at once with no one, or two that take its registration and leave it
    out of their answers. The joiner never gossips its ad to the network (it waits
    for directories to answer, and the largest count decides), ends registered with
    the honest directory alone (one that leaves it out of an answer to a stranger
    hides it, and is left for hours), and an owner finds it there (two empty answers
    do not end its search)."""
    directory = localnet.add(["--directory"])
    owner = localnet.add(LARGE)
    wait_for(lambda: directory.peer_id in owner.peer_ids(), 20, "the owner to know the directory")

    async def attack() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(_hostile_directories, owner, hostile)
            joiner = await trio.to_thread.run_sync(localnet.add, LARGE)
            honest = [directory.peer_id]
            await until(
                lambda: (d := _discovery(joiner))["registered_with"] == d["listed_by"] == honest,
                60,
                "the joiner to be registered with, and listed by, the honest directory alone",
            )
            found = await until(
                lambda: joiner.peer_id in _found(owner), 30, "the owner to find the joiner"
            )
            assert found
            assert not _discovery(joiner)["gossips_own_ad"], hostile
            assert _published(joiner) == 0, hostile  # not once, not at its start
            nursery.cancel_scope.cancel()

    trio.run(attack)


def _discovery(node: LocalNode) -> dict:
    """What `node`'s status says of its discovery."""
    return node.get("/api/v1/status")["discovery"]


def _found(owner: LocalNode) -> set[str]:
    return {p["peer_id"] for p in owner.get("/api/v1/peers/find?k=8")["peers"]}
