"""Where a lost unit goes on from: the latest state of it the owner holds and trusts.

While a single job's unit trains, the owner fetches one of its states at least every
`trust.resume_minutes` (the states fetched for spot checks count: `commitments.py`
asks for the newest when none came for that long). Such a state becomes the job's
**resume point** once every segment drawn before it has been replayed and agreed:
a worker that skipped steps before it would be caught with the chance any result
has, no less. When the unit is lost (its worker vanished, handed it back, ran out of
its lease), the job's next unit is offered with that state (`WorkPackage.resume`,
`Unit.resume_step`) and trains only the steps after it; its chain of checkpoints
starts there, and its credit is its share of the steps (`partial_credit`). A unit
whose check fails leaves no point: the next one starts over.

Plain functions over node.db's `resume_points` table, one row per job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import sqlite_utils

TABLE = "resume_points"


@dataclass(frozen=True)
class ResumePoint:
    job_id: str
    unit_id: str  # the unit that made the state
    sha256: str
    step: int


def _table(db: sqlite_utils.Database) -> sqlite_utils.db.Table:
    table = db[TABLE]
    if not table.exists():
        table.create({"job_id": str, "unit_id": str, "sha256": str, "step": int}, pk="job_id")
    return table  # type: ignore[return-value]


def resume_point(db: sqlite_utils.Database, job_id: str) -> ResumePoint | None:
    rows = list(_table(db).rows_where("job_id = ?", [job_id], limit=1))
    return ResumePoint(**rows[0]) if rows else None


def save_point(db: sqlite_utils.Database, point: ResumePoint) -> None:
    _table(db).upsert(asdict(point), pk="job_id")


def clear_point(db: sqlite_utils.Database, job_id: str) -> ResumePoint | None:
    """Forget the job's point; the one it had, if any (its state may go)."""
    point = resume_point(db, job_id)
    if point is not None:
        _table(db).delete(job_id)
    return point


def due(last_fetch_at: float, minutes: float, now: float) -> bool:
    """Whether a state should be fetched for resumption now."""
    return minutes > 0 and now - last_fetch_at >= minutes * 60


def latest_trusted(
    fetched: Iterable[int], chosen: Iterable[int], agreed: Mapping[int, bool]
) -> int | None:
    """The latest fetched state (not the first: a unit that starts over loses
    nothing) such that every chosen segment before it was replayed and agreed."""
    drawn = sorted(chosen)
    for index in sorted(fetched, reverse=True):
        if index >= 1 and all(agreed.get(j, False) for j in drawn if j < index):
            return index
    return None
