"""The ledger: signed, chained appends against plain SQLite inserts, and verify time.

    .venv/bin/python -m benchmarks.ledger [--appends 20000] [--rounds 3]
                                          [--verify-entries 100000] [--work-verify 100000]

- **signed appends**: `Ledger.append_rejected`, each one its own `BEGIN IMMEDIATE`
  transaction that reads the head, signs the entry body (one Ed25519 signature),
  hashes it and inserts the row (WAL, synchronous=NORMAL).
- **plain inserts**: the same rows (read back from the ledger) inserted into a table of
  the same columns in another file with the same pragmas, one transaction each, with no
  head read, signing or hashing: what SQLite alone costs per committed row. Also once
  with all rows in one transaction, for scale.
- Rounds alternate the two (fresh files each round) and the ratio is the median of the
  per-round ratios, so load from other work on the machine skews it less.
- **work appends**: `Ledger.append_work` of pre-built co-signed receipts: three
  signature verifications each (the receipt envelope, the owner's and the worker's
  claims), then the same transaction. **durable**: signed appends with
  `durable=True` (synchronous=FULL, an fsync per commit).
- **verify**: `Ledger.verify()` of a ledger of `--verify-entries` rejected entries (one
  signature each) and of `--work-verify` work entries (two each), with the default
  thread pool and with one thread.

Prints a table and writes benchmarks/results/ledger.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from ledger import Ledger
from ledger.db import connect, immediate
from ledger.entry import COLUMNS
from protocol import peer_id_from_public_key, seal
from protocol.receipts import CoSignedReceipt, claim_bytes
from protocol.work import Receipt

RESULTS = Path(__file__).parent / "results" / "ledger.json"
REASON = "weights sha256 does not match the result"


def peer_id(key: SigningKey) -> str:
    return peer_id_from_public_key(bytes(key.verify_key))


def signed_appends(data_dir: Path, node: SigningKey, worker_id: str, n: int) -> float:
    """Seconds for n append_rejected calls on a fresh ledger."""
    with Ledger.open(data_dir, node) as ledger:
        owner_id = ledger.peer_id
        started = time.perf_counter()
        for i in range(n):
            ledger.append_rejected("34c2fc8bf8156816", f"{i:016x}", worker_id, owner_id, REASON)
        return time.perf_counter() - started


def plain_inserts(src_dir: Path, dst_dir: Path, *, batched: bool) -> tuple[float, int]:
    """Seconds to insert src's rows (not the genesis) into a plain table; and how many."""
    src = sqlite3.connect(str(src_dir / "ledger.db"))
    rows = src.execute(f"SELECT {', '.join(COLUMNS)} FROM entries WHERE seq > 0").fetchall()
    src.close()
    dst_dir.mkdir(parents=True, exist_ok=True)
    db = connect(dst_dir / "plain.db")
    conn = db.conn
    conn.execute(
        "CREATE TABLE entries (seq INTEGER PRIMARY KEY, prev_hash BLOB, hash BLOB, kind TEXT, "
        "job_id TEXT, unit_id TEXT, worker TEXT, owner TEXT, credit FLOAT, payload BLOB, "
        "owner_sig BLOB, worker_sig BLOB, ts FLOAT)"
    )
    insert = f"INSERT INTO entries VALUES ({', '.join('?' * len(COLUMNS))})"
    started = time.perf_counter()
    if batched:
        with immediate(conn):
            conn.executemany(insert, rows)
    else:
        for row in rows:
            with immediate(conn):
                conn.execute(insert, row)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed, len(rows)


def make_receipts(owner: SigningKey, worker: SigningKey, n: int, credit: float) -> list[bytes]:
    """n co-signed receipts (owner -> worker), signed directly: what `issue` and
    `countersign` produce, without their checks (append_work checks every one)."""
    out = []
    for i in range(n):
        envelope = seal(
            Receipt(
                "34c2fc8bf8156816",
                f"{i:016x}",
                peer_id(owner),
                peer_id(worker),
                "ab" * 32,
                500,
                32_000,
                {"val_loss": 0.1, "val_accuracy": 0.97},
                time.time(),
            ),
            owner,
        )
        owner_sig = owner.sign(claim_bytes("owner", envelope, credit)).signature
        worker_sig = worker.sign(claim_bytes("worker", envelope, credit)).signature
        out.append(CoSignedReceipt(envelope, credit, owner_sig, worker_sig).to_bytes())
    return out


def work_appends(data_dir: Path, node: SigningKey, receipts: list[bytes], credit: float) -> float:
    with Ledger.open(data_dir, node) as ledger:
        started = time.perf_counter()
        for receipt in receipts:
            ledger.append_work("work_done", receipt, credit, credit)
        return time.perf_counter() - started


def time_verify(data_dir: Path, node: SigningKey, threads: int | None) -> dict[str, Any]:
    with Ledger.open(data_dir, node) as ledger:
        report = ledger.verify(threads=threads)
    assert report.ok, report.error
    return {
        "entries": report.entries,
        "signatures": report.signatures_checked,
        "seconds": round(report.elapsed_s, 3),
        "threads": threads or len(os.sched_getaffinity(0)),
    }


