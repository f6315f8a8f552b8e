"""The benchmarks' own arithmetic, where a figure in docs/performance.md rests on it."""

from __future__ import annotations

import time

import pytest

from benchmarks.hivemind import ROUND_SAMPLES, at_samples, first_round_at
from benchmarks.loopback import LoopbackTrace
from node.demo.localnet import wait_for

LOSSES = [3.0, 2.8, 2.6]  # after rounds 1, 2 and 3


@pytest.mark.parametrize(
    ("samples", "loss"),
    [
        (ROUND_SAMPLES, 3.0),  # exactly the first round
        (1.5 * ROUND_SAMPLES, 2.9),  # halfway to the second
        (2.25 * ROUND_SAMPLES, 2.75),
        (3 * ROUND_SAMPLES, 2.6),  # the last round
        (5 * ROUND_SAMPLES, 2.6),  # past it: the last loss, never an extrapolation
        (0.5 * ROUND_SAMPLES, 3.0),  # before the first: the first
    ],
)
def test_the_loss_at_hivemind_s_samples_lies_between_the_rounds_around_them(
    samples: float, loss: float
) -> None:
    assert at_samples(LOSSES, samples) == pytest.approx(loss)


def test_the_round_that_reaches_a_loss_is_the_first_at_or_below_it() -> None:
    assert first_round_at(LOSSES, 2.8) == 1  # equal counts
    assert first_round_at(LOSSES, 2.79) == 2
    assert first_round_at(LOSSES, 3.5) == 0
    assert first_round_at(LOSSES, 2.5) is None


def test_bytes_by_a_moment_are_read_from_the_first_sample_at_or_after_it() -> None:
    trace = LoopbackTrace()
    trace.samples = [(100.0, 5_000), (100.5, 6_000), (101.0, 9_000)]
    assert [trace.sent_by(t) for t in (100.0, 100.2, 100.5, 100.7, 200.0)] == [
        0, 1_000, 1_000, 4_000, 4_000
    ]  # fmt: skip
    with LoopbackTrace(every_s=0.01) as live:  # sampled in a thread while the run goes on
        wait_for(lambda: len(live.samples) >= 3, 30, "three samples", 0.01)
    times = [t for t, _ in live.samples]
    assert times == sorted(times) and live.sent_by(time.time()) >= 0
