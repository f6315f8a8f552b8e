"""`LoopStalls`: a task step that holds the node's trio thread is counted and named."""

from __future__ import annotations

import logging
import time

import pytest
import trio

from node.metrics import LoopStalls, NodeMetrics


def _stalls(metrics: NodeMetrics) -> float:
    return metrics.registry.get_sample_value("meshminer_loop_stalls_total") or 0.0


def test_a_blocking_step_is_counted_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = NodeMetrics()

    async def blocks() -> None:
        time.sleep(0.2)  # what a blocking call on the trio thread does

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(trio.sleep, 0)
            nursery.start_soon(blocks, name="blocks-the-thread")

    with caplog.at_level(logging.WARNING, logger="node.metrics"):
        trio.run(main, instruments=[LoopStalls(metrics, stall_s=0.1)])
    # (a quick step can be counted too, on a machine too busy to run this thread)
    assert _stalls(metrics) >= 1
    assert metrics.registry.get_sample_value("meshminer_loop_stalled_seconds_total") >= 0.2
    (record,) = [r for r in caplog.records if "blocks-the-thread" in r.getMessage()]
    assert "on CPU" in record.getMessage()


def test_the_step_that_adds_it_is_timed_from_then() -> None:
    metrics = NodeMetrics()

    async def main() -> None:
        trio.lowlevel.add_instrument(LoopStalls(metrics, stall_s=5.0))
        await trio.sleep(0)

    trio.run(main)
    assert _stalls(metrics) == 0
