"""When a node's capacity ad goes out (`CapacityGossip._publish_loop`): a change of
policy or availability at once; a change of load alone `LOAD_SETTLE_S` later, and
at most every `LOAD_AD_S`, only if the load then is not the one last published (a
worker of short units back to back says "busy" once), also when it changed while the
ad before was on its way. Time is trio's mock clock; the host only records what it is
asked to publish, when."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.metrics import NodeMetrics
from node.net.discovery.cost import DiscoveryCost
from node.net.discovery.gossip import LOAD_AD_S, LOAD_SETTLE_S, CapacityGossip

INTERVAL_S = 1000.0  # the slow refresh, out of the way


class Host:
    def __init__(self) -> None:
        self.published: list[tuple[float, bytes]] = []
        self.slow = trio.Event()  # set: a publish takes 1 s

    async def publish(self, topic: str, data: bytes) -> None:
        if self.slow.is_set():
            await trio.sleep(1.0)
        self.published.append((trio.current_time(), data))


def _gossip(host: Host, load: list[int]) -> CapacityGossip:
    metrics = NodeMetrics()
    return CapacityGossip(
        host,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  (publishing reads no peer table)
        metrics,
        lambda: f"load {load[0]}".encode(),
        INTERVAL_S,
        DiscoveryCost(metrics),
    )


def test_a_load_change_goes_out_once_settled_and_only_if_it_still_differs() -> None:
    host, load = Host(), [0]
    gossip = _gossip(host, load)

    async def main() -> None:
        async def load_becomes(pct: int, at: float) -> None:
            await trio.sleep_until(at)
            load[0] = pct
            gossip.load_changed(pct)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(gossip._publish_loop)
            await trio.sleep(10.0)  # quiet: nothing changed
            assert host.published == []
            await load_becomes(100, 10.0)  # a unit begins
            await load_becomes(0, 12.0)  # it ends and the next begins at once...
            await load_becomes(100, 12.05)  # ... so nobody needs to hear of it
            await load_becomes(0, 20.0)  # the last one ends
            await load_becomes(100, 22.0)  # another, within LOAD_AD_S of that ad
            await trio.sleep_until(30.0)
            load[0] = 50
            gossip.changed()  # not the load alone: at once
            await trio.sleep_until(31.0)
            host.slow.set()
            gossip.changed()
            await trio.sleep_until(31.5)  # while that ad is on its way
            load[0] = 0
            gossip.load_changed(0)
            await trio.sleep_until(50.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    when = [(round(t, 3), data.decode()) for t, data in host.published]
    assert when == [
        (10.0 + LOAD_SETTLE_S, "load 100"),
        (20.0 + LOAD_SETTLE_S, "load 0"),  # 12 s and 12.05 s: nothing
        (pytest.approx(20.0 + LOAD_SETTLE_S + LOAD_AD_S), "load 100"),
        (30.0, "load 50"),
        (32.0, "load 50"),  # it took 1 s to go out; its load was read before
        (pytest.approx(31.0 + LOAD_AD_S + 1.0), "load 0"),
    ]
