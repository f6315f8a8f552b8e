"""What a benchmark's network namespace sent on its loopback: every byte its nodes
exchanged (weights, deltas, data, checks, gossip), counted by the kernel, at the
end of a run (`loopback_bytes`) or at any moment of it (`LoopbackTrace`: a round's
end, a loss reached)."""

from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path


def loopback_bytes() -> int:
    """What this process's network namespace sent on its loopback (/proc/net/dev is
    per namespace; /sys/class/net is the mounting namespace's)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])  # transmitted bytes
    raise RuntimeError("no loopback in /proc/net/dev")


class LoopbackTrace:
    """The loopback's count every `every_s` seconds of wall-clock time (`time.time()`,
    the clock of a job's timeline), read in a thread while the run goes on."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, int]] = [(time.time(), loopback_bytes())]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="loopback", daemon=True)

    @property
    def began_at(self) -> float:
        return self.samples[0][0]

    def __enter__(self) -> LoopbackTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), loopback_bytes()))

    def _sample(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((time.time(), loopback_bytes()))

    def sent_by(self, at: float) -> int:
        """Bytes sent from the start to `at`, as of the first sample at or after it
        (so never fewer than were sent by then)."""
        index = bisect.bisect_left(self.samples, at, key=lambda sample: sample[0])
        index = min(index, len(self.samples) - 1)
        return self.samples[index][1] - self.samples[0][1]
