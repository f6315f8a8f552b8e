"""The volunteer's preferences decide when this node trains (`node.work.run.availability`):
time-of-day windows, a daily cap, idleness; a unit whose window closes is paused
where it stands (its runner stopped) and goes on when the window opens, with a clock
the test moves."""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path

import pytest
import sqlite_utils
import trio
from processes import process_state

from node.machine.idle import IdleSensor, InputWatch
from node.preferences import (
    PreferenceError,
    Preferences,
    apply_changes,
    chosen_gpus,
    parse_hours,
)
from node.work.run import Availability, RunnerRequest, TrainingDays, run_training
from protocol import Policy
from protocol.capacity import GpuInfo
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain


def _at(hour: int, minute: int, second: int = 0, day: int = 10) -> float:
    """A local time on a fixed day, as the clock gives it."""
    return time.mktime((2026, 11, day, hour, minute, second, 0, 0, -1))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _availability(prefs: Preferences, clock: Clock, tmp_path: Path, idle=lambda now: None):
    days = TrainingDays(sqlite_utils.Database(tmp_path / "node.db"))
    return Availability(lambda: prefs, days, idle, clock), days


@pytest.mark.parametrize(
    ("hours", "inside", "outside"),
    [
        ("22:00-07:00", [(22, 0), (3, 0), (6, 59)], [(7, 0), (12, 0), (21, 59)]),
        ("09:00-12:00, 13:00-17:30", [(9, 0), (11, 59), (17, 29)], [(12, 30), (17, 30), (8, 0)]),
        ("00:00-24:00", [(0, 0), (23, 59)], []),
    ],
)
def test_windows_say_when_the_node_trains(hours, inside, outside) -> None:
    windows = parse_hours(hours)
    for hour, minute in inside:
        assert any(w.contains(hour * 60 + minute) for w in windows), (hours, hour, minute)
    for hour, minute in outside:
        assert not any(w.contains(hour * 60 + minute) for w in windows), (hours, hour, minute)


@pytest.mark.parametrize("bad", ["22-07", "22:00", "25:00-01:00", "10:60-11:00", "a-b"])
def test_a_bad_window_is_refused_with_an_example(bad: str) -> None:
    with pytest.raises(PreferenceError, match="hours"):
        apply_changes(Policy(), Preferences(), {"hours": bad})


def test_the_clock_opens_and_closes_the_window(tmp_path: Path) -> None:
    clock = Clock(_at(21, 59))
    availability, _ = _availability(Preferences(hours="22:00-07:00"), clock, tmp_path)
    assert availability.tick(0) and availability.reason == "outside its hours (22:00-07:00)"
    clock.now = _at(22, 0)
    assert availability.tick(0) and availability.reason == ""
    clock.now = _at(7, 0, day=11)
    assert availability.tick(0) and "outside its hours" in availability.reason


def test_the_daily_cap_pauses_until_the_next_day_and_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock(_at(10, 0))
    prefs = Preferences(daily_gpu_hours=0.001)  # 3.6 s of training a day
    availability, _ = _availability(prefs, clock, tmp_path)
    for _ in range(3):  # 3 s at a 100% duty cycle: under the cap
        clock.now += 1
        availability.tick(1.0)
    assert availability.reason == ""
    clock.now += 1
    assert availability.tick(1.0) and availability.reason == "today's 0.001 h of training are used"
    restarted, _ = _availability(prefs, clock, tmp_path)  # the same node.db
    assert restarted.tick(0) and "training are used" in restarted.reason
    clock.now = _at(0, 1, day=11)
    assert restarted.tick(0) and restarted.reason == ""
    assert restarted.used_today_s() == 0


def test_a_half_duty_cycle_counts_half_and_a_long_gap_counts_nothing(tmp_path: Path) -> None:
    clock = Clock(_at(10, 0))
    availability, days = _availability(Preferences(daily_gpu_hours=1), clock, tmp_path)
    clock.now += 2
    availability.tick(0.5)
    clock.now += 3600  # the machine slept
    availability.tick(1.0)
    assert availability.used_today_s() == pytest.approx(1.0)


def test_an_active_user_pauses_training_until_idle_long_enough(tmp_path: Path) -> None:
    clock = Clock(_at(10, 0))
    last_input = {"t": clock.now - 5}
    availability, _ = _availability(
        Preferences(idle_minutes=10), clock, tmp_path, idle=lambda now: now - last_input["t"]
    )
    assert availability.tick(0) and "its user is active" in availability.reason
    clock.now += 10 * 60
    assert availability.tick(0) and availability.reason == ""
    last_input["t"] = clock.now - 1  # the user is back
    clock.now += 1
    assert availability.tick(0) and "its user is active" in availability.reason


