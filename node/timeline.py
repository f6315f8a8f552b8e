"""The node's own timeline: what its volunteer changed and what that did (preferences
set from the page or the API, training paused and resumed), newest last, in node.db."""

from __future__ import annotations

import time
from typing import Any

import sqlite_utils

KEEP = 200


class NodeTimeline:
    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        db["node_timeline"].create(
            {"id": int, "t": float, "note": str}, pk="id", if_not_exists=True
        )

    def add(self, note: str) -> None:
        with self._db.conn:
            self._db.execute(
                "INSERT INTO node_timeline (t, note) VALUES (?, ?)", [time.time(), note[:500]]
            )
            self._db.execute(
                "DELETE FROM node_timeline WHERE id <= (SELECT MAX(id) FROM node_timeline) - ?",
                [KEEP],
            )

    def recent(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT t, note FROM node_timeline ORDER BY id DESC LIMIT ?", [limit]
        ).fetchall()
        return [{"t": t, "note": note} for t, note in reversed(rows)]
