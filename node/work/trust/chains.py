"""The owner's record of each unit's chain of commitments, in memory and in node.db's
`commitments` table (one JSON row a unit): an owner that restarts draws no segment
twice and knows which states it fetched and which segments it replayed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import sqlite_utils

TABLE = "commitments"


@dataclass
class Chain:
    """What the owner holds of one unit's commitments."""

    shas: list[str] = field(default_factory=list)
    drawn: dict[int, bool] = field(default_factory=dict)  # segment -> chosen
    fetched: set[int] = field(default_factory=set)  # states held here (`FetchedStates`)
    # segments replayed while it trained: [the replayed end's sha256, its distance
    # from the worker's end (across determinism classes; else 0), whether they agree]
    replayed: dict[int, list] = field(default_factory=dict)
    last_fetch_at: float = field(default_factory=time.time)  # for `resume.due`

    def chosen(self) -> list[int]:
        return sorted(i for i, chosen in self.drawn.items() if chosen)

    def agreed(self) -> dict[int, bool]:
        """Segment -> whether its replay agreed, for those replayed while it trained."""
        return {i: bool(r[2]) for i, r in self.replayed.items() if len(r) > 2}


class Chains:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self._table = db[TABLE]
        if not self._table.exists():
            self._table.create({"unit_id": str, "chain": str}, pk="unit_id")
        self._loaded: dict[str, Chain] = {}

    def get(self, unit_id: str) -> tuple[Chain, bool]:
        """The unit's chain, and whether it was just read from node.db (or made)."""
        if unit_id in self._loaded:
            return self._loaded[unit_id], False
        rows = list(self._table.rows_where("unit_id = ?", [unit_id], limit=1))
        plain = json.loads(rows[0]["chain"]) if rows else {}
        chain = Chain(
            list(plain.get("shas", [])),
            {int(k): bool(v) for k, v in plain.get("drawn", {}).items()},
            set(plain.get("fetched", [])),
            {int(k): list(v) for k, v in plain.get("replayed", {}).items()},
        )
        self._loaded[unit_id] = chain
        return chain, True

    def loaded(self, unit_id: str) -> Chain | None:
        """The unit's chain if it is in memory (not forgotten meanwhile)."""
        return self._loaded.get(unit_id)

    def save(self, unit_id: str, chain: Chain) -> None:
        plain = {
            "shas": chain.shas,
            "drawn": chain.drawn,
            "fetched": sorted(chain.fetched),
            "replayed": chain.replayed,
        }
        self._table.upsert({"unit_id": unit_id, "chain": json.dumps(plain)}, pk="unit_id")

    def forget(self, unit_id: str) -> Chain | None:
        self._table.delete_where("unit_id = ?", [unit_id])
        return self._loaded.pop(unit_id, None)
