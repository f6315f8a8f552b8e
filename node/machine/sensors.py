"""What the machine guards read: temperatures, the power supply, memory, running
programs, through one small interface (`Sensors.read`), so that a test drives it from
files laid out like the kernel's under a temporary root.

- CPU temperature: the hottest of `/sys/class/thermal/thermal_zone*/temp`
  (millidegrees Celsius);
- on battery: a `Battery` of `/sys/class/power_supply` is `Discharging` and no
  `Mains`/`USB` supply is `online`;
- memory left to other programs: `MemAvailable` of `/proc/meminfo`, plus what our
  own runners hold (`VmRSS`), since they would give it back by pausing;
- running programs: the names in `/proc/<pid>/comm` and the file names of
  `/proc/<pid>/exe`, lowercased, for `exclusive_apps`;
- GPU temperature, per device: NVML (`pynvml`), when installed and a driver answers.

A reading the machine does not offer is None (or empty): a guard that needs it does not
pause, and `missing()` names it, so the node says so once at start and in `doctor`.
A reading no guard asks for (`read`'s `wanted`: the guards set) is not taken: the node
reads every second, and walking /proc or asking NVML costs a volunteer's CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


#: every reading, by the name `read`'s `wanted` takes
READINGS = frozenset({"cpu_temp", "battery", "memory", "programs", "gpu_temp"})


@dataclass(frozen=True)
class Readings:
    cpu_temp_c: float | None = None  # the hottest thermal zone; None: no zone readable
    on_battery: bool | None = None  # None: no power supply class at all
    free_memory_gb: float | None = None  # left to other programs; None: no /proc/meminfo
    programs: frozenset[str] = frozenset()  # running executables' names, lowercased
    gpu_temp_c: dict[int, float] = field(default_factory=dict)  # by CUDA index; {}: no NVML


class Sensors:
    """Reads the machine under `root` ("/" in the node, a temporary tree in tests)."""

    def __init__(self, root: Path = Path("/"), nvml: object | None = None) -> None:
        self.root = root
        self._nvml = nvml if nvml is not None else _load_nvml() if root == Path("/") else None

    def read(self, own_pids: Iterable[int] = (), wanted: Collection[str] = READINGS) -> Readings:
        """One reading of what is `wanted` (the rest left None or empty)."""
        return Readings(
            cpu_temp_c=self.cpu_temp_c() if "cpu_temp" in wanted else None,
            on_battery=self.on_battery() if "battery" in wanted else None,
            free_memory_gb=self.free_memory_gb(list(own_pids)) if "memory" in wanted else None,
            programs=self.programs() if "programs" in wanted else frozenset(),
            gpu_temp_c=self.gpu_temp_c() if "gpu_temp" in wanted else {},
        )

    def missing(self) -> list[str]:
        """What this machine does not tell us, each with the guard it leaves without."""
        out = []
        if self.cpu_temp_c() is None:
            out.append("no CPU temperature (no readable /sys/class/thermal zone): max_cpu_temp_c")
        if self.on_battery() is None:
            out.append("no power supply information (/sys/class/power_supply): pause_on_battery")
        if self.free_memory_gb([]) is None:
            out.append("no /proc/meminfo: min_free_memory_gb")
        if not self.gpu_temp_c():
            out.append("no GPU temperature (no NVML, or no NVIDIA driver): max_gpu_temp_c")
        return out

    def cpu_temp_c(self) -> float | None:
        temps = []
        for zone in sorted((self.root / "sys/class/thermal").glob("thermal_zone*")):
            value = _read_number(zone / "temp")
            if value is not None:
                temps.append(value / 1000)
        return max(temps) if temps else None

    def on_battery(self) -> bool | None:
        supplies = sorted((self.root / "sys/class/power_supply").glob("*"))
        if not supplies:
            return None
        discharging = mains = False
        for supply in supplies:
            kind = _read_text(supply / "type")
            if kind == "Battery":
                discharging |= _read_text(supply / "status") == "Discharging"
            elif kind in ("Mains", "USB", "USB_C") and _read_number(supply / "online"):
                mains = True
        return discharging and not mains

    def free_memory_gb(self, own_pids: Iterable[int]) -> float | None:
        meminfo = _read_text(self.root / "proc/meminfo")
        available_kb = _field_kb(meminfo, "MemAvailable")
        if available_kb is None:
            return None
        for pid in own_pids:  # our runners would give theirs back by pausing
            available_kb += _field_kb(_read_text(self.root / f"proc/{pid}/status"), "VmRSS") or 0
        return available_kb / 1024 / 1024

    def programs(self) -> frozenset[str]:
        names = set()
        for entry in (self.root / "proc").glob("[0-9]*"):
            comm = _read_text(entry / "comm")
            if comm:
                names.add(comm.lower())
            with contextlib.suppress(OSError):  # another user's process, a kernel thread
                names.add(os.path.basename(os.readlink(entry / "exe")).lower())
        return frozenset(names)

    def gpu_temp_c(self) -> dict[int, float]:
        nvml = self._nvml
        if nvml is None:
            return {}
        try:
            count = nvml.nvmlDeviceGetCount()  # type: ignore[attr-defined]
            return {
                i: float(
                    nvml.nvmlDeviceGetTemperature(  # type: ignore[attr-defined]
                        nvml.nvmlDeviceGetHandleByIndex(i),  # type: ignore[attr-defined]
                        0,  # NVML_TEMPERATURE_GPU
                    )
                )
                for i in range(count)
            }
        except Exception as exc:  # a driver that went away: the guard waits for it
            log.debug("NVML temperature read failed: %s", exc)
            return {}


def _load_nvml() -> object | None:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_number(path: Path) -> float | None:
    try:
        return float(_read_text(path))
    except ValueError:
        return None


def _field_kb(text: str, name: str) -> float | None:
    """`name:   1234 kB` from /proc/meminfo or /proc/<pid>/status."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key == name:
            try:
                return float(rest.split()[0])
            except (IndexError, ValueError):
                return None
    return None
