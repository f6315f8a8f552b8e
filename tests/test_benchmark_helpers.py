"""The benchmarks' own arithmetic, where a figure in docs/performance.md rests on it."""

from __future__ import annotations

import pytest

from benchmarks.hivemind import ROUND_SAMPLES, loss_at_samples

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
    assert loss_at_samples(LOSSES, samples) == pytest.approx(loss)
