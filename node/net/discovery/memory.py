"""What a node remembers of the network across restarts, in node.db's `meta` table:
that the network was large (for a day), and which directories answered it.

Both guard the network against its own nodes restarting: a node that forgot the
network was large would gossip its ad to every node at its next start, and one that
forgot its directories would register with eight untried ones at once, which, when a
whole network restarts together (an update, a power cut), multiplied every
directory's load by four and, in the simulator at 10,000 peers, kept them past their
core for the whole hour.
"""

from __future__ import annotations

import json
from typing import Any

from node.store import read_meta, write_meta

REMEMBER_S = 24 * 3600.0  # a large network is remembered this long
SIZE_KEY = "network_size"
ANSWERED_KEY = "directories_answered"


def recall_size(db: Any) -> tuple[int, float]:
    """The large network remembered: (size, time.time() when heard), or (0, 0)."""
    raw = read_meta(db, SIZE_KEY) if db is not None else None
    try:
        kept = json.loads(raw) if raw else {}
        return int(kept.get("size", 0)), float(kept.get("at", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0, 0.0


def keep_size(db: Any, size: int, at: float) -> None:
    if db is not None:
        write_meta(db, SIZE_KEY, json.dumps({"size": size, "at": at}))


def recall_answered(db: Any) -> set[str]:
    """The directories that had answered when the node last ran."""
    raw = read_meta(db, ANSWERED_KEY) if db is not None else None
    try:
        kept = json.loads(raw) if raw else []
    except ValueError:
        return set()
    return {d for d in kept if isinstance(d, str)} if isinstance(kept, list) else set()


def keep_answered(db: Any, directories: set[str]) -> None:
    if db is not None:
        write_meta(db, ANSWERED_KEY, json.dumps(sorted(directories)))
