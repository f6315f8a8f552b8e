"""What a replay is compared with (`node.work.trust.comparisons`): a share's check
compares its checkpoint 0 only when segment 0 was replayed, and its delta only when
the last segment was; what it compares, it compares strictly."""

from __future__ import annotations

import math

import pytest

from node.work.trust import compare_replay, replay_table

STEPS = [0, 10, 20]
CPS = [f"{i:064x}" for i in range(3)]
DELTA = "d" * 64


def _replay(init: str | None, ends: list[str], delta: str | None) -> dict:
    replay: dict = {"ends": ends, "distances": [], "evaluations": [{} for _ in ends]}
    if init is not None:
        replay["init_sha256"] = init
    if delta is not None:
        replay["weights_sha256"] = delta
    return replay


@pytest.mark.parametrize(
    ("chosen", "replay", "failed_at"),
    [
        ([0], _replay(CPS[0], [CPS[1]], None), None),  # segment 0: its start checked
        ([0], _replay("e" * 64, [CPS[1]], None), 0),  # not the round's weights
        ([1], _replay(None, [CPS[2]], DELTA), None),  # the last: the delta checked
        ([1], _replay(None, [CPS[2]], "f" * 64), -1),  # a delta not from its last state
        ([1], _replay(None, ["e" * 64], DELTA), 2),  # the segment itself
    ],
)
def test_a_share_compares_the_ends_it_replayed(
    chosen: list[int], replay: dict, failed_at: int | None
) -> None:
    failure = compare_replay(
        replay, STEPS, chosen, CPS, False, DELTA, start=0 in chosen, end=1 in chosen
    )
    assert (failure.index if failure else None) == failed_at


def test_a_units_replay_table_asks_for_its_start_and_its_last_state() -> None:
    table = replay_table(STEPS, [1], CPS, cross=True)
    assert table["init"] is True and table["final"] == CPS[-1]
    assert table["init_claimed"] == CPS[0]
    assert table["segments"] == [{"start": 10, "end": 20, "from": CPS[1], "claimed": CPS[2]}]


@pytest.mark.parametrize(
    ("distance", "ratio", "kinds", "fails"),
    [
        (5e-4, 0.9, False, False),  # within the tolerance: either way
        (3.7e-3, 0.2, True, False),  # a GPU's honest noise, checked on a CPU
        (3.7e-3, 0.2, False, True),  # the same between two CPUs: too far
        (3.7e-3, 0.9, True, True),  # about a step off: a skipped step
        (3.7e-3, math.inf, True, True),  # no ratio measured: the tolerance alone
    ],
)
def test_across_device_kinds_a_segment_may_be_off_by_a_share_of_its_last_step(
    distance: float, ratio: float, kinds: bool, fails: bool
) -> None:
    replay = {
        "ends": ["e" * 64],
        "distances": [distance],
        "step_ratios": [ratio],
        "evaluations": [{}],
        "weights_sha256": DELTA,
    }
    failure = compare_replay(replay, STEPS, [1], CPS, True, DELTA, start=False, kinds=kinds)
    assert (failure is not None) == fails
    if failure is not None and kinds:
        assert "of its last step" in failure.reason
