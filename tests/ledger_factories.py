"""Builders for ledger and audit tests: keys, receipts, co-signed receipts, tampering."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from nacl.signing import SigningKey

from ledger.entry import COLUMNS, Entry
from protocol import peer_id_from_public_key, seal
from protocol.receipts import CoSignedReceipt, claim_bytes, countersign, issue
from protocol.work import Receipt

DIGITS_CREDIT = 34_048 * 500 * 64 * 3 / 1e12  # the digits MLP of docs/jobspec.md


def peer_id_of(key: SigningKey) -> str:
    return peer_id_from_public_key(bytes(key.verify_key))


def key_from(n: int) -> SigningKey:
    """A deterministic key, so failures reproduce."""
    return SigningKey(n.to_bytes(32, "big"))


def receipt_envelope(
    owner: SigningKey,
    worker: SigningKey,
    *,
    job_id: str = "026ab639c21df8aa",
    unit_id: str = "d1b608530bb248d3",
    weights: str = "ab" * 32,
    issued_at: float | None = None,
    sealer: SigningKey | None = None,
) -> bytes:
    receipt = Receipt(
        job_id=job_id,
        unit_id=unit_id,
        owner=peer_id_of(owner),
        worker=peer_id_of(worker),
        weights_sha256=weights,
        steps=500,
        samples=32_000,
        metrics={"val_loss": 0.12, "val_accuracy": 0.975},
        issued_at=time.time() if issued_at is None else issued_at,
    )
    return seal(receipt, sealer or owner)


def cosigned(
    owner: SigningKey,
    worker: SigningKey,
    credit: float = DIGITS_CREDIT,
    **receipt_fields: object,
) -> bytes:
    """A complete co-signed receipt made through the real issue/countersign flow."""
    half = issue(receipt_envelope(owner, worker, **receipt_fields), credit, owner)
    return countersign(half, worker, credit)


def forged_cosigned(
    owner: SigningKey,
    worker: SigningKey,
    credit: float = DIGITS_CREDIT,
    *,
    owner_signer: SigningKey | None = None,
    worker_signer: SigningKey | None = None,
    formula: int = 1,
    **receipt_fields: object,
) -> bytes:
    """A co-signed receipt whose claims are signed by whoever is given (no checks)."""
    envelope = receipt_envelope(owner, worker, **receipt_fields)
    claims = {role: claim_bytes(role, envelope, credit, formula) for role in ("owner", "worker")}
    owner_sig = (owner_signer or owner).sign(claims["owner"]).signature
    worker_sig = (worker_signer or worker).sign(claims["worker"]).signature
    return CoSignedReceipt(envelope, credit, owner_sig, worker_sig, formula).to_bytes()


def copy_ledger(src_dir: Path, dst_dir: Path) -> Path:
    """A consistent copy of `src_dir`/ledger.db (SQLite backup API: WAL included)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    src = sqlite3.connect(str(src_dir / "ledger.db"))
    dst = sqlite3.connect(str(dst_dir / "ledger.db"))
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return dst_dir


def tamper(data_dir: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """Run SQL on data_dir/ledger.db the way an attacker would: triggers dropped."""
    conn = sqlite3.connect(str(data_dir / "ledger.db"), isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS entries_no_update")
        conn.execute("DROP TRIGGER IF EXISTS entries_no_delete")
        for sql, params in statements:
            conn.execute(sql, params)
    finally:
        conn.close()


def read_rows(data_dir: Path) -> list[Entry]:
    conn = sqlite3.connect(str(data_dir / "ledger.db"))
    try:
        rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [Entry.from_row(row) for row in rows]


def rechain(data_dir: Path, from_seq: int) -> None:
    """Recompute hash and prev_hash from `from_seq` on, as a forger would after an edit."""
    entries = read_rows(data_dir)
    prev = entries[from_seq - 1].hash if from_seq else bytes(32)
    updates = []
    for entry in entries[from_seq:]:
        fixed = replace(entry, prev_hash=prev, hash=b"")
        digest = fixed.computed_hash()
        updates.append(
            ("UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, entry.seq))
        )
        prev = digest
    tamper(data_dir, *updates)
