"""A sweep job's trials in node.db: what each tried, where it ran, how it ended.

One row per (job, trial number). The Optuna study (in its own file, `studies/`) is
where the sampler and pruner read the history; these rows are what the node needs
around it: the trial's unit and worker, its spec's cost (for the credit), how often it
was offered, its weights. A trial ends by a compare-and-set from `running`, so it is
told to the study at most once, even across an owner restart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import sqlite_utils

FINAL = ("complete", "pruned", "failed")


@dataclass
class Trial:
    job_id: str
    number: int
    params: dict[str, Any]
    state: str = "running"  # running | complete | pruned | failed
    value: float | None = None  # the sweep's metric, when complete (or the last report)
    worker: str = ""  # the peer training it now, or the last one that did
    unit_id: str = ""
    attempts: int = 0  # its units lost so far (a vanished worker, a refused result)
    steps: int = 0  # steps its result or last report said it trained
    weights_sha256: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)  # its result's, when complete
    training_flops: int = 0  # of its spec: the credit a complete trial earns
    total_steps: int = 0  # of its spec: a pruned trial earns steps / total_steps of it
    reports: list[list[float]] = field(default_factory=list)  # [step, value] sent to the study
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_JSON = {"params", "reports", "metrics"}
_COLUMNS = {f.name for f in fields(Trial)}


class TrialStore:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        db["trials"].create(
            {
                "job_id": str,
                "number": int,
                "params": str,
                "state": str,
                "value": float,
                "worker": str,
                "unit_id": str,
                "attempts": int,
                "steps": int,
                "weights_sha256": str,
                "metrics": str,
                "training_flops": int,
                "total_steps": int,
                "reports": str,
                "reason": str,
            },
            pk=("job_id", "number"),
            if_not_exists=True,
        )

    def add(self, trial: Trial) -> Trial:
        with self._db.conn:
            self._db["trials"].insert(_encode(asdict(trial)), ignore=True)
        return self.get(trial.job_id, trial.number) or trial

    def get(self, job_id: str, number: int) -> Trial | None:
        rows = list(
            self._db["trials"].rows_where("job_id = ? AND number = ?", [job_id, number], limit=1)
        )
        return Trial(**_decode(rows[0])) if rows else None

    def of_job(self, job_id: str, *states: str) -> list[Trial]:
        where, args = "job_id = ?", [job_id]
        if states:
            where += f" AND state IN ({', '.join('?' for _ in states)})"
            args += list(states)
        rows = self._db["trials"].rows_where(where, args, order_by="number")
        return [Trial(**_decode(r)) for r in rows]

    def update(
        self, job_id: str, number: int, from_states: tuple[str, ...], **changes: Any
    ) -> Trial | None:
        """Compare-and-set: apply `changes` only while the trial is in `from_states`."""
        unknown = set(changes) - _COLUMNS
        if unknown:
            raise ValueError(f"unknown trial fields: {sorted(unknown)}")
        encoded = _encode(changes)
        cols = ", ".join(f'"{k}" = ?' for k in encoded)
        marks = ", ".join("?" for _ in from_states)
        with self._db.conn:
            cursor = self._db.execute(
                f"UPDATE trials SET {cols} WHERE job_id = ? AND number = ? AND state IN ({marks})",
                [*encoded.values(), job_id, number, *from_states],
            )
            if cursor.rowcount != 1:
                return None
        return self.get(job_id, number)


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON else v for k, v in row.items()}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSON else v for k, v in row.items()}
