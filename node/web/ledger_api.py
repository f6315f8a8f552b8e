"""Ledger routes: entries, verification, balances (this node's and the network's).

The ledger and the audit table are thread-safe SQLite objects of their own, so these
handlers read them from the HTTP thread (verification, which can take seconds, in a
worker thread) without going through the node's trio loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from ledger.audit import AuditLog
from ledger.chain import Ledger

MAX_LIMIT = 1000


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"'{name}' must be an integer, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"'{name}' must be in {low}..{high}, got {value}")
    return value


def ledger_routes(ledger: Ledger, audit: AuditLog) -> Callable[[web.Application], None]:
    async def entries(request: web.Request) -> web.Response:
        after = _int_param(request, "after", -1, -1, 2**62)
        limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
        rows = await asyncio.to_thread(ledger.entries, after, limit)
        return web.json_response(
            {"entries": [e.to_json() for e in rows], "head_seq": ledger.head().seq}
        )

    async def verify(request: web.Request) -> web.Response:
        return web.json_response((await asyncio.to_thread(ledger.verify)).to_json())

    async def balances(request: web.Request) -> web.Response:
        node, network, conflicts = await asyncio.to_thread(
            lambda: (ledger.balances(), audit.network_credit(), audit.conflicts())
        )
        return web.json_response({"node": node, "network": network, "conflicts": conflicts})

    def add(app: web.Application) -> None:
        app.router.add_get("/api/v1/ledger", entries)
        app.router.add_get("/api/v1/ledger/verify", verify)
        app.router.add_get("/api/v1/ledger/balances", balances)

    return add