def wait_for_quiet(below: float, at_most_s: float) -> float:
    """Wait (up to `at_most_s`) for the 1-minute load average to drop below `below`:
    other work on a 2-core machine moves these figures more than anything measured."""
    started = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - started < at_most_s:
        time.sleep(2)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=20_000, help="appends per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=int, default=5_000, help="work receipts to append")
    parser.add_argument("--durable", type=int, default=500, help="appends with durable=True")
    parser.add_argument("--verify-entries", type=int, default=100_000)
    parser.add_argument("--work-verify", type=int, default=100_000, help="0 to skip")
    parser.add_argument("--quiet", type=float, default=1.0, help="wait for a load below this")
    parser.add_argument("--quiet-wait", type=float, default=120, help="for at most this long")
    args = parser.parse_args()

    waited = wait_for_quiet(args.quiet, args.quiet_wait)

    node, peer = SigningKey.generate(), SigningKey.generate()
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="meshminer-bench-ledger-") as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            ledger_s = signed_appends(root / f"l{r}", node, peer_id(peer), args.appends)
            plain_s, n = plain_inserts(root / f"l{r}", root / f"p{r}", batched=False)
            batch_s, _ = plain_inserts(root / f"l{r}", root / f"b{r}", batched=True)
            rounds.append(
                {
                    "ledger_per_s": args.appends / ledger_s,
                    "plain_per_s": n / plain_s,
                    "plain_one_tx_per_s": n / batch_s,
                }
            )
            print(
                f"round {r + 1}: ledger {rounds[-1]['ledger_per_s']:,.0f}/s, "
                f"plain {rounds[-1]['plain_per_s']:,.0f}/s, "
                f"plain one tx {rounds[-1]['plain_one_tx_per_s']:,.0f}/s",
                flush=True,
            )
        ratio = statistics.median(x["ledger_per_s"] / x["plain_per_s"] for x in rounds)

        credit = 0.003268608
        receipts = make_receipts(peer, node, args.work, credit)
        work_s = work_appends(root / "work", node, receipts, credit)

        with Ledger.open(root / "durable", node, durable=True) as ledger:
            started = time.perf_counter()
            for i in range(args.durable):
                ledger.append_rejected("j", f"u{i}", peer_id(peer), ledger.peer_id, REASON)
            durable_per_s = args.durable / (time.perf_counter() - started)

        big = root / "verify"
        build_s = signed_appends(big, node, peer_id(peer), args.verify_entries - 1)
        verify = [time_verify(big, node, None), time_verify(big, node, 1)]
        print(f"verify {args.verify_entries:,} rejected: {verify[0]['seconds']} s", flush=True)

        work_verify: list[dict[str, Any]] = []
        if args.work_verify:
            big_work = root / "verify-work"
            receipts = make_receipts(peer, node, args.work_verify - 1, credit)
            work_appends(big_work, node, receipts, credit)
            del receipts
            work_verify = [time_verify(big_work, node, None), time_verify(big_work, node, 1)]
    load_after = os.getloadavg()

    result = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "pynacl": version("pynacl"),
            "waited_for_quiet_s": round(waited, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        },
        "appends_per_round": args.appends,
        "rounds": [{k: round(v) for k, v in x.items()} for x in rounds],
        "signed_appends_per_s": round(statistics.median(x["ledger_per_s"] for x in rounds)),
        "plain_inserts_per_s": round(statistics.median(x["plain_per_s"] for x in rounds)),
        "plain_one_tx_per_s": round(statistics.median(x["plain_one_tx_per_s"] for x in rounds)),
        "ratio_signed_vs_plain": round(ratio, 3),
        "work_appends_per_s": round(args.work / work_s),
        "durable_appends_per_s": round(durable_per_s),
        "verify_rejected": verify,
        "verify_rejected_build_appends_per_s": round((args.verify_entries - 1) / build_s),
        "verify_work": work_verify,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    rows = [
        ("signed appends (1 signature, own tx)", f"{result['signed_appends_per_s']:,} /s"),
        ("plain SQLite inserts (own tx)", f"{result['plain_inserts_per_s']:,} /s"),
        ("ratio signed / plain", f"{result['ratio_signed_vs_plain']:.2f}"),
        ("plain SQLite inserts (one tx)", f"{result['plain_one_tx_per_s']:,} /s"),
        ("work appends (3 verifications)", f"{result['work_appends_per_s']:,} /s"),
        ("durable signed appends (FULL)", f"{result['durable_appends_per_s']:,} /s"),
    ]
    for v in verify + work_verify:
        kind = "work" if v in work_verify else "rejected"
        rows.append(
            (
                f"verify {v['entries']:,} {kind}, {v['threads']} thread(s)",
                f"{v['seconds']:.2f} s ({v['signatures']:,} signatures)",
            )
        )
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {RESULTS}")


if __name__ == "__main__":
    main()
