"""The machine guards (`node.work.run.guards`): each pauses training for a reason the
volunteer can read and lets it go on past a margin; a real runner is stopped and
continued by each in turn, driven through the sensors' files."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import sqlite_utils
import trio
from processes import process_state

from node.machine.sensors import Readings, Sensors
from node.preferences import PreferenceError, Preferences
from node.work.run import Availability, RunnerRequest, TrainingDays, run_training
from node.work.run.guards import Guards, exclusive_reason
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain


def test_a_hot_cpu_pauses_at_its_cap_and_goes_on_five_degrees_below() -> None:
    guards, prefs = Guards(), Preferences(max_cpu_temp_c=85)
    temps = [80, 85, 84, 81, 80, 79, 85]
    paused = [bool(guards.reason(prefs, Readings(cpu_temp_c=t), [])) for t in temps]
    assert paused == [False, True, True, True, True, False, True]
    assert guards.reason(prefs, Readings(cpu_temp_c=90), []) == (
        "CPU at 90 °C (it trains below 80 °C)"
    )
    assert guards.reason(prefs, Readings(cpu_temp_c=None), []) == ""  # no sensor: no pause
    assert guards.reason(Preferences(), Readings(cpu_temp_c=120), []) == ""  # no cap


def test_only_the_gpus_in_use_are_watched() -> None:
    guards, prefs = Guards(), Preferences(max_gpu_temp_c=80)
    hot_1 = Readings(gpu_temp_c={0: 60, 1: 83})
    assert guards.reason(prefs, hot_1, []) == "GPU 1 at 83 °C (it trains below 75 °C)"
    assert guards.reason(prefs, hot_1, [0]) == ""


def test_battery_memory_and_programs_each_say_why() -> None:
    guards = Guards()
    on_battery = Readings(on_battery=True)
    assert guards.reason(Preferences(), on_battery, []) == "on battery (it trains on mains power)"
    assert guards.reason(Preferences(pause_on_battery=False), on_battery, []) == ""
    prefs = Preferences(min_free_memory_gb=4)
    short = [3.9, 4.2, 4.6, 3.0]  # released only at 4.5 GB
    paused = [bool(guards.reason(prefs, Readings(free_memory_gb=gb), [])) for gb in short]
    assert paused == [True, True, False, True]
    assert guards.reason(prefs, Readings(free_memory_gb=1.25), []) == (
        "1.2 GB of memory left to other programs (it keeps 4 GB)"
    )
    running = frozenset({"bash", "steam", "obs-studio-brow"})  # comm keeps 15 characters
    apps = ["Steam", "zoom", "obs-studio-browser"]
    assert exclusive_reason(apps, running) == "Steam, obs-studio-browser are running"
    assert exclusive_reason(["zoom"], running) == ""
    both = Readings(on_battery=True, programs=frozenset({"zoom"}))
    assert Guards().reason(Preferences(exclusive_apps=["zoom"]), both, []) == (
        "on battery (it trains on mains power); zoom is running"
    )


@pytest.mark.parametrize("bad", ["", "/usr/bin/steam", "a b", "x" * 65, "game;rm"])
def test_an_exclusive_app_must_be_a_file_name(bad: str) -> None:
    with pytest.raises(PreferenceError, match="exclusive_apps"):
        Preferences(exclusive_apps=[bad]).check()


def _write(root: Path, path: str, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


class FakeNvml:
    """pynvml's calls the GPU temperature guard makes, answering `temps` by index."""

    def __init__(self, temps: dict[int, float]) -> None:
        self.temps = temps

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's names)
        return len(self.temps)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> float:  # noqa: N802
        return self.temps[handle]


