"""The simulated clock: a heap of timed callbacks, run in time order.

Nothing here knows about nodes. Ties are broken by the order events were scheduled
(a counter in the heap entry), so a run depends only on its seed, never on how Python
happens to compare two callbacks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class Engine:
    """Event queue of (time, seq, callback, arg); `now` is the simulated time in s."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._queue: list[tuple[float, int, Callback, Any]] = []
        self._seq = itertools.count()

    def at(self, time: float, callback: Callback, arg: Any = None) -> None:
        """Run `callback(arg)` at simulated `time` (an argument, not a closure: cheaper
        for the millions of periodic events a large network schedules)."""
        heapq.heappush(self._queue, (time, next(self._seq), callback, arg))

    def after(self, delay: float, callback: Callback, arg: Any = None) -> None:
        self.at(self.now + delay, callback, arg)

    def run(self, until: float) -> None:
        """Process every event up to and including `until`, then leave the clock there."""
        queue = self._queue
        pop = heapq.heappop
        events = 0
        while queue and queue[0][0] <= until:
            time, _, callback, arg = pop(queue)
            self.now = time
            callback(arg)
            events += 1
        self.events += events
        self.now = until


def sweep_after(time: float, ttl: float, sweep: float) -> float:
    """When an entry last refreshed at `time` is dropped: the first sweep tick (a
    multiple of `sweep`) at which it is older than `ttl`, as the nodes' expiry loops do
    (`refreshed_at < now - ttl`)."""
    return (math.floor((time + ttl) / sweep) + 1) * sweep
