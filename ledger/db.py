"""Opening an SQLite file the way the ledger needs it, and its write transactions.

WAL mode with `synchronous=NORMAL`. In WAL mode a commit appends the transaction's
pages and a commit frame to the -wal file before `COMMIT` returns, so once an append
has returned it survives the process being killed at any later instant, and a kill
*during* an append leaves a WAL tail without a commit frame, which SQLite ignores on
the next open: no half entry, ever. NORMAL skips the fsync at each commit (the WAL is
fsynced at checkpoints), which is what makes thousands of appends per second possible;
the price is that a power cut or OS crash (not a process crash) can lose the last few
appends. It never corrupts the file or breaks the chain: what survives is a prefix of
what was committed. A lost work entry is re-appended from the receipt the node keeps;
`durable=True` (FULL: fsync per commit) is there for whoever prefers ~fsync-bound
appends to that window.

Connections use `isolation_level=None` so that the only transactions are the explicit
ones in `immediate()`: `BEGIN IMMEDIATE` takes the write lock before the head is read,
so two writers (two processes, or two threads) can never both build on the same head.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

#: how long a writer waits for another writer's transaction before giving up
BUSY_TIMEOUT_MS = 10_000


def connect(path: Path, *, durable: bool = False) -> sqlite_utils.Database:
    """An sqlite-utils Database on `path` in WAL mode, autocommit outside `immediate()`."""
    conn = sqlite3.connect(
        str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    db = sqlite_utils.Database(conn, execute_plugins=False)  # no third-party code here
    db.enable_wal()
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return db


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction: `BEGIN IMMEDIATE` ... `COMMIT`, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A read transaction: every query inside sees the same committed state."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