@pytest.mark.slow
def test_each_guard_stops_a_real_runner_and_lets_it_go_on(tmp_path: Path) -> None:
    """One runner trains while each guard in turn is tripped through the sensors'
    files (or a real program) and released: each time it is stopped where it stands
    (SIGSTOP: its unit keeps its lease, its time limit does not run) and continued."""
    root = tmp_path / "machine"
    _write(root, "sys/class/thermal/thermal_zone0/temp", "50000")
    _write(root, "sys/class/power_supply/BAT0/type", "Battery")
    _write(root, "sys/class/power_supply/BAT0/status", "Charging")
    _write(root, "proc/meminfo", "MemAvailable: 8388608 kB")
    game = tmp_path / "supertuxkart"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", game)
    nvml = FakeNvml({0: 60.0})
    files, real = Sensors(root, nvml=nvml), Sensors()

    def read(wanted: frozenset[str]) -> Readings:
        assert wanted == {"cpu_temp", "gpu_temp", "battery", "memory", "programs"}
        reading = files.read(wanted=wanted - {"programs"})
        return dataclasses.replace(reading, programs=real.programs())

    prefs = Preferences(
        max_cpu_temp_c=80, max_gpu_temp_c=80, min_free_memory_gb=2, exclusive_apps=["supertuxkart"]
    )
    days = TrainingDays(sqlite_utils.Database(tmp_path / "node.db"))
    availability = Availability(lambda: prefs, days, lambda now: None, time.time, read)
    spec = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=20_000, hidden=(16,)))))
    unit = tmp_path / "unit"
    request = RunnerRequest.for_spec(
        spec, {}, unit / "weights.safetensors", gpu_memory_fraction=1.0, memory_limit_mb=0
    )
    steps: list[int] = []
    pids: set[int] = set()
    reasons: list[str] = []
    game_process: list[subprocess.Popen] = []

    def trip_and_release(name: str) -> tuple:
        if name == "cpu":
            return (
                lambda: _write(root, "sys/class/thermal/thermal_zone0/temp", "91000"),
                lambda: _write(root, "sys/class/thermal/thermal_zone0/temp", "60000"),
            )
        if name == "gpu":  # NVML's answer, as a driver would give it
            return (
                lambda: nvml.temps.update({0: 85.0}),
                lambda: nvml.temps.update({0: 70.0}),
            )
        if name == "battery":
            return (
                lambda: _write(root, "sys/class/power_supply/BAT0/status", "Discharging"),
                lambda: _write(root, "sys/class/power_supply/BAT0/status", "Charging"),
            )
        if name == "memory":
            return (
                lambda: _write(root, "proc/meminfo", "MemAvailable: 1048576 kB"),
                lambda: _write(root, "proc/meminfo", "MemAvailable: 8388608 kB"),
            )
        return (lambda: game_process.append(subprocess.Popen([game, "60"])),
                lambda: (game_process[0].kill(), game_process[0].wait()))  # fmt: skip

    async def wait_state(pid: int, stopped: bool, what: str) -> None:
        deadline = trio.current_time() + 30  # a deadline, not a timing: a loaded machine
        while (process_state(pid) == "T") != stopped:
            assert trio.current_time() < deadline, what
            await trio.sleep(0.05)

    async def guards_in_turn(cancel: trio.CancelScope) -> None:
        while not steps:
            await trio.sleep(0.05)
        (pid,) = pids
        for name in ("cpu", "gpu", "battery", "memory", "program"):
            trip, release = trip_and_release(name)
            trip()
            availability.tick(1.0)
            reasons.append(availability.reason)
            await wait_state(pid, True, f"the {name} guard to stop the runner")
            release()
            availability.tick(0)
            assert availability.reason == ""
            await wait_state(pid, False, f"the runner to go on after the {name} guard")
        cancel.cancel()  # every guard seen: the rest of training is not needed

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guards_in_turn, nursery.cancel_scope)
            duty = lambda: 0.0 if availability.reason else 100.0  # noqa: E731

            def on_event(event: dict) -> None:
                if event.get("event") == "progress":
                    steps.append(int(event["step"]))

            await run_training(request, unit, 600, on_event, duty_cycle=duty, pids=pids)

    try:
        trio.run(main)
    finally:
        for child in game_process:
            child.kill()
    assert reasons == [
        "CPU at 91 °C (it trains below 75 °C)",
        "GPU 0 at 85 °C (it trains below 75 °C)",
        "on battery (it trains on mains power)",
        "1.0 GB of memory left to other programs (it keeps 2 GB)",
        "supertuxkart is running",
    ]
    assert not pids  # the runner went with the cancelled run
