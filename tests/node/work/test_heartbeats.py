"""A running unit's heartbeats (`node.work.heartbeats.Heartbeats`), against an owner
that only records what it is sent: the phase each says, and when. The moment an
eager share's runner begins to wait for its round's weights, a heartbeat says
`waiting` at once (the owner holds its answer until the weights exist); a volunteer's
pause says `paused` above all. Time is trio's mock clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from node.work.heartbeats import (
    HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    Heartbeats,
    HeldEvidence,
    RunningUnit,
)
from protocol import open_envelope
from protocol.work import WORK_LIMITS, Progress, ProgressAck, WorkPackage, encode_progress_ack
from tests.contexts import offline_context

JOB, UNIT = "ab" * 8, "cd" * 8


class Owner:
    """The owner's end of `/meshminer/progress/1`: every heartbeat answered "go on"."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, str]] = []

    async def request(self, peer: str, protocol: str, data: bytes, *_: object, **__: object):
        progress = open_envelope(data, Progress, limits=WORK_LIMITS).message
        self.heard.append((trio.current_time(), progress.phase))
        return encode_progress_ack(ProgressAck(True))

    def allow_redial(self, peer: str) -> None:
        raise AssertionError("every heartbeat is answered")


def _unit() -> RunningUnit:
    package = WorkPackage(JOB, UNIT, b"", [], b"", b"k" * 32, 1.0, 30.0)
    unit = RunningUnit("12D3KooWowner", package, None, {})
    unit.phase, unit.takes = "training", True
    return unit


def test_a_runner_that_begins_to_wait_is_heard_at_once_and_a_pause_above_all(
    tmp_path: Path,
) -> None:
    owner, paused = Owner(), [""]
    ctx = offline_context(tmp_path, host=owner, paused_because=lambda: paused[0])
    beats, unit = Heartbeats(ctx, HeldEvidence(ctx.blobs)), _unit()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(beats.run, unit, nursery)
            await trio.sleep(2.5)  # a heartbeat a second while it trains
            unit.waiting = True  # the runner's `waiting` event, as the worker handles it
            unit.committed.set()
            await trio.sleep(0.05)
            assert owner.heard[-1] == (pytest.approx(2.5), "waiting")
            paused[0] = "its user is active"
            await trio.sleep(1.0)
            assert owner.heard[-1][1] == "paused"
            paused[0] = ""
            unit.taken = "f" * 64  # the weights came: it trains on
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    beat = HEARTBEAT_S + MIN_HEARTBEAT_S  # a second, then at most every 0.1 s
    times = [pytest.approx(t) for t in (0.0, beat, 2 * beat)]
    assert owner.heard[:3] == list(zip(times, ["training"] * 3, strict=True))
    assert owner.heard[-1][1] == "training"