def test_unknown_idleness_does_not_stop_training(tmp_path: Path) -> None:
    availability, _ = _availability(Preferences(idle_minutes=10), Clock(_at(10, 0)), tmp_path)
    assert not availability.tick(0) and availability.reason == ""


def test_the_chosen_gpus_are_the_ones_advertised() -> None:
    cards = [GpuInfo(f"card {i}", "cuda", 1024 * (i + 1)) for i in range(3)]
    assert chosen_gpus(cards, []) == cards
    assert [g.name for g in chosen_gpus(cards, [0, 2])] == ["card 0", "card 2"]
    cpu = [GpuInfo("x86_64", "cpu")]
    assert chosen_gpus(cpu, [1]) == cpu  # nothing to choose from on a CPU node


def test_terminal_input_is_read_from_access_times(tmp_path: Path) -> None:
    tty = tmp_path / "tty7"
    tty.touch()
    watch = InputWatch(str(tmp_path / "no-such-event*"), (str(tmp_path / "tty[0-9]*"),))
    assert watch.sources == "terminals"
    os.utime(tty, (1000.0, 1000.0))  # last input at t=1000
    assert watch.seconds_since_input(now=1600.0) == 600.0
    blind = InputWatch(str(tmp_path / "none*"), (str(tmp_path / "none*"),))
    assert blind.sources == "" and blind.seconds_since_input() is None


def test_without_input_idleness_is_others_cpu_load_below_the_threshold() -> None:
    threshold = {"pct": 101.0}  # anything counts as quiet
    sensor = IdleSensor(lambda: 0.0, lambda: threshold["pct"], InputWatch("/none*", ()))
    assert sensor.how == "the CPU load of other programs"
    start = time.time()
    assert sensor(start + 60) >= 60  # quiet since the sensor began
    threshold["pct"] = 0.0  # now any load is activity
    assert sensor(start + 61) == 0.0


@pytest.mark.slow
def test_a_closing_window_pauses_a_running_unit_and_the_opening_one_resumes_it(
    tmp_path: Path,
) -> None:
    """A real runner trains; the clock passes 07:00 (window 22:00-07:00): within 5 s the
    runner is stopped, and stays so; the clock reaches 22:00: it goes on and finishes."""
    clock = Clock(_at(6, 59, 50))
    availability, _ = _availability(Preferences(hours="22:00-07:00"), clock, tmp_path)
    spec = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=6000, hidden=(16,)))))
    unit = tmp_path / "unit"
    request = RunnerRequest.for_spec(
        spec, {}, unit / "weights.safetensors", gpu_memory_fraction=1.0, memory_limit_mb=0
    )
    steps: list[int] = []
    pids: set[int] = set()
    seen: dict[str, float] = {}

    def duty() -> float:
        return 0.0 if availability.reason else 100.0

    async def moves_the_clock() -> None:
        while not steps:  # training has begun
            await trio.sleep(0.05)
        clock.now = _at(7, 0, 1)
        availability.tick(1.0)
        moved = trio.current_time()
        (pid,) = pids
        while process_state(pid) != "T":
            assert trio.current_time() - moved < 5, "the runner was not stopped within 5 s"
            await trio.sleep(0.05)
        seen["stopped_after"] = trio.current_time() - moved
        paused_at = len(steps)
        await trio.sleep(2)
        seen["progress_while_paused"] = len(steps) - paused_at
        clock.now = _at(22, 0, 5)
        availability.tick(0)
        moved = trio.current_time()
        while process_state(pid) == "T":
            assert trio.current_time() - moved < 5, "the runner did not go on within 5 s"
            await trio.sleep(0.05)
        seen["resumed_after"] = trio.current_time() - moved

    async def main() -> dict:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(moves_the_clock)

            def on_event(event: dict) -> None:
                if event.get("event") == "progress":
                    steps.append(int(event["step"]))

            result = await run_training(request, unit, 600, on_event, duty_cycle=duty, pids=pids)
        return result

    result = trio.run(main)
    print(seen)
    assert seen["stopped_after"] < 5 and seen["resumed_after"] < 5
    assert seen["progress_while_paused"] <= 1  # at most one report already on its way
    assert result["steps"] == 6000 and os.path.exists(unit / "weights.safetensors")
    assert not pids  # the runner is gone
