"""An elastic job's rounds in node.db: where each started, who contributed, what it cost.

One row per (job, round). A round is `open` while its units train and `closed` once
its outer step is applied; closing is a compare-and-set from `open`, so a round is
applied at most once, even across an owner restart (which resumes from the last
closed round's weights: the next round's `weights_sha256`). Weights and the outer
momentum live in the blob store; the rows hold their hashes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import sqlite_utils


@dataclass
class Round:
    job_id: str
    round: int
    state: str  # open | closed
    weights_sha256: str  # the global weights this round starts from
    momentum_sha256: str  # the outer momentum it starts from ("" before the first step)
    opened_at: float
    deadline: float  # closes here with >= min_workers deltas (extended when fewer)
    closed_at: float = 0.0
    next_weights_sha256: str = ""  # after this round's outer step (set when closed)
    next_momentum_sha256: str = ""
    next_update_sha256: str = ""  # the quantized change to the next weights ("": none)
    workers: list[str] = field(default_factory=list)  # peers whose deltas were applied
    dropped: list[str] = field(default_factory=list)  # peers that left or were late
    joined: list[str] = field(default_factory=list)  # new since the round before
    left: list[str] = field(default_factory=list)  # in the round before, not in this one
    val_loss: float | None = None  # of the weights after this round's outer step
    metrics: dict[str, float] = field(default_factory=dict)
    evaluated_at: float = 0.0  # when those figures came (off the rounds' path)
    bytes_in: int = 0  # delta bytes received and applied
    bytes_out: int = 0  # global weights and updates the round's workers fetched
    full_bytes: int = 0  # what the same deltas would take as float32 weights
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_JSON = {"workers", "dropped", "joined", "left", "metrics", "notes"}
_COLUMNS = {f.name for f in fields(Round)}


class RoundStore:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        db["rounds"].create(
            {
                "job_id": str,
                "round": int,
                "state": str,
                "weights_sha256": str,
                "momentum_sha256": str,
                "opened_at": float,
                "deadline": float,
                "closed_at": float,
                "next_weights_sha256": str,
                "next_momentum_sha256": str,
                "next_update_sha256": str,
                "workers": str,
                "dropped": str,
                "joined": str,
                "left": str,
                "val_loss": float,
                "metrics": str,
                "evaluated_at": float,
                "bytes_in": int,
                "bytes_out": int,
                "full_bytes": int,
                "seconds": float,
                "notes": str,
            },
            pk=("job_id", "round"),
            if_not_exists=True,
        )
        added = ("next_update_sha256", str, ""), ("bytes_out", int, 0), ("evaluated_at", float, 0)
        for column, kind, default in added:
            if column not in db["rounds"].columns_dict:  # node.db from before
                db["rounds"].add_column(column, kind, not_null_default=default)

    def open(
        self, job_id: str, round_: int, weights: str, momentum: str, deadline: float
    ) -> Round | None:
        """Open round `round_`; None when it exists already (opened by a racing call)."""
        row = Round(job_id, round_, "open", weights, momentum, time.time(), deadline)
        with self._db.conn:
            if self.get(job_id, round_) is not None:
                return None
            self._db["rounds"].insert(_encode(asdict(row)))
        return row

    def get(self, job_id: str, round_: int) -> Round | None:
        rows = list(
            self._db["rounds"].rows_where("job_id = ? AND round = ?", [job_id, round_], limit=1)
        )
        return Round(**_decode(rows[0])) if rows else None

    def share_weights(self, job_id: str, round_: int, start_delta: str) -> str:
        """The global weights a share of `round_` starts from: the round's, or for an
        eager start (`start_delta`) the round before's; "" when not known here."""
        row = self.get(job_id, round_ - 1 if start_delta else round_)
        return row.weights_sha256 if row is not None else ""

    def delta_base(self, job_id: str, round_: int, start_delta: str, taken: str) -> str:
        """The global weights a share's delta is taken from: those it started from,
        or those it was told to take on its way (`taken`); "" when not known here."""
        return taken or self.share_weights(job_id, round_, start_delta)

    def of_job(self, job_id: str) -> list[Round]:
        rows = self._db["rounds"].rows_where("job_id = ?", [job_id], order_by="round")
        return [Round(**_decode(r)) for r in rows]

    def latest(self, job_id: str) -> Round | None:
        rows = list(
            self._db["rounds"].rows_where("job_id = ?", [job_id], order_by="round desc", limit=1)
        )
        return Round(**_decode(rows[0])) if rows else None

    def update(self, job_id: str, round_: int, from_state: str, **changes: Any) -> Round | None:
        """Compare-and-set: apply `changes` only while the round is in `from_state`."""
        unknown = set(changes) - _COLUMNS
        if unknown:
            raise ValueError(f"unknown round fields: {sorted(unknown)}")
        encoded = _encode(changes)
        cols = ", ".join(f'"{k}" = ?' for k in encoded)
        with self._db.conn:
            cursor = self._db.execute(
                f'UPDATE rounds SET {cols} WHERE job_id = ? AND "round" = ? AND state = ?',
                [*encoded.values(), job_id, round_, from_state],
            )
            if cursor.rowcount != 1:
                return None
        return self.get(job_id, round_)

    def sent(self, job_id: str, round_: int, size: int) -> None:
        """A worker fetched `size` bytes of the round's global weights (or update)."""
        with self._db.conn:
            self._db.execute(
                'UPDATE rounds SET bytes_out = bytes_out + ? WHERE job_id = ? AND "round" = ?',
                [int(size), job_id, round_],
            )

    def note(self, job_id: str, round_: int, text: str) -> None:
        current = self.get(job_id, round_)
        if current is not None:
            self.update(job_id, round_, current.state, notes=[*current.notes, text][-50:])


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON else v for k, v in row.items()}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSON else v for k, v in row.items()}
