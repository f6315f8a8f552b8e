"""What this node has seen of each peer's results: adaptive checking, as BOINC does it.

Per peer, in node.db: its run of consecutive results that passed their checks, a
recent average of the credit it earned here (RAC: exponentially decaying, half-life
one week), how often it was caught, and until when it is excluded.

- A peer on probation (fewer than `PROBATION_UNITS` valid results in a row, counting
  only results some segment of which was replayed) has every result checked at the
  job's whole spot-check budget; after that, the budget shrinks as 1/streak (BOINC's
  adaptive replication), never below one segment.
- A caught peer loses its streak and its RAC, and gets no work from this node for
  `EXCLUDE_S`; the scheduler prefers trusted peers over ones on probation.
- Evidence gossiped by another owner (`protocol.evidence`) can only be checked for its
  signatures here, not replayed (the data is that owner's), and an owner may lie: it
  puts the peer back on probation, nothing more.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import sqlite_utils

PROBATION_UNITS = 10
EXCLUDE_S = 24 * 3600.0
RAC_HALF_LIFE_S = 7 * 24 * 3600.0


@dataclass
class PeerRecord:
    peer: str
    streak: int = 0  # valid results in a row (checked ones)
    valid: int = 0
    invalid: int = 0
    rac: float = 0.0  # TFLOP, decayed to `rac_at`
    rac_at: float = 0.0
    excluded_until: float = 0.0
    reports: int = 0  # evidence against it gossiped by other owners
    last_reason: str = ""

    @property
    def trusted(self) -> bool:
        return self.streak >= PROBATION_UNITS

    def to_json(self, now: float) -> dict:
        return {**asdict(self), "rac": decayed(self.rac, self.rac_at, now), "trusted": self.trusted}


def decayed(value: float, at: float, now: float) -> float:
    return value * math.exp(-math.log(2) * max(0.0, now - at) / RAC_HALF_LIFE_S)


def segments_to_check(full: int, streak: int) -> int:
    """How many of `full` segments (the job's whole budget) a result of a peer with
    `streak` valid results in a row gets checked."""
    if full <= 0:
        return 0
    if streak < PROBATION_UNITS:
        return full
    return max(1, math.ceil(full * PROBATION_UNITS / streak))


class Reputation:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        columns = {
            "peer": str,
            "streak": int,
            "valid": int,
            "invalid": int,
            "rac": float,
            "rac_at": float,
            "excluded_until": float,
            "reports": int,
            "last_reason": str,
        }
        db["reputation"].create(columns, pk="peer", if_not_exists=True)

    def get(self, peer: str) -> PeerRecord:
        try:
            return PeerRecord(**self._db["reputation"].get(peer))
        except sqlite_utils.db.NotFoundError:
            return PeerRecord(peer)

    def _put(self, record: PeerRecord) -> None:
        self._db["reputation"].upsert(asdict(record), pk="peer")

    def checks_for(self, peer: str, full: int) -> int:
        return segments_to_check(full, self.get(peer).streak)

    def valid(
        self, peer: str, credit: float, now: float | None = None, checked: bool = True
    ) -> PeerRecord:
        """A result accepted; it lengthens the streak only when some of it was
        replayed (a share none of whose segments was drawn proves nothing)."""
        now = time.time() if now is None else now
        record = self.get(peer)
        record.streak += checked
        record.valid += 1
        record.rac = decayed(record.rac, record.rac_at, now) + credit
        record.rac_at = now
        self._put(record)
        return record

    def caught(self, peer: str, reason: str, now: float | None = None) -> PeerRecord:
        now = time.time() if now is None else now
        record = self.get(peer)
        record.streak = 0
        record.invalid += 1
        record.rac, record.rac_at = 0.0, now
        record.excluded_until = now + EXCLUDE_S
        record.last_reason = reason[:500]
        self._put(record)
        return record

    def reported(self, peer: str, reason: str) -> PeerRecord:
        record = self.get(peer)
        record.streak = 0
        record.reports += 1
        record.last_reason = f"reported: {reason}"[:500]
        self._put(record)
        return record

    def excluded(self, now: float | None = None) -> set[str]:
        now = time.time() if now is None else now
        rows = self._db.execute(
            "SELECT peer FROM reputation WHERE excluded_until > ?", [now]
        ).fetchall()
        return {row[0] for row in rows}

    def trusted(self) -> set[str]:
        rows = self._db.execute(
            "SELECT peer FROM reputation WHERE streak >= ?", [PROBATION_UNITS]
        ).fetchall()
        return {row[0] for row in rows}

    def all(self, now: float | None = None) -> list[dict]:
        now = time.time() if now is None else now
        rows = self._db["reputation"].rows_where(order_by="peer")
        return [PeerRecord(**row).to_json(now) for row in rows]
