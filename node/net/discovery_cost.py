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


@dataclass
class _Totals:
    ads_in: int = 0
    ads_out: int = 0
    tables_in: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    check_cpu_s: float = 0.0
    process_cpu_s: float = 0.0

    def minus(self, other: _Totals) -> _Totals:
        return _Totals(**{k: getattr(self, k) - getattr(other, k) for k in vars(self)})


@dataclass
class DiscoveryCost:
    metrics: NodeMetrics
    clock: Callable[[], float] = time.monotonic
    totals: _Totals = field(default_factory=_Totals)
    _samples: deque[tuple[float, _Totals]] = field(default_factory=deque)

    def received(self, data: bytes, kind: str = "ad") -> None:
        if kind == "ad":
            self.totals.ads_in += 1
        else:
            self.totals.tables_in += 1
        self.totals.bytes_in += len(data)
        self.metrics.discovery_messages.labels("in", kind).inc()
        self.metrics.discovery_bytes.labels("in").inc(len(data))

    def published(self, data: bytes) -> None:
        self.totals.ads_out += 1
        self.totals.bytes_out += len(data)
        self.metrics.discovery_messages.labels("out", "ad").inc()
        self.metrics.discovery_bytes.labels("out").inc(len(data))

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
        self._samples.append((now, _Totals(**vars(self.totals))))
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
        return {
            "window_s": round(span, 1),
            "ads_in": round(d.ads_in * scale, 1),
            "ads_out": round(d.ads_out * scale, 1),
            "tables_in": round(d.tables_in * scale, 1),
            "bytes_in": round(d.bytes_in * scale),
            "bytes_out": round(d.bytes_out * scale),
            "check_cpu_ms": round(d.check_cpu_s * scale * 1000, 1),
            "node_cpu_pct": round(100 * d.process_cpu_s / span, 2),
        }
