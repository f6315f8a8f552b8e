"""The volunteer's caps on blob transfer rates: one token bucket per direction for the
whole node, so that every fetch (or every serve) at once shares the cap.

`take(n)` blocks the calling thread (the direct channel's threads), `take_async(n)`
the trio task (the libp2p path), until `n` more bytes fit the cap. The cap is read at
each call, so a change of preference applies to transfers already under way. A burst
of at most a quarter second's bytes passes at once: a cap of a few Mbit/s still moves
a whole 64 KiB chunk in one send.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import trio

BURST_S = 0.25


class RateCap:
    """Bytes per second from `rate()` (0: no cap), shared by every caller."""

    def __init__(self, rate: Callable[[], float], clock: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._clock = clock
        self._lock = threading.Lock()
        self._debt_until = clock()  # when the bytes taken so far are paid for

    def _wait_s(self, n: int) -> float:
        """Book `n` bytes; the seconds the caller must wait before sending them."""
        rate = self._rate()
        if rate <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._debt_until = max(self._debt_until, now) + n / rate
            return max(0.0, self._debt_until - now - BURST_S)

    def take(self, n: int) -> None:
        wait = self._wait_s(n)
        if wait:
            time.sleep(wait)

    async def take_async(self, n: int) -> None:
        wait = self._wait_s(n)
        if wait:
            await trio.sleep(wait)


def mbit_s(rate_mbit: float) -> float:
    """Megabits per second (the preferences' unit) as bytes per second."""
    return rate_mbit * 1e6 / 8
