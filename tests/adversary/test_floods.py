"""A stranger opens a thousand streams at once on a real node: the excess over the
per-peer cap is reset unread, the node stays up, keeps answering its API and keeps
its honest peer."""

from __future__ import annotations

import time

import pytest
import trio
from nacl.signing import SigningKey

from node.identity import Identity
from node.localnet import LocalNetwork, LocalNode, free_port
from node.net.host import MeshHost
from protocol.names import PROGRESS_PROTOCOL

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
