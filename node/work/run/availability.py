"""Whether this node may train now, by its volunteer's preferences (`node.preferences`).

Checked every `TICK_S`: outside the `hours` windows, while the user is at the machine
(`idle_minutes`), once today's `daily_gpu_hours` are used, or while a machine guard
holds (hot, on battery, short of memory, a named program running: `guards`), `reason`
says why not.
A runner already training is then stopped where it stands (SIGSTOP, see
`executor._duty_cycle`) and continued when the reason clears: its unit is paused, not
failed, and its time limit does not run while it waits. New offers are declined for
the reason, and the capacity ad carries it so that owners look elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlite_utils
import trio

from node.machine.sensors import Readings
from node.preferences import Preferences
from node.work.run.guards import Guards, wanted_readings

TICK_S = 1.0
MAX_TICK_S = 10.0  # a longer gap (a suspended laptop) is not counted as training


def local_day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(now))


def minute_of_day(now: float) -> int:
    moment = time.localtime(now)
    return moment.tm_hour * 60 + moment.tm_min


class TrainingDays:
    """Seconds trained per local day, in node.db, so a restart does not reset the cap."""

    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        db["training_days"].create({"day": str, "seconds": float}, pk="day", if_not_exists=True)

    def used_s(self, day: str) -> float:
        row = self._db.execute("SELECT seconds FROM training_days WHERE day = ?", [day]).fetchone()
        return float(row[0]) if row else 0.0

    def add(self, day: str, seconds: float) -> None:
        with self._db.conn:
            self._db.execute(
                "INSERT INTO training_days (day, seconds) VALUES (?, ?) "
                "ON CONFLICT(day) DO UPDATE SET seconds = seconds + excluded.seconds",
                [day, seconds],
            )


class Availability:
    """`reason` is "" while the node may train, else why not (for the ad, the page,
    the offer's decline and the owner's timeline)."""

    def __init__(
        self,
        preferences: Callable[[], Preferences],
        days: TrainingDays,
        idle_s: Callable[[float], float | None],
        clock: Callable[[], float] = time.time,
        sensors: Callable[[frozenset[str]], Readings] | None = None,
    ) -> None:
        self._preferences = preferences
        self._days = days
        self._idle_s = idle_s  # seconds since the user was last active, or None: unknown
        self._clock = clock
        # the machine now (`Sensors.read` of the readings named), or None
        self._sensors = sensors
        self.guards = Guards()
        self._last = clock()
        self.reason = ""

    def tick(self, training_share: float) -> bool:
        """Count the training since the last tick (`training_share` of the time was
        spent training: 0 when nothing ran) and decide again; True when `reason`
        changed."""
        now = self._clock()
        elapsed, self._last = now - self._last, now
        if training_share > 0 and not self.reason and 0 < elapsed <= MAX_TICK_S:
            self._days.add(local_day(now), elapsed * min(1.0, training_share))
        reason = self.why_not(now)
        changed, self.reason = reason != self.reason, reason
        return changed

    def why_not(self, now: float) -> str:
        prefs = self._preferences()
        windows = prefs.windows
        if windows and not any(w.contains(minute_of_day(now)) for w in windows):
            return f"outside its hours ({prefs.hours})"
        if prefs.daily_gpu_hours and self.used_today_s(now) >= prefs.daily_gpu_hours * 3600:
            return f"today's {prefs.daily_gpu_hours:g} h of training are used"
        if prefs.idle_minutes:
            idle = self._idle_s(now)
            if idle is not None and idle < prefs.idle_minutes * 60:
                return f"its user is active (it trains after {prefs.idle_minutes:g} min idle)"
        if self._sensors is not None:
            wanted = wanted_readings(prefs)
            readings = self._sensors(wanted) if wanted else Readings()
            return self.guards.reason(prefs, readings, prefs.gpus)
        return ""

    def used_today_s(self, now: float | None = None) -> float:
        return self._days.used_s(local_day(self._clock() if now is None else now))


async def keep_checking(
    availability: Availability,
    training_share: Callable[[], float],
    on_change: Callable[[str], None],
) -> None:
    """Tick every `TICK_S`; `on_change(reason)` when the node pauses or may train again."""
    while True:
        if availability.tick(training_share()):
            on_change(availability.reason)
        await trio.sleep(TICK_S)
