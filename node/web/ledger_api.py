"""Ledger routes: entries, verification, balances (this node's and the network's).

The ledger and the audit table are thread-safe SQLite objects of their own, so these
handlers read them from the HTTP thread (verification, which can take seconds, in a
worker thread) without going through the node's trio loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

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


class VerifyCache:
    """`GET /ledger/verify` re-checks every hash and signature, seconds of CPU on a big
    ledger: one run at a time, its report reused until the ledger's head moves, so a
    page hammering the endpoint costs one verify, not one per request."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._report: tuple[tuple[int, bytes], dict[str, Any]] | None = None
        self._running: asyncio.Future[dict[str, Any]] | None = None

    async def report(self) -> dict[str, Any]:
        head = self._ledger.head()
        key = (head.seq, head.hash)
        if self._report is not None and self._report[0] == key:
            return self._report[1]
        if self._running is None:
            self._running = asyncio.ensure_future(self._run(key))
        return await asyncio.shield(self._running)

    async def _run(self, key: tuple[int, bytes]) -> dict[str, Any]:
        try:
            report = (await asyncio.to_thread(self._ledger.verify)).to_json()
            report["checked_at"] = time.time()
            self._report = (key, report)
            return report
        finally:
            self._running = None


def ledger_routes(ledger: Ledger, audit: AuditLog) -> Callable[[web.Application], None]:
    cache = VerifyCache(ledger)

    async def entries(request: web.Request) -> web.Response:
        after = _int_param(request, "after", -1, -1, 2**62)
        limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
        rows = await asyncio.to_thread(ledger.entries, after, limit)
        return web.json_response(
            {"entries": [e.to_json() for e in rows], "head_seq": ledger.head().seq}
        )

    async def verify(request: web.Request) -> web.Response:
        return web.json_response(await cache.report())

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
