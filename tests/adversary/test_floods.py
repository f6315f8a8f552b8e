"""Floods against a real node. A stranger opens a thousand streams at once: the
excess over the per-peer cap is reset unread, the node stays up, keeps answering its
API and keeps its honest peer. Strangers hand it more fresh identities than its peer
table holds: the table stays within its cap and the established peer stays."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import trio
from factories import capacity_ad
from nacl.signing import SigningKey

from node.identity import Identity
from node.localnet import LocalNetwork, LocalNode, free_port
from node.net.gossip import MAX_TABLE_ADS
from node.net.host import MeshHost
from node.net.peers import MAX_PEERS
from protocol import encode, peer_id_from_public_key, seal
from protocol.names import ADS_PROTOCOL, PROGRESS_PROTOCOL

pytestmark = pytest.mark.slow

STREAMS = 1000


async def _flood(node: LocalNode) -> dict[str, int]:
    outcomes = {"answered": 0, "refused": 0}
    async with MeshHost.start(
        Identity(SigningKey.generate()), f"/ip4/127.0.0.1/tcp/{free_port()}"
    ) as host:
        await host.connect(node.multiaddr)

        async def one() -> None:
            try:
                await host.request(node.peer_id, PROGRESS_PROTOCOL, b"\xc1" * 64, 4096, timeout=60)
                outcomes["answered"] += 1
            except Exception:
                outcomes["refused"] += 1

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for _ in range(STREAMS):
                    nursery.start_soon(one)
    return outcomes


def test_a_thousand_streams_at_once_leave_the_node_standing(localnet: LocalNetwork) -> None:
    target, honest = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    started = time.monotonic()
    outcomes = trio.run(_flood, target)
    print(f"{outcomes} in {time.monotonic() - started:.1f} s")
    assert sum(outcomes.values()) == STREAMS
    assert outcomes["refused"] > 0  # the caps refused some
    assert target.proc is not None and target.proc.poll() is None
    assert target.get("/api/v1/status")["peer_id"] == target.peer_id
    localnet.wait_all_see_each_other(timeout=20)
    assert honest.peer_id in target.peer_ids()


async def _serve_fresh_ads(node: LocalNode, batches: int) -> float:
    """Connect as `batches` new hosts, each with an ad table full of fresh identities
    (the node fetches every table on connect), one after the other; returns the seconds
    until the node has taken them all."""
    async with AsyncExitStack() as stack:
        started = trio.current_time()
        last = ""
        for _ in range(batches):
            ads = []
            for _i in range(MAX_TABLE_ADS):
                key = SigningKey.generate()
                last = peer_id_from_public_key(bytes(key.verify_key))
                ads.append(seal(capacity_ad(last, 1), key))
            table = encode(ads)

            async def serve_table(peer: str, request: bytes, table: bytes = table) -> bytes:
                return table

            identity = Identity(SigningKey.generate())
            host = await stack.enter_async_context(
                MeshHost.start(identity, f"/ip4/127.0.0.1/tcp/{free_port()}")
            )
            host.serve(ADS_PROTOCOL, serve_table, max_request=64)
            await host.connect(node.multiaddr)
            # a table is taken in one go, and a newcomer to a full table displaces the
            # newest entry: the batch's last ad is in the table once the batch is done
            with trio.fail_after(30):
                while last not in await trio.to_thread.run_sync(node.peer_ids):
                    await trio.sleep(0.2)
        return trio.current_time() - started


def test_an_ad_flood_of_fresh_identities_keeps_the_table_capped_and_the_peers(
    localnet: LocalNetwork,
) -> None:
    # a TTL long enough that the flood's silent identities stay in the table till the end
    target = localnet.add(extra_args=["--peer-ttl", "300"])
    honest = localnet.add()
    localnet.wait_all_see_each_other(timeout=20)
    batches = MAX_PEERS // MAX_TABLE_ADS + 1  # more fresh identities than the table holds
    took = trio.run(_serve_fresh_ads, target, batches)
    print(f"{batches * MAX_TABLE_ADS} fresh identities taken in {took:.1f} s")
    t0 = time.monotonic()
    known = target.peer_ids()
    print(f"GET /api/v1/peers with {len(known)} peers: {time.monotonic() - t0:.2f} s")
    assert len(known) == MAX_PEERS  # full, and no further
    assert honest.peer_id in known  # the established peer was not the one pushed out
    assert target.proc is not None and target.proc.poll() is None
    localnet.wait_all_see_each_other(timeout=20)
