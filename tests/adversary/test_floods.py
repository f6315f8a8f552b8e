"""Floods against a real node. A stranger opens a thousand streams at once: the
excess over the per-peer cap is reset unread, the node stays up, keeps answering its
API and keeps its honest peer. Strangers hand it more fresh identities than its peer
table holds: the table stays within its cap and the established peer stays. A
stranger publishes 2,000 valid receipts at once: the gossip rate limit drops the
excess before it reaches the audit table, and the API keeps answering."""

from __future__ import annotations

import os
import time
import urllib.request
from contextlib import AsyncExitStack

import pytest
import trio
from factories import capacity_ad
from ledger_factories import cosigned
from nacl.signing import SigningKey

from node.demo.localnet import LocalNetwork, LocalNode, free_port
from node.identity import Identity
from node.net.discovery.gossip import MAX_TABLE_ADS
from node.net.host import MeshHost
from node.net.peers import MAX_PEERS
from protocol import encode, peer_id_from_public_key, seal
from protocol.names import ADS_PROTOCOL, PROGRESS_PROTOCOL, RECEIPTS_TOPIC

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


RECEIPTS = 2000
RATE_LIMIT = 20  # the nodes' default gossip_rate_limit, messages per second per peer


def _receipts_kept(node: LocalNode) -> float:
    with urllib.request.urlopen(f"{node.api}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("meshminer_receipts_seen_total{")
    )


async def _receipt_flood(node: LocalNode, latencies: list[float]) -> float:
    """Publish `RECEIPTS` valid co-signed receipts at once (the stranger as owner, a
    fresh identity as worker), from a host that does not rate-limit itself, while
    timing the node's API; returns the seconds from the first one to the last look."""
    me, worker = SigningKey.generate(), SigningKey.generate()
    flood = [cosigned(me, worker, unit_id=os.urandom(8).hex()) for _ in range(RECEIPTS)]
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(Identity(me), listen, gossip_rate_limit=1e9) as host:
        await host.connect(node.multiaddr)
        with trio.fail_after(15):
            while host.topic_peers(RECEIPTS_TOPIC) < 1:
                await trio.sleep(0.1)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def time_the_api() -> None:
                # for 3 s, long enough for the node to store all it would have kept
                while trio.current_time() - started < 3:
                    t0 = time.monotonic()
                    await trio.to_thread.run_sync(node.get, "/api/v1/status")
                    latencies.append(time.monotonic() - t0)
                    await trio.sleep(0.05)

            nursery.start_soon(time_the_api)
            for data in flood:
                await host.publish(RECEIPTS_TOPIC, data)
        return trio.current_time() - started


def test_a_receipt_flood_is_rate_limited_and_the_node_stays_responsive(
    localnet: LocalNetwork,
) -> None:
    target, honest = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    before = _receipts_kept(target)
    latencies: list[float] = []
    took = trio.run(_receipt_flood, target, latencies)
    kept = _receipts_kept(target) - before
    print(f"{RECEIPTS} receipts published, {kept:.0f} kept within {took:.1f} s; "
          f"API latency max {max(latencies):.2f} s")  # fmt: skip
    assert 0 < kept <= RATE_LIMIT * (took + 2)  # the excess was dropped, not stored
    assert max(latencies) < 5
    assert target.proc is not None and target.proc.poll() is None
    localnet.wait_all_see_each_other(timeout=20)
    assert honest.peer_id in target.peer_ids()
