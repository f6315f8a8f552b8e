"""`Ledger`: this node's append-only, hash-chained record of work done and received.

The file is `ledger.db` in the node's data dir (SQLite, WAL; see the `ledger.db` module
for the durability trade-off). Entry 0 is a genesis signed by the node's key; every later
entry links to the one before by hash (`ledger.entry`). Appends check everything
first (receipt signatures, credit against the job spec, duplicates) and then, inside
one `BEGIN IMMEDIATE` transaction, read the head and insert the new row: a crash at
any instant leaves either the whole entry or none of it. Triggers refuse UPDATE and
DELETE on the table, so an edit has to go around this code, and `verify()` catches it.

Credit is not computed here (the ledger imports only `protocol`): the node computes
the job spec's figure with `training` and passes it as `expected_credit`.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import sqlite_utils
from nacl.signing import SigningKey

from ledger.checks import MAX_REASON_CHARS, EntryProblem, check_entry, failed_signatures
from ledger.db import BUSY_TIMEOUT_MS, connect, immediate, snapshot
from ledger.entry import (
    COLUMNS,
    GENESIS,
    GENESIS_PREV_HASH,
    INVALIDATED,
    REJECTED,
    WORK_DONE,
    WORK_KINDS,
    Entry,
    WorkKind,
)
from ledger.errors import (
    CorruptLedger,
    CreditMismatch,
    DuplicateUnit,
    ForeignLedger,
    InvalidArgument,
    InvalidReceipt,
    NotOurReceipt,
)
from ledger.export import FORMATS, write_entries
from ledger.verify import VerifyReport, verify_rows
from protocol import ProtocolError, encode, peer_id_from_public_key, public_key_from_peer_id
from protocol.receipts import credit_matches, open_cosigned

LEDGER_DB = "ledger.db"
SCHEMA_VERSION = 1
MAX_ENTRIES_PAGE = 1000
MAX_ID_LEN = 128
BUSY_TIMEOUT_S = BUSY_TIMEOUT_MS / 1000

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM entries"
_INSERT = f"INSERT INTO entries ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
# the IN term lets SQLite use the partial index (a bound `kind = ?` alone does not imply
# the index's WHERE, and the lookup would scan the whole table on every append)
_SELECT_UNIT = (
    _SELECT + " WHERE kind IN ('work_done', 'work_received') AND kind = ? AND owner = ? "
    "AND job_id = ? AND unit_id = ?"
)
_SCHEMA = (
    "CREATE UNIQUE INDEX IF NOT EXISTS entries_work_unit ON entries (kind, owner, job_id, "
    "unit_id) WHERE kind IN ('work_done', 'work_received')",
    "CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries "
    "BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END",
    "CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries "
    "BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END",
)


class Ledger:
    """One node's ledger. Thread-safe; use `Ledger.open`, and `close()` when done."""

    def __init__(
        self, db: sqlite_utils.Database, path: Path, signing_key: SigningKey, *, durable: bool
    ) -> None:
        self._db = db
        self._conn = db.conn
        self._key = signing_key
        self._public_key = bytes(signing_key.verify_key)
        self.durable = durable
        self._lock = threading.Lock()
        self.path = path
        self.peer_id = peer_id_from_public_key(self._public_key)

    # -- opening ----------------------------------------------------------------------

    @classmethod
    def open(cls, data_dir: Path, signing_key: SigningKey, *, durable: bool = False) -> Ledger:
        """Open (or create, with a genesis entry signed by `signing_key`) the ledger in
        `data_dir`. Refuses a ledger started by another key (`ForeignLedger`) or one
        without a valid genesis (`CorruptLedger`). `durable=True` fsyncs every append
        (`PRAGMA synchronous=FULL`); see the `ledger.db` module."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LEDGER_DB
        try:
            db = connect(path, durable=durable)
        except sqlite3.DatabaseError as exc:
            raise CorruptLedger(
                f"{path} is not an SQLite database ({exc}); move it away to start a new "
                "ledger, or restore it from a backup"
            ) from exc
        ledger = cls(db, path, signing_key, durable=durable)
        try:
            ledger._init()
        except BaseException:
            db.conn.close()
            raise
        return ledger

    def _init(self) -> None:
        try:
            with immediate(self._conn):
                version = self._conn.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, SCHEMA_VERSION):
                    raise CorruptLedger(
                        f"{self.path} has ledger schema {version}; this meshminer knows "
                        f"{SCHEMA_VERSION} (upgrade meshminer)"
                    )
                self._create_schema()
                genesis = self._conn.execute(_SELECT + " WHERE seq = 0").fetchone()
                if genesis is None:
                    if self._conn.execute("SELECT 1 FROM entries LIMIT 1").fetchone():
                        raise CorruptLedger(
                            f"{self.path} has entries but no genesis (seq 0); run `meshminer "
                            "ledger verify` and restore ledger.db from a backup"
                        )
                    payload = encode({"public_key": self._public_key})
                    self._insert(GENESIS, "", "", self.peer_id, self.peer_id, 0.0, payload)
                else:
                    self._check_genesis(Entry.from_row(genesis))
        except sqlite3.OperationalError as exc:
            if not str(exc).startswith("no such"):
                raise  # locked, busy, disk full: not the file's fault
            raise CorruptLedger(
                f"{self.path} has a table `entries` that is not a ledger's ({exc}); move it "
                "away to start a new ledger, or restore it from a backup"
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise CorruptLedger(
                f"{self.path} cannot be read as a ledger ({exc}); move it away to start a "
                "new ledger, or restore it from a backup"
            ) from exc

    def _create_schema(self) -> None:
        self._db.create_table(
            "entries",
            {
                "seq": int,
                "prev_hash": bytes,
                "hash": bytes,
                "kind": str,
                "job_id": str,
                "unit_id": str,
                "worker": str,
                "owner": str,
                "credit": float,
                "payload": bytes,
                "owner_sig": bytes,
                "worker_sig": bytes,
                "ts": float,
            },
            pk="seq",
            not_null=set(COLUMNS),
            if_not_exists=True,
        )
        for statement in _SCHEMA:
            self._conn.execute(statement)
        self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_genesis(self, genesis: Entry) -> None:
        if genesis.kind == GENESIS and genesis.owner != self.peer_id:
            raise ForeignLedger(
                f"{self.path} belongs to peer {genesis.owner} (its genesis entry), but this "
                f"node is {self.peer_id}; use that node's identity key with this data dir, "
                "or move ledger.db away to start a new ledger"
            )
        try:
            checks = check_entry(genesis, self.peer_id, self._public_key)
        except EntryProblem as exc:
            raise CorruptLedger(f"{self.path}: seq 0: {exc}") from exc
        problems = failed_signatures(checks)
        if genesis.computed_hash() != genesis.hash:
            problems.insert(0, (0, "hash does not match its contents"))
        if problems:
            raise CorruptLedger(
                f"{self.path}: seq 0: {problems[0][1]}; restore ledger.db from a backup"
            )

    # -- appending --------------------------------------------------------------------

    def append_work(
        self, kind: WorkKind, cosigned: bytes, credit: float, expected_credit: float
    ) -> Entry:
        """Append a co-signed receipt as `work_done` (this node was the worker) or
        `work_received` (this node was the owner).

        `expected_credit` is this node's own figure for the unit, from the job spec
        (TFLOP); `credit` is the figure the caller means to record. Both must agree with
        the credit the receipt carries to within a relative 1e-9; the receipt's signed
        value is what is stored. Appending the identical receipt again returns the
        existing entry; a different receipt for the same (kind, owner, job, unit) raises
        `DuplicateUnit`. Raises `InvalidReceipt`, `NotOurReceipt`, `CreditMismatch` or
        `InvalidArgument`; on any error nothing is written.
        """
        if kind not in WORK_KINDS:
            raise InvalidArgument(f"kind must be work_done or work_received, not {kind!r}")
        for name, value in (("credit", credit), ("expected_credit", expected_credit)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"{name} must be a number (TFLOP), got {value!r:.40}")
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{name} must be a finite number >= 0, got {value!r}")
        try:
            verified = open_cosigned(cosigned)
        except ProtocolError as exc:
            raise InvalidReceipt(f"co-signed receipt refused: {exc}", exc.reason) from exc
        role, who = ("worker", verified.worker) if kind == WORK_DONE else ("owner", verified.owner)
        if who != self.peer_id:
            raise NotOurReceipt(
                f"a {kind} entry needs a receipt naming this node ({self.peer_id}) as {role}; "
                f"this one names {who}"
            )
        for name, value in (("expected_credit", expected_credit), ("credit", credit)):
            if not credit_matches(verified.credit, float(value)):
                raise CreditMismatch(
                    f"unit {verified.unit_id} of job {verified.job_id}: the receipt carries "
                    f"{verified.credit!r} TFLOP but {name} is {float(value)!r} TFLOP "
                    f"(they must agree to a relative 1e-9); the receipt was not recorded"
                )
        key = (kind, verified.owner, verified.job_id, verified.unit_id)
        with self._lock, immediate(self._conn):
            existing = self._conn.execute(_SELECT_UNIT, key).fetchone()
            if existing is not None:
                entry = Entry.from_row(existing)
                if entry.payload == verified.raw:
                    return entry
                raise DuplicateUnit(
                    f"seq {entry.seq} already records {kind} for unit {verified.unit_id} of "
                    f"job {verified.job_id} (owner {verified.owner}) with a different receipt; "
                    "a unit is credited once"
                )
            return self._insert(
                kind,
                verified.job_id,
                verified.unit_id,
                verified.worker,
                verified.owner,
                verified.credit,
                verified.raw,
                verified.cosigned.owner_sig,
                verified.cosigned.worker_sig,
            )

    def append_rejected(
        self, job_id: str, unit_id: str, worker: str, owner: str, reason: str
    ) -> Entry:
        """Record a result that failed verification, and why; signed by this node.

        `worker` and `owner` must be peer ids; `reason` is kept to its first
        4000 characters. Raises `InvalidArgument`."""
        return self._append_refusal(REJECTED, job_id, unit_id, worker, owner, {"reason": reason})

    def append_invalidated(
        self, job_id: str, unit_id: str, worker: str, owner: str, reason: str, evidence: bytes
    ) -> Entry:
        """Record a result that failed a spot check: no credit, the reason, and the
        signed `Evidence` (protocol.evidence) anyone can check. Raises `InvalidArgument`."""
        if not isinstance(evidence, bytes) or not evidence:
            raise InvalidArgument("evidence must be the signed Evidence envelope")
        fields = {"reason": reason, "evidence": evidence}
        return self._append_refusal(INVALIDATED, job_id, unit_id, worker, owner, fields)

    def _append_refusal(
        self, kind: str, job_id: str, unit_id: str, worker: str, owner: str, fields: dict
    ) -> Entry:
        for name, value in (("job_id", job_id), ("unit_id", unit_id)):
            if not isinstance(value, str) or len(value) > MAX_ID_LEN:
                raise InvalidArgument(f"{name} must be text of at most {MAX_ID_LEN} characters")
        for name, value in (("worker", worker), ("owner", owner)):
            try:
                public_key_from_peer_id(value)
            except ProtocolError as exc:
                raise InvalidArgument(f"{name} must be a peer id: {exc}") from exc
        reason = fields["reason"]
        if not isinstance(reason, str) or not reason:
            raise InvalidArgument(f"reason must be non-empty text saying why it was {kind}")
        payload = encode({**fields, "reason": reason[:MAX_REASON_CHARS]})
        with self._lock, immediate(self._conn):
            return self._insert(kind, job_id, unit_id, worker, owner, 0.0, payload)

    def _insert(
        self,
        kind: str,
        job_id: str,
        unit_id: str,
        worker: str,
        owner: str,
        credit: float,
        payload: bytes,
        owner_sig: bytes | None = None,
        worker_sig: bytes = b"",
    ) -> Entry:
        """Read the head and insert the next entry; the caller holds the transaction.
        `owner_sig=None`: this node signs the entry's body."""
        head = self._conn.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")
        row = head.fetchone()
        seq, prev_hash = (row[0] + 1, row[1]) if row else (0, GENESIS_PREV_HASH)
        entry = Entry(
            seq,
            prev_hash,
            b"",  # the hash covers the signatures: computed last
            kind,
            job_id,
            unit_id,
            worker,
            owner,
            credit,
            payload,
            owner_sig or b"",
            worker_sig,
            time.time(),
        )
        if owner_sig is None:
            entry = replace(entry, owner_sig=self._key.sign(entry.body()).signature)
        entry = replace(entry, hash=entry.computed_hash())
        self._conn.execute(_INSERT, entry_row(entry))
        return entry

    # -- reading ----------------------------------------------------------------------

    def entries(self, after: int = -1, limit: int = 100) -> list[Entry]:
        """Entries with seq > `after`, in seq order, at most `limit` (1..1000)."""
        if isinstance(after, bool) or not isinstance(after, int) or after < -1:
            raise InvalidArgument(f"after must be an integer >= -1, got {after!r:.40}")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidArgument(f"limit must be an integer, got {limit!r:.40}")
        if not 1 <= limit <= MAX_ENTRIES_PAGE:
            raise InvalidArgument(f"limit must be 1..{MAX_ENTRIES_PAGE}, got {limit}")
        with self._lock:
            rows = self._conn.execute(
                _SELECT + " WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [Entry.from_row(row) for row in rows]

    def head(self) -> Entry:
        """The last entry (the genesis, in a new ledger)."""
        with self._lock:
            row = self._conn.execute(_SELECT + " ORDER BY seq DESC LIMIT 1").fetchone()
        if row is None:
            raise CorruptLedger(f"{self.path} has no entries; run `meshminer ledger verify`")
        return Entry.from_row(row)

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def verify(self, *, threads: int | None = None) -> VerifyReport:
        """Recompute every hash and check every signature, the chain links and seq
        contiguity, on a snapshot (appends may continue meanwhile). Never raises for a
        broken ledger: the report names the first bad seq and why."""
        conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=BUSY_TIMEOUT_S)
        try:
            return verify_rows(conn, self.peer_id, self._public_key, threads=threads)
        finally:
            conn.close()

    def balances(self) -> dict[str, Any]:
        """This node's credit (TFLOP): earned as a worker, spent as an owner, and counts."""
        with self._lock, snapshot(self._conn):
            rows = self._conn.execute(
                "SELECT kind, COUNT(*), TOTAL(credit) FROM entries GROUP BY kind"
            ).fetchall()
        by_kind = {kind: (n, total) for kind, n, total in rows}
        earned = by_kind.get("work_done", (0, 0.0))
        spent = by_kind.get("work_received", (0, 0.0))
        return {
            "peer_id": self.peer_id,
            "unit": "TFLOP",
            "earned": earned[1],
            "spent": spent[1],
            "net": earned[1] - spent[1],
            "work_done": earned[0],
            "work_received": spent[0],
            "rejected": by_kind.get("rejected", (0, 0.0))[0],
            "invalidated": by_kind.get("invalidated", (0, 0.0))[0],
            "entries": sum(n for n, _ in by_kind.values()),
        }

    def export(self, fmt: str, out: IO[str]) -> int:
        """Write every entry to `out` as `csv` (a header row, then one row per entry) or
        `jsonl` (one `Entry.to_json()` object per line); bytes as hex. Returns the count."""
        if fmt not in FORMATS:
            raise InvalidArgument(f"export format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=BUSY_TIMEOUT_S)
        try:
            with snapshot(conn):
                rows = conn.execute(_SELECT + " ORDER BY seq")
                return write_entries(fmt, (Entry.from_row(r) for r in rows), out)
        finally:
            conn.close()

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def entry_row(entry: Entry) -> tuple[Any, ...]:
    """The row for `entry`, in `COLUMNS` order."""
    return tuple(getattr(entry, name) for name in COLUMNS)
