"""Writing entries out as CSV or JSON lines (bytes as lowercase hex)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from typing import IO, Any

from ledger.entry import COLUMNS, Entry

FORMATS = ("csv", "jsonl")


def write_entries(fmt: str, entries: Iterable[Entry], out: IO[str]) -> int:
    """Write `entries` to `out` in `fmt` (one of `FORMATS`); returns how many."""
    return write_rows(fmt, (entry.to_json() for entry in entries), out)


def write_rows(fmt: str, rows: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """Write entries already in their JSON form (`Entry.to_json()`, or the API's)."""
    count = 0
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        for plain in rows:
            writer.writerow([_csv_value(plain[name]) for name in COLUMNS])
            count += 1
    elif fmt == "jsonl":
        for plain in rows:
            out.write(json.dumps(plain, separators=(",", ":")) + "\n")
            count += 1
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    return count


def _csv_value(value: object) -> object:
    # repr keeps every bit of a float (str() does too since 3.1; be explicit anyway)
    return repr(value) if isinstance(value, float) else value
