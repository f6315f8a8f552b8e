"""The volunteer's caps on blob transfer rates: one token bucket per direction for the
whole node, so that every fetch (or every serve) at once shares the cap.

Every byte is also counted per local day (`DailyBytes`), for the daily transfer cap.

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

import sqlite_utils
import trio

BURST_S = 0.25


class DailyBytes:
    """Blob bytes this node moved, both ways, per local day, for `daily_transfer_gb`:
    counted from the transfers' threads, written to node.db (`transfer_days`) by
    `today()` on the trio thread, so that a restart does not reset the day."""

    def __init__(self, db: sqlite_utils.Database | None = None) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        if db is not None:
            db["transfer_days"].create({"day": str, "bytes": int}, pk="day", if_not_exists=True)

    def add(self, n: int) -> None:
        day = local_day(time.time())
        with self._lock:
            self._pending[day] = self._pending.get(day, 0) + n

    def today(self) -> int:
        day = local_day(time.time())
        with self._lock:
            pending, self._pending = self._pending, {}
        if self._db is None:
            with self._lock:  # nowhere to keep it: keep counting in memory
                for d, n in pending.items():
                    self._pending[d] = self._pending.get(d, 0) + n
            return pending.get(day, 0)
        with self._db.conn:
            for d, n in pending.items():
                self._db.execute(
                    "INSERT INTO transfer_days (day, bytes) VALUES (?, ?) "
                    "ON CONFLICT(day) DO UPDATE SET bytes = bytes + excluded.bytes",
                    [d, n],
                )
        row = self._db.execute("SELECT bytes FROM transfer_days WHERE day = ?", [day]).fetchone()
        return int(row[0]) if row else 0


class RateCap:
    """Bytes per second from `rate()` (0: no cap), shared by every caller; every byte
    taken is counted in `meter` too."""

    def __init__(
        self,
        rate: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        meter: DailyBytes | None = None,
    ) -> None:
        self._rate = rate
        self._clock = clock
        self._meter = meter
        self._lock = threading.Lock()
        self._debt_until = clock()  # when the bytes taken so far are paid for

    def _wait_s(self, n: int) -> float:
        """Book `n` bytes; the seconds the caller must wait before sending them."""
        if self._meter is not None:
            self._meter.add(n)
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


def local_day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(now))


def mbit_s(rate_mbit: float) -> float:
    """Megabits per second (the preferences' unit) as bytes per second."""
    return rate_mbit * 1e6 / 8
