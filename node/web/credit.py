"""The network's credit as this node saw it: `GET /api/v1/credit` and the data of the
Credit page.

Every node audits the co-signed receipts it sees (`ledger.audit`): all of them in a
small network, in a large one its own and, on a directory, those gossiped to it. So
the table is this node's own view, never a global truth: another node may have seen
more, fewer or other receipts, and two identities of one person can co-sign each
other's work (docs/threat-model.md). Each row is a peer that trained: its credit from
receipts not in conflict, its recent average credit (BOINC's RAC, a week's
half-life), the units behind it, its conflicts, and the name and team its ad carries.
In a large network, where a volunteer audits only its own receipts, the view also
holds a directory's table (`node.net.discovery.credit`), shown as that directory's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ledger.audit import AuditLog
from node.net.discovery.credit import credit_rows, row_plain
from node.work.trust.reputation import RAC_HALF_LIFE_S

VIEW = (
    "This node's own audit of the co-signed receipts it has seen, not a global truth: "
    "another node may have seen others."
)


def credit_view(
    credit: dict[str, dict[str, Any]],
    rac: dict[str, float],
    peers: list[dict[str, Any]],
    own: dict[str, Any],
) -> dict[str, Any]:
    """Rows ranked by credit earned, and this node's rank (None: it trained nothing
    this node saw). `peers` and `own` are ads as JSON: their names and teams. A peer
    that only spent credit (an owner) has no row."""
    labels = {p["peer_id"]: (p.get("name", ""), p.get("team", "")) for p in [*peers, own]}
    rows = credit_rows(credit, rac, labels, len(credit))
    return {"view": VIEW, **ranked([row_plain(r, own["peer_id"]) for r in rows])}


def ranked(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows in their order, each given its `rank`, and this node's rank (or None)."""
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    return {"rank": next((r["rank"] for r in rows if r["self"]), None), "peers": rows}


def audit_figures(audit: AuditLog) -> tuple[dict[str, dict[str, Any]], dict[str, float], int]:
    """Credit per peer, RAC per worker and the receipts audited: what a table needs."""
    credit = audit.network_credit()
    return credit, audit.recent_credit(time.time(), RAC_HALF_LIFE_S), audit.count()


#: a directory's table while this node does not audit the network's receipts (None)
DirectoryView = Callable[[], Awaitable[dict[str, Any] | None]]


async def read_credit(
    audit: AuditLog,
    peers: Callable[[], Awaitable[list[dict[str, Any]]]],
    own: dict[str, Any],
    directory: DirectoryView | None = None,
) -> dict[str, Any]:
    """`credit_view` of the audit table now: the peer table from `peers()` (the node's
    thread), the audit table's reads in a worker thread; and `directory()`'s table,
    ranked alike, under `directory` (absent in a network this node audits itself)."""
    peer_rows = await peers()
    credit, rac, _ = await asyncio.to_thread(audit_figures, audit)
    view = credit_view(credit, rac, peer_rows, own)
    theirs = await directory() if directory is not None else None
    if theirs is not None:
        view["directory"] = theirs | ranked(theirs.get("peers", []))
    return view


def credit_routes(
    audit: AuditLog,
    peers: Callable[[], Awaitable[list[dict[str, Any]]]],
    own: dict[str, Any],
    directory: DirectoryView | None = None,
) -> Callable[[web.Application], None]:
    async def credit(request: web.Request) -> web.Response:
        return web.json_response(await read_credit(audit, peers, own, directory))

    def add(app: web.Application) -> None:
        app.router.add_get("/api/v1/credit", credit)

    return add
