"""`AuditLog`: the co-signed receipts this node has seen on gossip, from anyone.

Its own file, `audit.db`, next to `ledger.db`, and not a table inside it:

- the chain file stays exactly the node's own record, so copying, backing up or
  verifying `ledger.db` never involves other peers' data;
- gossip is untrusted and can be busy; its writes take `audit.db`'s lock, never the
  ledger's, so a flood of receipts cannot stall the node's own appends;
- the audit table is a cache of what others published: it can be deleted and rebuilt
  from gossip, or capped (`max_receipts`), without touching the chain.

A receipt is kept only if both signatures verify (`protocol.receipts.open_cosigned`).
A unit is named by (owner, job, unit). Two receipts for one unit *agree* when they
name the same worker, weights and credit (a re-issued receipt differs only in its
timestamp or metrics); one that agrees with a receipt already kept is a duplicate and
is not stored again. One that disagrees with every receipt kept for its unit is a
conflict: it is stored, and every receipt of that unit is flagged. Flagged receipts
count towards `conflicts` and not towards anyone's earned or spent credit: the owner
signed both, and there is no telling which one is true.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Literal

from ledger.db import connect, immediate, snapshot
from ledger.errors import AuditFull, InvalidArgument, InvalidReceipt
from protocol import ProtocolError
from protocol.receipts import VerifiedReceipt, credit_matches, open_cosigned

AUDIT_DB = "audit.db"
#: about 1 KB a receipt: a million is ~1 GB of disk, far more than a small network makes
DEFAULT_MAX_RECEIPTS = 1_000_000
#: one peer (as owner, or as worker) may hold at most this share of the table, so a
#: single identity flooding receipts between its own puppets cannot fill it alone
MAX_SHARE_PER_PEER = 0.01
MIN_PER_PEER = 1000
MAX_CONFLICTS_PAGE = 1000

AddResult = Literal["added", "duplicate", "conflict"]

_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS receipts_unit ON receipts (owner, job_id, unit_id)",
    "CREATE INDEX IF NOT EXISTS receipts_worker ON receipts (worker)",
    "CREATE INDEX IF NOT EXISTS receipts_conflict ON receipts (conflict)",
    "CREATE VIEW IF NOT EXISTS conflicts AS SELECT owner, job_id, unit_id, worker, credit, "
    "weights_sha256, digest, seen_at FROM receipts WHERE conflict = 1",
)


class AuditLog:
    """Receipts seen on gossip, checked, deduplicated, with conflicts flagged."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, max_receipts: int, max_per_peer: int
    ) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._max = max_receipts
        self._per_peer = max_per_peer
        self.path = path

    @classmethod
    def open(
        cls,
        data_dir: Path,
        *,
        max_receipts: int = DEFAULT_MAX_RECEIPTS,
        max_per_peer: int | None = None,
    ) -> AuditLog:
        """Open or create `audit.db` in `data_dir`."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / AUDIT_DB
        db = connect(path)
        with immediate(db.conn):
            db.create_table(
                "receipts",
                {
                    "id": int,
                    "digest": bytes,  # sha256 of the co-signed receipt bytes
                    "owner": str,
                    "worker": str,
                    "job_id": str,
                    "unit_id": str,
                    "credit": float,
                    "weights_sha256": str,
                    "payload": bytes,  # the co-signed receipt as received
                    "seen_at": float,
                    "conflict": int,
                },
                pk="id",
                not_null={"digest", "owner", "worker", "job_id", "unit_id", "credit", "payload"},
                if_not_exists=True,
            )
            db.conn.execute(
                "CREATE UNIQUE INDEX IF NOT EXISTS receipts_digest ON receipts (digest)"
            )
            for statement in _SCHEMA:
                db.conn.execute(statement)
        per_peer = max_per_peer or max(MIN_PER_PEER, int(max_receipts * MAX_SHARE_PER_PEER))
        return cls(db.conn, path, max_receipts, per_peer)

    def add(self, cosigned: bytes) -> AddResult:
        """Check and keep a co-signed receipt: "added", "duplicate" (this receipt, or
        one that agrees with it, is already kept) or "conflict" (it disagrees with a
        receipt kept for the same unit; both are kept and flagged).

        Raises `InvalidReceipt` (malformed, or a signature does not verify) or
        `AuditFull`; then nothing is stored."""
        try:
            verified = open_cosigned(cosigned)
        except ProtocolError as exc:
            raise InvalidReceipt(f"co-signed receipt refused: {exc}", exc.reason) from exc
        digest = hashlib.sha256(verified.raw).digest()
        unit = (verified.owner, verified.job_id, verified.unit_id)
        with self._lock, immediate(self._conn) as conn:
            if conn.execute("SELECT 1 FROM receipts WHERE digest = ?", (digest,)).fetchone():
                return "duplicate"
            kept = conn.execute(
                "SELECT worker, credit, weights_sha256 FROM receipts "
                "WHERE owner = ? AND job_id = ? AND unit_id = ?",
                unit,
            ).fetchall()
            if any(_agrees(verified, *row) for row in kept):
                return "duplicate"
            # rows are never deleted, so the largest id is the count (and O(log n) to read)
            kept_total = conn.execute("SELECT COALESCE(MAX(id), 0) FROM receipts").fetchone()[0]
            if kept_total >= self._max:
                raise AuditFull(
                    f"{self.path} holds {self._max} receipts, its limit; the receipt was not "
                    "kept (raise max_receipts, or delete audit.db to start it afresh)"
                )
            quota = self._per_peer
            for column, peer in (("owner", verified.owner), ("worker", verified.worker)):
                held = conn.execute(
                    f"SELECT COUNT(*) FROM (SELECT 1 FROM receipts WHERE {column} = ? LIMIT ?)",
                    (peer, quota),
                ).fetchone()[0]
                if held >= quota:
                    raise AuditFull(
                        f"{peer} already has {quota} receipts here as {column}, its quota; "
                        "the receipt was not kept"
                    )
            conflict = 1 if kept else 0
            conn.execute(
                "INSERT INTO receipts (digest, owner, worker, job_id, unit_id, credit, "
                "weights_sha256, payload, seen_at, conflict) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    digest,
                    verified.owner,
                    verified.worker,
                    verified.job_id,
                    verified.unit_id,
                    verified.credit,
                    verified.receipt.weights_sha256,
                    verified.raw,
                    time.time(),
                    conflict,
                ),
            )
            if conflict:
                conn.execute(
                    "UPDATE receipts SET conflict = 1 WHERE owner = ? AND job_id = ? "
                    "AND unit_id = ?",
                    unit,
                )
                return "conflict"
            return "added"

    def network_credit(self) -> dict[str, dict[str, Any]]:
        """Per peer id: `earned` (TFLOP, as worker) and `spent` (as owner) over the
        receipts not in conflict, `receipts` (those receipts naming the peer), `units`
        (of them, those it trained), and `conflicts` (units in conflict that name it)."""
        out: dict[str, dict[str, Any]] = {}

        def peer(peer_id: str) -> dict[str, Any]:
            return out.setdefault(
                peer_id, {"earned": 0.0, "spent": 0.0, "receipts": 0, "units": 0, "conflicts": 0}
            )

        with self._lock, snapshot(self._conn) as conn:
            for role, total in (("worker", "earned"), ("owner", "spent")):
                rows = conn.execute(
                    f"SELECT {role}, TOTAL(credit), COUNT(*) FROM receipts "
                    f"WHERE conflict = 0 GROUP BY {role}"
                )
                for peer_id, credit, count in rows:
                    peer(peer_id)[total] = credit
                    peer(peer_id)["receipts"] += count
                    if role == "worker":
                        peer(peer_id)["units"] = count
            rows = conn.execute(
                "SELECT peer, COUNT(*) FROM (SELECT DISTINCT owner AS peer, job_id, unit_id "
                "FROM receipts WHERE conflict = 1 UNION SELECT DISTINCT worker, job_id, unit_id "
                "FROM receipts WHERE conflict = 1) GROUP BY peer"
            )
            for peer_id, count in rows:
                peer(peer_id)["conflicts"] = count
        return out

    def recent_credit(self, now: float, half_life_s: float) -> dict[str, float]:
        """Per worker: BOINC's recent average credit over the receipts not in conflict,
        each receipt's credit halved for every `half_life_s` since it was seen (summed
        by the hour, so a full table is a few thousand rows, not a million)."""
        with self._lock, snapshot(self._conn) as conn:
            rows = conn.execute(
                "SELECT worker, CAST(COALESCE(seen_at, 0) / 3600 AS INTEGER), TOTAL(credit) "
                "FROM receipts WHERE conflict = 0 GROUP BY 1, 2"
            ).fetchall()
        out: dict[str, float] = {}
        for worker, hour, credit in rows:
            age = max(0.0, now - (hour * 3600 + 1800))
            out[worker] = out.get(worker, 0.0) + credit * 0.5 ** (age / half_life_s)
        return out

    def conflicts(self, limit: int = 100) -> list[dict[str, Any]]:
        """Units with disagreeing receipts (at most `limit`, 1..1000), oldest first:
        owner, job_id, unit_id and every receipt kept for the unit."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgument(f"limit must be an integer 1..{MAX_CONFLICTS_PAGE}")
        units: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        with self._lock, snapshot(self._conn) as conn:
            keys = conn.execute(
                "SELECT owner, job_id, unit_id FROM receipts WHERE conflict = 1 "
                "GROUP BY owner, job_id, unit_id ORDER BY MIN(id) LIMIT ?",
                (limit,),
            ).fetchall()
            for key in keys:
                units[key] = [
                    {
                        "worker": worker,
                        "credit": credit,
                        "weights_sha256": weights,
                        "digest": digest.hex(),
                        "seen_at": seen_at,
                    }
                    for worker, credit, weights, digest, seen_at in conn.execute(
                        "SELECT worker, credit, weights_sha256, digest, seen_at FROM conflicts "
                        "WHERE owner = ? AND job_id = ? AND unit_id = ? ORDER BY seen_at",
                        key,
                    )
                ]
        return [
            {"owner": owner, "job_id": job_id, "unit_id": unit_id, "receipts": receipts}
            for (owner, job_id, unit_id), receipts in units.items()
        ]

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM receipts").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _agrees(receipt: VerifiedReceipt, worker: str, credit: float, weights_sha256: str) -> bool:
    return (
        receipt.worker == worker
        and receipt.receipt.weights_sha256 == weights_sha256
        and credit_matches(receipt.credit, credit)
    )
