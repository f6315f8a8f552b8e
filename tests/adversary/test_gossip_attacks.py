"""A raw py-libp2p host (test code, not a meshminer node) publishes bad capacity ads.

None may enter a peer table, each is counted under its reason in /metrics, and
every node keeps running.
"""

from __future__ import annotations

import os

import multiaddr
import pytest
import trio
from factories import capacity_ad, rejections
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service
from nacl.signing import SigningKey

from node.demo.localnet import LocalNetwork, LocalNode, free_port
from node.net.host import GOSSIPSUB_PROTOCOLS
from protocol import AD_LIMITS, CapacityAd, encode, peer_id_from_public_key, seal
from protocol.envelope import signing_bytes
from protocol.names import CAPACITY_TOPIC
from protocol.schema import to_plain

pytestmark = pytest.mark.slow


def _ad(peer_id: str, seq: int, tflops: float = 1.5, age_s: float = 0.0) -> CapacityAd:
    return capacity_ad(peer_id, seq, tflops=tflops, age_s=age_s)


def _forged(ad: CapacityAd, claimed: SigningKey, actual: SigningKey) -> bytes:
    """An envelope naming `claimed` as signer but signed by `actual`."""
    payload = encode(to_plain(ad))
    sig = actual.sign(signing_bytes(ad.TYPE, ad.VERSION, payload)).signature
    return encode(
        {"t": ad.TYPE, "v": ad.VERSION, "p": payload, "k": bytes(claimed.verify_key), "s": sig}
    )


def _rejections(node: LocalNode) -> dict[str, float]:
    return rejections(node.api, "meshminer_ads_rejected")


async def _wait(cond, timeout: float, what: str) -> None:
    with trio.fail_after(timeout):
        while not await trio.to_thread.run_sync(cond):
            await trio.sleep(0.2)


async def _attack(nodes: list[LocalNode], attacker_seed: bytes, other: SigningKey) -> None:
    me = SigningKey(attacker_seed)
    my_id = peer_id_from_public_key(bytes(me.verify_key))
    other_id = peer_id_from_public_key(bytes(other.verify_key))
    listen = multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{free_port()}")
    host = new_host(key_pair=create_new_key_pair(attacker_seed), listen_addrs=[listen])
    gossipsub = GossipSub(
        protocols=GOSSIPSUB_PROTOCOLS, degree=6, degree_low=4, degree_high=12, heartbeat_interval=1
    )
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    async with (
        host.run(listen_addrs=[listen]),
        background_trio_service(pubsub),
        background_trio_service(gossipsub),
    ):
        await pubsub.wait_until_ready()
        for node in nodes:
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(node.multiaddr)))
        with trio.fail_after(15):
            while len(pubsub.peer_topics.get(CAPACITY_TOPIC, ())) < len(nodes):
                await trio.sleep(0.1)

        # control: a valid ad from the attacker's own identity is accepted
        await pubsub.publish(CAPACITY_TOPIC, seal(_ad(my_id, seq=5), me))
        await _wait(lambda: all(my_id in n.peer_ids() for n in nodes), 15, "the valid ad to arrive")

        # an older ad of the same peer (out of order, or replayed): passed on, not used
        await pubsub.publish(CAPACITY_TOPIC, seal(_ad(my_id, seq=3, tflops=999.0), me))
        # well signed, newer, but its name is markup: the whole ad is refused
        markup = capacity_ad(my_id, 9, tflops=999.0, name="<img src=x onerror=alert(1)>")
        await pubsub.publish(CAPACITY_TOPIC, seal(markup, me))
        bad = {
            "bad_signature": _forged(_ad(my_id, seq=6, tflops=999.0), claimed=me, actual=other),
            "signer_mismatch": seal(_ad(other_id, seq=1, tflops=999.0), other),
            "peer_mismatch": seal(_ad(other_id, seq=7, tflops=999.0), me),
            "stale": seal(_ad(my_id, seq=8, tflops=999.0, age_s=3600), me),
            "oversized": os.urandom(AD_LIMITS.max_bytes + 1),
            "malformed": b"\xc1" * 200,  # 0xc1 is never valid msgpack
        }
        for data in bad.values():
            await pubsub.publish(CAPACITY_TOPIC, data)

        def all_counted() -> bool:
            return all(_rejections(n).get(reason, 0) >= 1 for n in nodes for reason in bad)

        await _wait(all_counted, 15, "every rejection to be counted")
        await _wait(
            lambda: all(
                rejections(n.api, "meshminer_ads_ignored").get("out_of_order", 0) >= 1
                for n in nodes
            ),
            15,
            "the older ad to be counted as out of order",
        )
    await host.close()


def test_bad_ads_are_rejected_counted_and_harmless(localnet: LocalNetwork) -> None:
    nodes = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=15)
    attacker_seed = os.urandom(32)
    other = SigningKey.generate()
    trio.run(_attack, nodes, attacker_seed, other)

    attacker_id = peer_id_from_public_key(bytes(SigningKey(attacker_seed).verify_key))
    other_id = peer_id_from_public_key(bytes(other.verify_key))
    for node in nodes:
        assert node.proc is not None and node.proc.poll() is None, f"{node.name} died"
        peers = {p["peer_id"]: p for p in node.get("/api/v1/peers")}
        assert other_id not in peers
        # only the valid ad made it: none of the bad ones (tflops 999) replaced it
        assert peers[attacker_id]["seq"] == 5 and peers[attacker_id]["name"] == ""
        assert peers[attacker_id]["tflops"] == 1.5
        counts = _rejections(node)
        print(node.name, counts)
        assert counts.get("replay", 0) == 0  # an older seq is not held against its forwarder
        for reason in (
            "bad_signature",
            "signer_mismatch",
            "peer_mismatch",
            "stale",
            "oversized",
            "malformed",
        ):
            assert counts.get(reason, 0) >= 1, f"{node.name} did not count {reason}"
    # the real nodes still see each other
    localnet.wait_all_see_each_other(timeout=10)
