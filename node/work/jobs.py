"""Jobs, their units and receipts in `node.db`: the owner's durable record of work.

A job is what a user submitted; a unit is one attempt to train it on one worker
(a job whose worker vanished gets a new unit elsewhere). State survives restarts,
so an owner restarted mid-job picks its jobs up again.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlite_utils

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "completed", "failed", "cancelled")
FINAL_STATES = ("completed", "failed", "cancelled")
UNIT_STATES = ("offered", "running", "done", "failed", "expired", "cancelled")

_JSON_FIELDS = ("spec", "summary", "progress", "metrics", "data_blobs", "timeline", "excluded")


@dataclass
class Job:
    id: str
    name: str
    spec: dict[str, Any]  # plain spec, data source rewritten to blob:<sha256>
    placement: str
    summary: dict[str, Any]
    data_blobs: list[str]
    state: str = "queued"
    worker: str = ""
    unit_id: str = ""
    progress: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    weights_sha256: str = ""
    attempts: int = 0
    excluded: list[str] = field(default_factory=list)  # peers that declined or vanished
    timeline: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["mode"] = self.spec.get("mode", "single")
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


class JobStore:
    def __init__(
        self, db: sqlite_utils.Database, on_change: Callable[[Job], None] | None = None
    ) -> None:
        self._db = db
        self._on_change = on_change  # told of every created or updated job (the event feed)
        db["jobs"].create(
            {
                "id": str,
                "name": str,
                "spec": str,
                "placement": str,
                "summary": str,
                "data_blobs": str,
                "state": str,
                "worker": str,
                "unit_id": str,
                "progress": str,
                "metrics": str,
                "reason": str,
                "weights_sha256": str,
                "attempts": int,
                "excluded": str,
                "timeline": str,
                "created_at": float,
                "updated_at": float,
            },
            pk="id",
            if_not_exists=True,
        )
        db["units"].create(
            {
                "unit_id": str,
                "job_id": str,
                "worker": str,
                "state": str,
                "lease_expires": float,
                "started_at": float,
                "ended_at": float,
                "reason": str,
            },
            pk="unit_id",
            if_not_exists=True,
        )
        db["receipts"].create(
            {
                "unit_id": str,
                "job_id": str,
                "role": str,
                "owner": str,
                "worker": str,
                "envelope": bytes,
                "issued_at": float,
            },
            pk="unit_id",
            if_not_exists=True,
        )

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
            id=secrets.token_hex(8),
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
        try:
            row = self._db["jobs"].get(job_id)
        except sqlite_utils.db.NotFoundError:
            return None
        return Job(**_decode(row))

    def list(self, limit: int = 100) -> list[Job]:
        rows = self._db["jobs"].rows_where(order_by="created_at desc", limit=limit)
        return [Job(**_decode(r)) for r in rows]

    def in_state(self, *states: str) -> list[Job]:
        marks = ", ".join("?" for _ in states)
        rows = self._db["jobs"].rows_where(
            f"state in ({marks})", list(states), order_by="created_at"
        )
        return [Job(**_decode(r)) for r in rows]

    def update(self, job: Job, note: str = "", **changes: Any) -> Job:
        """Apply `changes`, record a timeline entry when the state changes, persist."""
        old_state = job.state
        for key, value in changes.items():
            setattr(job, key, value)
        job.updated_at = time.time()
        if job.state != old_state or note:
            job.timeline.append({"t": job.updated_at, "state": job.state, "note": note})
        self._db["jobs"].update(job.id, _encode(asdict(job)))
        self._changed(job)
        return job

    def _changed(self, job: Job) -> None:
        if self._on_change is not None:
            try:
                self._on_change(job)
            except Exception:  # a listener never breaks the job's bookkeeping
                log.exception("job %s: change listener failed", job.id)

    # -- units -----------------------------------------------------------------------

    def add_unit(self, job_id: str, worker: str, lease_s: float) -> Unit:
        now = time.time()
        unit = Unit(secrets.token_hex(8), job_id, worker, "offered", now + lease_s, now)
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

    def update_unit(self, unit: Unit, **changes: Any) -> Unit:
        for key, value in changes.items():
            setattr(unit, key, value)
        self._db["units"].update(unit.unit_id, asdict(unit))
        return unit

    # -- receipts --------------------------------------------------------------------

    def add_receipt(
        self, unit_id: str, job_id: str, role: str, owner: str, worker: str, envelope: bytes
    ) -> None:
        self._db["receipts"].upsert(
            {
                "unit_id": unit_id,
                "job_id": job_id,
                "role": role,
                "owner": owner,
                "worker": worker,
                "envelope": envelope,
                "issued_at": time.time(),
            },
            pk="unit_id",
        )

    def receipt(self, unit_id: str) -> bytes | None:
        try:
            return self._db["receipts"].get(unit_id)["envelope"]
        except sqlite_utils.db.NotFoundError:
            return None


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k in _JSON_FIELDS else v for k, v in row.items()}


def _decode(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if k in _JSON_FIELDS else v for k, v in row.items()}
