"""What finding peers costs this node: capacity ads and ad tables in and out, their
bytes, the CPU of checking them, and the whole process's CPU, per minute.

Every node receives every peer's ad every refresh (docs/performance.md: 10.4-11.8 ms
of CPU per ad, GossipSub included), so at some network size discovery is what a
volunteer's machine spends its time on. These figures show when that happens, on
`/metrics` and the status page. `check_cpu` is only our part (decoding, the
signature, the peer table); GossipSub's own work shows in the process's CPU, which on
an idle volunteer is mostly discovery.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from node.metrics import NodeMetrics

WINDOW_S = 60.0
SAMPLE_EVERY_S = 5.0


#: message kind -> its name in the per-minute figures
KINDS = {
    "ad": "ads",
    "table": "tables",
    "register": "registrations",
    "query": "queries",
    "probe": "probes",
    "listing": "listing_checks",
}


@dataclass
class _Totals:
    messages: dict[str, int] = field(default_factory=dict)  # "in:ad", "out:probe", ...
    bytes_in: int = 0
    bytes_out: int = 0
    check_cpu_s: float = 0.0
    process_cpu_s: float = 0.0

    def copy(self) -> _Totals:
        return _Totals(dict(self.messages), *self._numbers())

    def _numbers(self) -> tuple[int, int, float, float]:
        return self.bytes_in, self.bytes_out, self.check_cpu_s, self.process_cpu_s

    def minus(self, other: _Totals) -> _Totals:
        keys = self.messages.keys() | other.messages.keys()
        counts = {k: self.messages.get(k, 0) - other.messages.get(k, 0) for k in keys}
        numbers = (a - b for a, b in zip(self._numbers(), other._numbers(), strict=True))
        return _Totals(counts, *numbers)


@dataclass
class DiscoveryCost:
    metrics: NodeMetrics
    clock: Callable[[], float] = time.monotonic
    totals: _Totals = field(default_factory=_Totals)
    _samples: deque[tuple[float, _Totals]] = field(default_factory=deque)

    def received(self, data: bytes, kind: str = "ad") -> None:
        """A discovery message came in: an ad, an ad table, a registration (at a
        directory), a query's answer or a probe's answer."""
        self._count("in", kind, len(data))

    def sent(self, data: bytes, kind: str = "ad") -> None:
        self._count("out", kind, len(data))

    def _count(self, direction: str, kind: str, size: int) -> None:
        key = f"{direction}:{kind}"
        self.totals.messages[key] = self.totals.messages.get(key, 0) + 1
        if direction == "in":
            self.totals.bytes_in += size
        else:
            self.totals.bytes_out += size
        self.metrics.discovery_messages.labels(direction, kind).inc()
        self.metrics.discovery_bytes.labels(direction).inc(size)

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Count the CPU of the block (this thread's) as discovery's."""
        start = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - start
            self.totals.check_cpu_s += spent
            self.metrics.discovery_check_cpu.inc(spent)

    def sample(self) -> None:
        """Keep a snapshot every `SAMPLE_EVERY_S` for the per-minute figures."""
        now = self.clock()
        if self._samples and now - self._samples[-1][0] < SAMPLE_EVERY_S:
            return
        self.totals.process_cpu_s = time.process_time()
        self._samples.append((now, self.totals.copy()))
        while len(self._samples) > 2 and now - self._samples[1][0] >= WINDOW_S:
            self._samples.popleft()

    def per_minute(self) -> dict[str, float]:
        """Rates over the last minute (or as much of it as was seen), per minute."""
        self.sample()
        if len(self._samples) < 2:
            return {}
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        span = t1 - t0
        if span <= 0:
            return {}
        d = last.minus(first)
        scale = 60.0 / span
        counts = {
            f"{plural}_{direction}": round(d.messages.get(f"{direction}:{kind}", 0) * scale, 1)
            for kind, plural in KINDS.items()
            for direction in ("in", "out")
        }
        return {
            "window_s": round(span, 1),
            **counts,
            "messages": round(sum(d.messages.values()) * scale, 1),
            "bytes_in": round(d.bytes_in * scale),
            "bytes_out": round(d.bytes_out * scale),
            "check_cpu_ms": round(d.check_cpu_s * scale * 1000, 1),
            "node_cpu_pct": round(100 * d.process_cpu_s / span, 2),
        }
