"""When a node's capacity ad goes out (`CapacityGossip._publish_loop`): a change of
policy or availability at once; a change of load alone at once after a quiet spell,
else at most every `LOAD_AD_S`, carrying the newest load, also when it changed while
the ad before was on its way. Time is trio's mock clock; the host only records what
it is asked to publish, when."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from node.metrics import NodeMetrics
from node.net.discovery.cost import DiscoveryCost
from node.net.discovery.gossip import LOAD_AD_S, CapacityGossip

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


def test_load_changes_are_published_at_most_every_few_seconds_with_the_newest_load() -> None:
    host, load = Host(), [0]
    gossip = _gossip(host, load)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gossip._publish_loop)
            await trio.sleep(10.0)  # quiet: nothing changed
            assert host.published == []

            async def load_becomes(pct: int, at: float) -> None:
                await trio.sleep_until(at)
                load[0] = pct
                gossip.load_changed()

            await load_becomes(100, 10.0)  # after a quiet spell: at once
            await load_becomes(0, 11.0)  # a unit of a second: these two wait...
            await load_becomes(100, 12.0)
            await load_becomes(0, 16.0)  # ... and so does this one
            await trio.sleep_until(30.0)
            load[0] = 50
            gossip.changed()  # not the load alone: at once
            await trio.sleep_until(31.0)
            host.slow.set()
            gossip.changed()
            await trio.sleep_until(31.5)  # while that ad is on its way
            load[0] = 0
            gossip.load_changed()
            await trio.sleep_until(50.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    when = [(round(t, 3), data.decode()) for t, data in host.published]
    assert when == [
        (10.0, "load 100"),
        (pytest.approx(10.0 + LOAD_AD_S), "load 100"),  # 11 s and 12 s: one ad, the newest
        (pytest.approx(10.0 + 2 * LOAD_AD_S), "load 0"),
        (30.0, "load 50"),
        (32.0, "load 50"),  # it took 1 s to go out; its load was read before
        (pytest.approx(31.0 + LOAD_AD_S + 1.0), "load 0"),
    ]
