"""The machine guards' sensors read files laid out like the kernel's, under a
temporary root, and a real child process for the running programs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.machine.sensors import READINGS, Readings, Sensors


def _write(root: Path, path: str, text: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _laptop(root: Path, *, status: str, mains: int) -> None:
    _write(root, "sys/class/thermal/thermal_zone0/temp", "41000\n")
    _write(root, "sys/class/thermal/thermal_zone1/temp", "78500\n")  # the package: hottest
    _write(root, "sys/class/thermal/thermal_zone2/temp", "garbage\n")  # unreadable: skipped
    _write(root, "sys/class/power_supply/BAT0/type", "Battery\n")
    _write(root, "sys/class/power_supply/BAT0/status", f"{status}\n")
    _write(root, "sys/class/power_supply/AC/type", "Mains\n")
    _write(root, "sys/class/power_supply/AC/online", f"{mains}\n")
    _write(root, "proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable:  2097152 kB\n")
    _write(root, "proc/4242/status", "Name:\trunner\nVmRSS:\t 1048576 kB\n")


def test_a_laptop_on_battery_reads_hot_and_short_of_memory(tmp_path: Path) -> None:
    _laptop(tmp_path, status="Discharging", mains=0)
    sensors = Sensors(tmp_path)
    reading = sensors.read(own_pids=[4242])
    assert reading.cpu_temp_c == 78.5
    assert reading.on_battery is True
    # 2 GiB available, plus the 1 GiB our runner would give back by pausing
    assert reading.free_memory_gb == 3.0
    assert reading.gpu_temp_c == {}  # no NVML under a test root
    assert sensors.missing() == [
        "no GPU temperature (no NVML, or no NVIDIA driver): max_gpu_temp_c"
    ]


def test_plugged_in_is_not_on_battery_and_a_bare_machine_names_what_it_lacks(
    tmp_path: Path,
) -> None:
    _laptop(tmp_path / "laptop", status="Charging", mains=1)
    assert Sensors(tmp_path / "laptop").on_battery() is False
    _laptop(tmp_path / "full", status="Discharging", mains=1)  # mains online: not on battery
    assert Sensors(tmp_path / "full").on_battery() is False
    bare = Sensors(tmp_path / "bare")
    reading = bare.read()
    assert (reading.cpu_temp_c, reading.on_battery, reading.free_memory_gb) == (None, None, None)
    assert [gap.split(":")[-1].strip() for gap in bare.missing()] == [
        "max_cpu_temp_c",
        "pause_on_battery",
        "min_free_memory_gb",
        "max_gpu_temp_c",
    ]


@pytest.mark.process  # a real child process
def test_running_programs_are_seen_by_their_file_name(tmp_path: Path) -> None:
    """A real child process, started from a copy of `sleep` named like a game."""
    game = tmp_path / "supertuxkart"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", game)
    child = subprocess.Popen([game, "30"])
    try:
        running = Sensors().programs()
        assert "supertuxkart" in running
        assert Path(sys.executable).name.lower() in running or "python" in " ".join(running)
    finally:
        child.kill()
        child.wait()
    assert os.path.basename(game) not in Sensors().programs()


def test_only_the_readings_the_set_guards_need_are_taken(tmp_path: Path) -> None:
    """The node reads every second: a guard left off costs no /proc walk, no NVML call."""
    from node.preferences import Preferences
    from node.work.run.guards import wanted_readings

    assert wanted_readings(Preferences(pause_on_battery=False)) == frozenset()
    assert wanted_readings(Preferences()) == {"battery"}  # on by default
    every = Preferences(
        max_cpu_temp_c=80, max_gpu_temp_c=80, min_free_memory_gb=1, exclusive_apps=["steam"]
    )
    assert wanted_readings(every) == READINGS

    class Counting:
        calls = 0

        def nvmlDeviceGetCount(self) -> int:  # noqa: N802 (NVML's name)
            Counting.calls += 1
            return 0

    sensors = Sensors(tmp_path, nvml=Counting())
    assert sensors.read(wanted={"battery"}) == Readings()
    assert Counting.calls == 0
    sensors.read(wanted={"gpu_temp"})
    assert Counting.calls == 1
