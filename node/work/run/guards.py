"""Machine guards: pause training while the machine runs hot, on battery, short of
memory, or running a program its volunteer named, as BOINC does.

Each guard is a preference (`node.preferences`) read against the machine
(`node.machine.sensors`), and says why it pauses in words the page, the ad and the
owner's timeline show. A guard that paused releases only past a margin (`COOL_C`
below a temperature cap, `SPARE_GB` above the memory floor), so a machine hovering at
its limit does not stop and start its runner every second. A reading the machine does
not offer never pauses.
"""

from __future__ import annotations

from node.machine.sensors import Readings
from node.preferences import Preferences

COOL_C = 5.0  # a temperature guard releases this far below its cap
SPARE_GB = 0.5  # the memory guard releases this far above its floor
COMM_LEN = 15  # the kernel keeps this much of a program's name in /proc/<pid>/comm


class Guards:
    """Which guards hold now (`tripped`), remembered between readings."""

    def __init__(self) -> None:
        self.tripped: set[str] = set()

    def reason(self, prefs: Preferences, readings: Readings, gpus: list[int]) -> str:
        """Why the machine guards pause training now, or "". `gpus`: the devices
        training uses (all that NVML reports when empty)."""
        reasons = [
            self._hot("cpu", readings.cpu_temp_c, prefs.max_cpu_temp_c, "CPU"),
            *(
                self._hot(f"gpu{i}", temp, prefs.max_gpu_temp_c, f"GPU {i}")
                for i, temp in sorted(readings.gpu_temp_c.items())
                if not gpus or i in gpus
            ),
            self._battery(prefs, readings.on_battery),
            self._memory(prefs.min_free_memory_gb, readings.free_memory_gb),
            exclusive_reason(prefs.exclusive_apps, readings.programs),
        ]
        return "; ".join(r for r in reasons if r)

    def _hold(self, name: str, past_limit: bool, within_margin: bool) -> bool:
        """Trip past the limit; once tripped, hold until back within the margin."""
        if past_limit or (name in self.tripped and not within_margin):
            self.tripped.add(name)
            return True
        self.tripped.discard(name)
        return False

    def _hot(self, name: str, temp: float | None, cap: float, what: str) -> str:
        if not cap or temp is None:
            self.tripped.discard(name)
            return ""
        if self._hold(name, temp >= cap, temp < cap - COOL_C):
            return f"{what} at {temp:.0f} °C (it trains below {cap - COOL_C:g} °C)"
        return ""

    def _battery(self, prefs: Preferences, on_battery: bool | None) -> str:
        if prefs.pause_on_battery and on_battery:
            return "on battery (it trains on mains power)"
        return ""

    def _memory(self, floor_gb: float, free_gb: float | None) -> str:
        if not floor_gb or free_gb is None:
            self.tripped.discard("memory")
            return ""
        if self._hold("memory", free_gb < floor_gb, free_gb >= floor_gb + SPARE_GB):
            return f"{free_gb:.1f} GB of memory left to other programs (it keeps {floor_gb:g} GB)"
        return ""


def wanted_readings(prefs: Preferences) -> frozenset[str]:
    """The sensors the guards set in `prefs` read (`Sensors.read`'s `wanted`)."""
    wanted = {
        "cpu_temp": bool(prefs.max_cpu_temp_c),
        "gpu_temp": bool(prefs.max_gpu_temp_c),
        "battery": prefs.pause_on_battery,
        "memory": bool(prefs.min_free_memory_gb),
        "programs": bool(prefs.exclusive_apps),
    }
    return frozenset(name for name, on in wanted.items() if on)


def exclusive_reason(apps: list[str], running: frozenset[str]) -> str:
    """The named programs that run now, matched by executable name (case aside; the
    kernel's 15-character short name too)."""
    found = [
        app
        for app in apps
        if (name := app.lower()) in running or (len(name) > COMM_LEN and name[:COMM_LEN] in running)
    ]
    if not found:
        return ""
    return f"{', '.join(found)} {'is' if len(found) == 1 else 'are'} running"
