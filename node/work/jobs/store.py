"""Jobs, their units and receipts in `node.db`: the owner's durable record of work.

A job is what a user submitted; a unit is one piece of it given to one worker (the
attempt of a single job; later a round's share, a trial, a replica). A job may have
many live units at once.

Every change of a job or unit is one SQLite transaction that re-reads the row and
checks the state it starts from (compare-and-set): a caller says which states it
expects, and gets None when the row has moved on (a cancel that won a race against an
offer, a second result for a unit already being verified). No row is ever rewritten
from an in-memory copy, so two coroutines that interleave cannot undo each other.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlite_utils

from node.work.jobs.states import (  # the tables of allowed changes
    HELD_UNIT_STATES,
    check_job,
    check_unit,
)

if TYPE_CHECKING:
    from training.data.info import DataFiles

log = logging.getLogger(__name__)

_JSON_FIELDS = ("spec", "summary", "progress", "metrics", "data_blobs", "timeline", "excluded")
TIMELINE_MAX = 200  # a job's timeline keeps its newest entries


def new_id() -> str:
    """A fresh job or unit id in the one format ids have on the wire (16 hex)."""
    return secrets.token_hex(8)


def sharded(spec: dict[str, Any]) -> bool:
    """Whether a plain spec's data is `data.shards`."""
    return bool(spec.get("data", {}).get("shards"))


def data_shas(spec: dict[str, Any]) -> list[str]:
    """The blobs of a plain spec's data: its source's, or every shard's in order."""
    data = spec.get("data", {})
    named = data.get("shards") or [data.get("source", "")]
    return [s.removeprefix("blob:") for s in named if s.startswith("blob:")]


@dataclass
class Job:
    id: str
    name: str
    spec: dict[str, Any]  # plain spec, data source rewritten to blob:<sha256>
    placement: str
    summary: dict[str, Any]
    data_blobs: list[str]
    state: str = "queued"
    worker: str = ""  # the worker of the newest unit
    unit_id: str = ""  # the newest unit
    progress: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    # "local" (trained here), "claimed" (a remote worker's word, not verified yet),
    # "verified" (checked by replay or replica)
    metrics_status: str = ""
    reason: str = ""
    weights_sha256: str = ""
    attempts: int = 0
    excluded: list[str] = field(default_factory=list)  # peers that declined or vanished
    timeline: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def data_shas(self) -> list[str]:
        """The blobs of the job's data (its other blobs: a program's, an init's)."""
        return data_shas(self.spec)

    def data_files(self, path: Callable[[str], Path]) -> DataFiles:
        """The job's data as this node's files (`path`: a blob's file): every shard of
        a sharded set, else its one file, or None for a built-in set."""
        shas = self.data_shas
        if sharded(self.spec):
            return tuple(path(sha) for sha in shas)
        return path(shas[0]) if shas else None

    @property
    def mode(self) -> str:
        """The mode the spec names (`single` when it names none)."""
        return str(self.spec.get("mode", "single"))

    @property
    def max_hours(self) -> float:
        return float(self.spec.get("requirements", {}).get("max_hours", 1.0))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["mode"] = self.mode
        return out


@dataclass
class Unit:
    unit_id: str
    job_id: str
    worker: str
    state: str
    lease_expires: float
    started_at: float
    ended_at: float = 0.0
    reason: str = ""
    deadline: float = 0.0  # no heartbeat holds the unit past this (the job's max_hours)
    round: int = -1  # an elastic job's unit: its round and data slot (else -1)
    slot: int = -1
    output_sha256: str = ""  # what the accepted result returned (an elastic unit's delta)
    output_bytes: int = 0
    trial: int = -1  # a sweep job's unit: the number of the trial it trains (else -1)
    # a unit that goes on from a lost one's checkpoint: that state, and its step
    resume_sha256: str = ""
    resume_step: int = 0
    # an elastic share that starts eagerly: its slot's delta of the round before
    start_delta: str = ""
    # ... and the round's weights it was told to take on its way (its delta's base)
    taken: str = ""


_JOB_COLUMNS = {f.name for f in fields(Job)}
_UNIT_COLUMNS = {f.name for f in fields(Unit)}


