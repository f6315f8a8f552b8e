"""How long since the volunteer last used the machine, for `idle_minutes`.

Input is read where Linux lets this process read it:
- keyboards and mice (`/dev/input/event*`, readable by root or the `input` group):
  opened only once `idle_minutes` is set, a thread waits on them and notes the time
  of each event, never its content, so a returning user pauses training within a
  second;
- terminals (`/dev/tty*`, `/dev/pts/*`): the kernel stamps a terminal's access time
  on input, at 8 s granularity.
Where neither can be read, idle means the CPU time of everything but our own training
(`own_cpu_s`) stayed below `idle_load_pct` of the machine.
"""

from __future__ import annotations

import glob
import logging
import os
import select
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TTY_GLOBS = ("/dev/tty[0-9]*", "/dev/pts/[0-9]*")
EVENT_GLOB = "/dev/input/event*"


class InputWatch:
    """Seconds since the last keyboard, mouse or terminal input, or None when this
    process can read none of them."""

    def __init__(self, event_glob: str = EVENT_GLOB, tty_globs: tuple[str, ...] = TTY_GLOBS):
        self._event_glob = event_glob
        self._tty_globs = tty_globs
        self._last_event = 0.0  # wall time of the newest device event
        self._devices: list[int] | None = None  # opened when first asked: idle_minutes set

    def _open(self) -> list[int]:
        if self._devices is None:
            self._devices = _open_readable(sorted(glob.glob(self._event_glob)))
            if self._devices:
                self._last_event = time.time()  # unknown before we watched: count from now
                threading.Thread(target=self._watch, name="input-watch", daemon=True).start()
        return self._devices

    @property
    def sources(self) -> str:
        """What is read, for the page: "" when nothing can be."""
        self._open()
        found = []
        if self._devices:
            found.append(f"{len(self._devices)} input device(s)")
        if self._ttys():
            found.append("terminals")
        return " and ".join(found)

    def seconds_since_input(self, now: float | None = None) -> float | None:
        now = time.time() if now is None else now
        stamps = [self._last_event] if self._open() else []
        for tty in self._ttys():
            try:
                stamps.append(os.stat(tty).st_atime)
            except OSError:
                continue
        if not stamps:
            return None
        return max(0.0, now - max(stamps))

    def _ttys(self) -> list[str]:
        return [path for pattern in self._tty_globs for path in glob.glob(pattern)]

    def _watch(self) -> None:
        assert self._devices is not None
        while self._devices:
            try:
                ready, _, _ = select.select(self._devices, [], [], 60)
            except (OSError, ValueError):
                return
            for fd in ready:
                try:
                    if os.read(fd, 4096):
                        self._last_event = time.time()
                except BlockingIOError:
                    continue
                except OSError:  # unplugged
                    self._devices.remove(fd)
                    os.close(fd)


def _open_readable(paths: list[str]) -> list[int]:
    fds = []
    for path in paths:
        try:
            fds.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        except OSError:
            continue
    return fds


class OtherLoad:
    """The share of the machine's CPU used by everything but our own training,
    measured between calls from /proc/stat."""

    def __init__(self, own_cpu_s: Callable[[], float]) -> None:
        self._own_cpu_s = own_cpu_s
        self._last = self._sample()

    def percent(self) -> float | None:
        """Since the previous call; None where /proc/stat cannot be read."""
        now = self._sample()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        busy = (now[0] - last[0]) - (now[2] - last[2])
        total = now[1] - last[1]
        return max(0.0, min(100.0, 100.0 * busy / total)) if total > 0 else 0.0

    def _sample(self) -> tuple[float, float, float] | None:
        """(busy CPU seconds, all CPU seconds, our training's CPU seconds)."""
        try:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields) - idle) / tick, sum(fields) / tick, self._own_cpu_s()


def process_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` (all its threads, and its children once reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class IdleSensor:
    """Seconds the user has been away: since the last input where input can be read,
    else since others' CPU use last reached `threshold_pct()`."""

    def __init__(
        self,
        own_cpu_s: Callable[[], float],
        threshold_pct: Callable[[], float],
        watch: InputWatch | None = None,
    ) -> None:
        self.watch = watch if watch is not None else InputWatch()
        self._load = OtherLoad(own_cpu_s)
        self._threshold_pct = threshold_pct
        self._quiet_since = time.time()

    @property
    def how(self) -> str:
        sources = self.watch.sources
        return f"input from {sources}" if sources else "the CPU load of other programs"

    def __call__(self, now: float) -> float | None:
        seconds = self.watch.seconds_since_input(now)
        if seconds is not None:
            return seconds
        percent = self._load.percent()
        if percent is None:
            return None
        if percent >= self._threshold_pct():
            self._quiet_since = now
        return max(0.0, now - self._quiet_since)
