"""`node.db`: the node's own SQLite database (jobs, tasks and peers seen).

Only the trio thread touches it; the HTTP thread asks through the bridge.
"""

from __future__ import annotations

import fcntl
import logging
import stat
from pathlib import Path
from typing import IO

import sqlite_utils

log = logging.getLogger(__name__)

NODE_DB = "node.db"
LOCK_FILE = "node.lock"


class DataDirInUse(Exception):
    """Another node process runs with this data dir."""


def lock_data_dir(data_dir: Path) -> IO[bytes]:
    """Hold an exclusive lock on the data dir for this process's lifetime (keep the
    returned file open): two nodes sharing one identity and node.db corrupt both."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode & 0o077:  # keys, jobs' data and weights: for this user only
        data_dir.chmod(0o700)
        log.warning("data dir %s was mode %o; now 0700", data_dir, mode)
    handle = open(data_dir / LOCK_FILE, "wb")  # noqa: SIM115 (held open on purpose)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        raise DataDirInUse(
            f"another meshminer node is running with data dir {data_dir}; stop it, or "
            "give this one its own --data-dir"
        ) from exc
    return handle


def open_node_db(data_dir: Path) -> sqlite_utils.Database:
    db = sqlite_utils.Database(data_dir / NODE_DB)
    db.enable_wal()
    # As for the ledger (docs/ledger.md): a commit reaches the WAL without an fsync, so a
    # crash of the process loses nothing and a power cut only the last commits. With
    # SQLite's default (FULL) every ad taken in or sealed waited on the disk inside the
    # event loop: 4 ms at the median, 20 at p90, 270 at worst on the test VM.
    db.execute("PRAGMA synchronous=NORMAL")
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["peers"].create(
        {"peer_id": str, "seq": int, "envelope": bytes, "last_seen": float},
        pk="peer_id",
        if_not_exists=True,
    )
    return db


def read_meta(db: sqlite_utils.Database, key: str) -> str | None:
    """A value this node keeps across restarts in node.db's `meta` table (None: unset)."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return row[0] if row else None


def write_meta(db: sqlite_utils.Database, key: str, value: str) -> None:
    with db.conn:
        db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [key, value],
        )


def next_counter(db: sqlite_utils.Database, name: str) -> int:
    """Increment and return a persistent counter (e.g. the capacity ad sequence)."""
    with db.conn:
        row = db.execute("SELECT value FROM meta WHERE key = ?", [name]).fetchone()
        value = int(row[0]) + 1 if row else 1
        db.execute(
            "INSERT INTO meta(key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [name, str(value)],
        )
    return value
