"""`verify`: re-check a whole ledger from its rows alone, and name the first bad seq.

One read transaction (a consistent snapshot; appends may go on meanwhile). The main
thread walks the rows in seq order and checks, for each: seq contiguity, the hash
recomputed from the columns, the link to the previous entry's hash, and the kind's
rules (`ledger.checks`). Signature checks are handed to a thread pool in chunks: PyNaCl
verifies in C without the GIL, so they run on every core while the main thread keeps
hashing. Every problem is kept with its seq; the report names the lowest (at one seq,
a broken hash or link is named before a signature).
"""

from __future__ import annotations

import os
import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ledger.checks import EntryProblem, SigCheck, check_entry, failed_signatures
from ledger.db import snapshot
from ledger.entry import COLUMNS, GENESIS_PREV_HASH, Entry

#: rows fetched, and signatures handed to one pool task, at a time
CHUNK = 2048
#: problems kept for the report (the count is exact)
MAX_PROBLEMS_LISTED = 20


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of `Ledger.verify()`."""

    ok: bool
    entries: int  # rows read
    head_seq: int  # the last seq read (-1: empty)
    head_hash: bytes
    first_bad_seq: int | None
    error: str | None  # the first problem: "seq 17: hash does not match its contents"
    problems: list[str]  # the first few problems, in seq order
    problem_count: int
    signatures_checked: int
    elapsed_s: float

    def __str__(self) -> str:
        if self.ok:
            return (
                f"ledger ok: {self.entries} entries, head seq {self.head_seq} "
                f"({self.head_hash.hex()[:16]}...), {self.signatures_checked} signatures, "
                f"{self.elapsed_s:.2f} s"
            )
        return f"ledger BROKEN: {self.error} ({self.problem_count} problem(s) in all)"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "entries": self.entries,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash.hex(),
            "first_bad_seq": self.first_bad_seq,
            "error": self.error,
            "problems": list(self.problems),
            "problem_count": self.problem_count,
            "signatures_checked": self.signatures_checked,
            "elapsed_s": round(self.elapsed_s, 4),
        }


def verify_rows(
    conn: sqlite3.Connection,
    node_peer_id: str,
    node_key: bytes,
    *,
    threads: int | None = None,
) -> VerifyReport:
    """Check every row of `entries` as described in the module docstring."""
    started = time.perf_counter()
    threads = threads or len(os.sched_getaffinity(0)) or 1
    # (seq, 0 = chain/shape problem | 1 = signature, message)
    problems: list[tuple[int, int, str]] = []
    entries = 0
    signatures = 0
    head_seq, head_hash = -1, b""
    pending: list[Future[list[tuple[int, str]]]] = []
    batch: list[SigCheck] = []

    def drain(keep: int) -> None:
        while len(pending) > keep:
            for seq, message in pending.pop(0).result():
                problems.append((seq, 1, f"seq {seq}: {message}"))

    select = f"SELECT {', '.join(COLUMNS)} FROM entries ORDER BY seq"
    with ThreadPoolExecutor(max_workers=threads) as pool, snapshot(conn):
        cursor = conn.execute(select)
        expected_seq, prev_hash = 0, GENESIS_PREV_HASH
        while rows := cursor.fetchmany(CHUNK):
            for row in rows:
                entries += 1
                seq = row[0]
                linked = True
                if seq != expected_seq:
                    what = (
                        f"the ledger starts at seq {seq}"
                        if expected_seq == 0
                        else f"seq jumps from {expected_seq - 1} to {seq}"
                    )
                    problems.append((expected_seq, 0, f"seq {expected_seq} missing ({what})"))
                    linked = False  # nothing to link to: the gap is the problem
                try:
                    entry = Entry.from_row(row)
                    if entry.computed_hash() != entry.hash:
                        problems.append((seq, 0, f"seq {seq}: hash does not match its contents"))
                    if linked and entry.prev_hash != prev_hash:
                        problems.append(
                            (
                                seq,
                                0,
                                f"seq {seq}: prev_hash does not link to seq {seq - 1}"
                                if seq
                                else "seq 0: prev_hash is not 32 zero bytes",
                            )
                        )
                    checks = check_entry(entry, node_peer_id, node_key)
                except EntryProblem as exc:
                    problems.append((seq, 0, f"seq {seq}: {exc}"))
                    checks = []
                except Exception as exc:  # a row altered into types the code never writes
                    problems.append((seq, 0, f"seq {seq}: unreadable entry ({exc!r:.200})"))
                    checks = []
                batch.extend(checks)
                signatures += len(checks)
                expected_seq, prev_hash = seq + 1, row[2]
                head_seq, head_hash = seq, row[2]
            if len(batch) >= CHUNK:
                pending.append(pool.submit(failed_signatures, batch))
                batch = []
                drain(keep=2 * threads)
        if batch:
            pending.append(pool.submit(failed_signatures, batch))
        drain(keep=0)
    if entries == 0:
        problems.append((0, 0, "seq 0 missing (the ledger has no entries, not even a genesis)"))

    problems.sort(key=lambda p: (p[0], p[1]))
    first = problems[0] if problems else None
    return VerifyReport(
        ok=not problems,
        entries=entries,
        head_seq=head_seq,
        head_hash=head_hash if isinstance(head_hash, bytes) else b"",
        first_bad_seq=first[0] if first else None,
        error=first[2] if first else None,
        problems=[p[2] for p in problems[:MAX_PROBLEMS_LISTED]],
        problem_count=len(problems),
        signatures_checked=signatures,
        elapsed_s=time.perf_counter() - started,
    )