class JobStore:
    def __init__(
        self, db: sqlite_utils.Database, on_change: Callable[[Job], None] | None = None
    ) -> None:
        self._db = db
        self._on_change = on_change  # told of every created or updated job (the event feed)
        types = {"attempts": int, "created_at": float, "updated_at": float}
        db["jobs"].create(
            {name: types.get(name, str) for name in _JOB_COLUMNS if name != "id"} | {"id": str},
            pk="id",
            if_not_exists=True,
        )
        kinds = {"str": str, "float": float, "int": int}  # Unit's annotations, as text
        db["units"].create(
            {f.name: kinds[f.type] for f in fields(Unit)}, pk="unit_id", if_not_exists=True
        )
        # node.db files written before these columns existed
        if "metrics_status" not in db["jobs"].columns_dict:
            db["jobs"].add_column("metrics_status", str, not_null_default="")
        for column, kind, default in (
            ("deadline", float, 0.0),
            ("round", int, -1),
            ("slot", int, -1),
            ("output_sha256", str, ""),
            ("output_bytes", int, 0),
            ("trial", int, -1),
            ("resume_sha256", str, ""),
            ("resume_step", int, 0),
            ("start_delta", str, ""),
            ("taken", str, ""),
        ):
            if column not in db["units"].columns_dict:
                db["units"].add_column(column, kind, not_null_default=default)
        db["units"].create_index(["job_id"], if_not_exists=True)
        db["units"].create_index(["state"], if_not_exists=True)
        db["receipts"].create(
            {
                "unit_id": str,
                "job_id": str,
                "role": str,
                "owner": str,
                "worker": str,
                "cosigned": bytes,  # the receipt, half- or co-signed (protocol.receipts)
                "issued_at": float,
            },
            pk="unit_id",
            if_not_exists=True,
        )
        if "envelope" in db["receipts"].columns_dict:  # its name in older node.db files
            db.execute("ALTER TABLE receipts RENAME COLUMN envelope TO cosigned")

    # -- jobs ------------------------------------------------------------------------

    def create(
        self,
        name: str,
        spec: dict[str, Any],
        placement: str,
        summary: dict[str, Any],
        data_blobs: list[str],
    ) -> Job:
        now = time.time()
        job = Job(
            id=new_id(),
            name=name,
            spec=spec,
            placement=placement,
            summary=summary,
            data_blobs=data_blobs,
            created_at=now,
            updated_at=now,
            timeline=[{"t": now, "state": "queued", "note": "submitted"}],
        )
        self._db["jobs"].insert(_encode(asdict(job)))
        self._changed(job)
        return job

    def get(self, job_id: str) -> Job | None:
        rows = list(self._db["jobs"].rows_where("id = ?", [job_id], limit=1))
        return Job(**_decode(rows[0])) if rows else None

    def list(self, limit: int = 100) -> list[Job]:
        rows = self._db["jobs"].rows_where(order_by="created_at desc", limit=limit)
        return [Job(**_decode(r)) for r in rows]

    def in_state(self, *states: str) -> list[Job]:
        marks = ", ".join("?" for _ in states)
        rows = self._db["jobs"].rows_where(
            f"state in ({marks})", list(states), order_by="created_at"
        )
        return [Job(**_decode(r)) for r in rows]

    def transition(
        self, job_id: str, from_states: Iterable[str], note: str = "", **changes: Any
    ) -> Job | None:
        """Set the state `changes` names (and its other fields) if the job is in one of
        `from_states`, else None. `IllegalTransition` if a named start may not change to
        it (`JOB_TRANSITIONS`); a write of no state is `note`, `set_progress` or `amend`."""
        if "state" not in changes:
            raise ValueError("transition() changes the state: use note, set_progress or amend")
        check_job(tuple(from_states), changes["state"])
        return self._write(job_id, tuple(from_states), note, changes)

    def amend(
        self, job_id: str, from_states: Iterable[str], note: str = "", **fields: Any
    ) -> Job | None:
        """Write `fields` (never the state: that is `transition`) if the job is in one of
        `from_states`, with a timeline entry when `note` is given; None if it is not."""
        if "state" in fields:
            raise ValueError("amend() never changes the state: use transition")
        return self._write(job_id, tuple(from_states), note, fields)

    def note(self, job_id: str, text: str, from_states: Iterable[str] = ("running",)) -> Job | None:
        """Add `text` to the job's timeline if it is in one of `from_states` (by default
        running: what happens during its run); None if it is in none."""
        return self.amend(job_id, from_states, text)

    def set_progress(self, job_id: str, progress: dict[str, Any], note: str = "") -> Job | None:
        """Replace a running job's progress (with a timeline `note` in the same write);
        None when it is not running: a late heartbeat never writes over a final job."""
        return self.amend(job_id, ("running",), note, progress=progress)

    def _write(
        self, job_id: str, allowed: tuple[str, ...], note: str, changes: dict[str, Any]
    ) -> Job | None:
        """One transaction: the row is re-read, checked and only the named columns are
        written; the timeline gets an entry when the state changes or `note` is given."""
        unknown = set(changes) - _JOB_COLUMNS
        if unknown:
            raise ValueError(f"unknown job fields: {sorted(unknown)}")
        with self._tx():
            job = self.get(job_id)
            if job is None or job.state not in allowed:
                return None
            old_state = job.state
            for key, value in changes.items():
                setattr(job, key, value)
            job.updated_at = time.time()
            written = {**changes, "updated_at": job.updated_at}
            if job.state != old_state or note:
                job.timeline.append({"t": job.updated_at, "state": job.state, "note": note})
                job.timeline = job.timeline[-TIMELINE_MAX:]
                written["timeline"] = job.timeline
            cols = ", ".join(f"{k} = ?" for k in written)
            cursor = self._db.execute(
                f"UPDATE jobs SET {cols} WHERE id = ? AND state = ?",
                [*_encode(written).values(), job_id, old_state],
            )
            if cursor.rowcount != 1:  # unreachable inside the transaction; cheap to check
                return None
        self._changed(job)
        return job

    def update(self, job: Job, note: str = "", **changes: Any) -> Job:
        """Compare-and-set from the state `job` was read in (see `transition`); raises
        `StaleJob` when the job has moved on since."""
        write = self.transition if "state" in changes else self.amend
        updated = write(job.id, (job.state,), note, **changes)
        if updated is None:
            raise StaleJob(f"job {job.id} changed state since it was read")
        return updated

    @property
    def db(self) -> sqlite_utils.Database:
        """node.db, for the stores that keep their own tables in it (rounds)."""
        return self._db

    def _changed(self, job: Job) -> None:
        if self._on_change is not None:
            try:
                self._on_change(job)
            except Exception:  # a listener never breaks the job's bookkeeping
                log.exception("job %s: change listener failed", job.id)

    def _tx(self) -> sqlite3.Connection:
        return self._db.conn  # `with conn:` commits, or rolls back on an exception

    # -- units -----------------------------------------------------------------------

    def add_unit(
        self,
        job_id: str,
        worker: str,
        lease_s: float,
        deadline: float = 0.0,
        unit_id: str = "",
        round_: int = -1,
        slot: int = -1,
        trial: int = -1,
        resume: tuple[str, int] = ("", 0),
        start_delta: str = "",
    ) -> Unit:
        now = time.time()
        unit = Unit(
            unit_id or new_id(),
            job_id,
            worker,
            "offered",
            now + lease_s,
            now,
            deadline=deadline or now + lease_s,
            round=round_,
            slot=slot,
            trial=trial,
            resume_sha256=resume[0],
            resume_step=resume[1],
            start_delta=start_delta,
        )
        with self._tx():
            self._db["units"].insert(asdict(unit))
        return unit

    def unit(self, unit_id: str) -> Unit | None:
        try:
            return Unit(**self._db["units"].get(unit_id))
        except sqlite_utils.db.NotFoundError:
            return None

    def units_in_state(self, *states: str) -> list[Unit]:
        marks = ", ".join("?" for _ in states)
        return [
            Unit(**r) for r in self._db["units"].rows_where(f"state in ({marks})", list(states))
        ]

    def units_of(self, job_id: str, *states: str) -> list[Unit]:
        where, args = "job_id = ?", [job_id]
        if states:
            where += f" AND state in ({', '.join('?' for _ in states)})"
            args += list(states)
        return [Unit(**r) for r in self._db["units"].rows_where(where, args, order_by="started_at")]

    def workers_done(self, job_id: str, but: str = "") -> set[str]:
        """Peers that let go of a unit of `job_id` and hold none of it now (but unit
        `but`; `HELD_UNIT_STATES`)."""
        marks = ", ".join("?" for _ in HELD_UNIT_STATES)
        cursor = self._db.execute(
            f"SELECT worker FROM units WHERE job_id = ? GROUP BY worker HAVING "
            f"SUM(state NOT IN ({marks})) > 0 AND SUM(state IN ({marks}) AND unit_id != ?) = 0",
            [job_id, *HELD_UNIT_STATES, *HELD_UNIT_STATES, but],
        )
        return {row[0] for row in cursor.fetchall()}

    def unit_transition(
        self, unit_id: str, from_states: Iterable[str], **changes: Any
    ) -> Unit | None:
        """Compare-and-set on a unit: set the state `changes` names (and its other
        fields) only if it is in `from_states`, else None; checked as `transition` is."""
        unknown = set(changes) - _UNIT_COLUMNS
        if unknown or "state" not in changes:
            raise ValueError(f"unit_transition() needs state=; unknown: {sorted(unknown)}")
        allowed = tuple(from_states)
        check_unit(allowed, changes["state"])
        marks = ", ".join("?" for _ in allowed)
        cols = ", ".join(f"{k} = ?" for k in changes)
        with self._tx():
            cursor = self._db.execute(
                f"UPDATE units SET {cols} WHERE unit_id = ? AND state in ({marks})",
                [*changes.values(), unit_id, *allowed],
            )
            if cursor.rowcount != 1:
                return None
        return self.unit(unit_id)

    def unit_output(self, unit_id: str, sha256: str, size: int) -> bool:
        """A unit's result, fetched and checked in form while its spot check goes on:
        its output recorded, its state left `verifying`. False when it moved on."""
        with self._tx():
            cursor = self._db.execute(
                "UPDATE units SET output_sha256 = ?, output_bytes = ? "
                "WHERE unit_id = ? AND state = 'verifying'",
                [sha256, size, unit_id],
            )
        return cursor.rowcount == 1

    def unit_taken(self, unit_id: str, sha256: str) -> str:
        """The round's weights a share takes on its way: `sha256`, unless it was told
        others before (an answer once given stays); returns those it takes."""
        with self._tx():
            self._db.execute(
                "UPDATE units SET taken = ? WHERE unit_id = ? AND taken = ''", [sha256, unit_id]
            )
        unit = self.unit(unit_id)
        return unit.taken if unit is not None else sha256

    def renew_lease(self, unit_id: str, until: float) -> Unit | None:
        """Extend a live unit's lease to `until`, never past its deadline, and never
        shorten it: a heartbeat that arrives while the unit's result is checked must not
        cut the check's allowance (`RESULT_FETCH_S`) down to one lease."""
        with self._tx():
            cursor = self._db.execute(
                "UPDATE units SET lease_expires = MAX(lease_expires, MIN(?, deadline)) "
                "WHERE unit_id = ? AND state in ('offered', 'running', 'verifying')",
                [until, unit_id],
            )
            if cursor.rowcount != 1:
                return None
        return self.unit(unit_id)

    def forget_unit(self, unit_id: str) -> bool:
        """Remove a unit that never started (its offer was declined for now)."""
        with self._tx():
            cursor = self._db.execute(
                "DELETE FROM units WHERE unit_id = ? AND state = 'offered'", [unit_id]
            )
        return cursor.rowcount == 1

    # -- receipts --------------------------------------------------------------------

    def add_receipt(
        self, unit_id: str, job_id: str, role: str, owner: str, worker: str, cosigned: bytes
    ) -> None:
        with self._tx():
            self._db["receipts"].upsert(
                {
                    "unit_id": unit_id,
                    "job_id": job_id,
                    "role": role,
                    "owner": owner,
                    "worker": worker,
                    "cosigned": cosigned,
                    "issued_at": time.time(),
                },
                pk="unit_id",
            )

    def receipt(self, unit_id: str) -> bytes | None:
        try:
            return self._db["receipts"].get(unit_id)["cosigned"]
        except sqlite_utils.db.NotFoundError:
            return None


class StaleJob(Exception):
    """A job changed state between reading it and changing it."""


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON_FIELDS else v for k, v in row.items()}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSON_FIELDS else v for k, v in row.items()}
