"""Both ends of the directory's credit table (`/meshminer/directory/credit/1`).

In a large network co-signed receipts go to directories alone
(`Registration.audits_receipts`): a volunteer would spend about 1% of a core auditing
everyone's, and the share grows with the work done. So its own audit holds only its
own receipts, and its Credit page asks a directory for the directory's audit instead:
its top workers by credit, signed by the directory and shown as that directory's view,
never merged into this node's (a directory can leave out or inflate rows; it cannot
put words in a worker's ad, since names and teams come from the ads it holds).

A directory computes the table at most once every `TABLE_S` seconds, however often it
is asked; an asking node keeps an answer for `KEEP_S`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from node.identity import Identity
from node.net.host import HostError, MeshHost
from protocol import ProtocolError, open_envelope, seal
from protocol.directory import (
    CREDIT_LIMITS,
    MAX_CREDIT_ROWS,
    CreditQuery,
    CreditReply,
    CreditRow,
)
from protocol.names import CREDIT_PROTOCOL

if TYPE_CHECKING:
    from node.net.discovery.registration import Registration

log = logging.getLogger(__name__)

TABLE_S = 10.0  # a directory recomputes its table at most this often
KEEP_S = 30.0  # an asking node shows an answer this long before it asks again
ASK_TIMEOUT_S = 5.0
ASKED = 2  # directories tried in turn before the page says none answered


def credit_rows(
    credit: dict[str, dict[str, Any]],
    rac: dict[str, float],
    labels: dict[str, tuple[str, str]],
    want: int,
) -> list[CreditRow]:
    """The workers of an audit (`AuditLog.network_credit`, `recent_credit`), ranked by
    credit, at most `want`; `labels`: peer id -> (name, team) from the ads at hand. An
    owner that only spent credit is no row. The one table both a node's own Credit page
    and a directory's answer are made of."""
    rows = [
        CreditRow(
            peer_id,
            credit=c["earned"],
            rac=rac.get(peer_id, 0.0),
            units=c.get("units", 0),
            conflicts=c["conflicts"],
            name=labels.get(peer_id, ("", ""))[0],
            team=labels.get(peer_id, ("", ""))[1],
        )
        for peer_id, c in credit.items()
        if c.get("units") or c.get("conflicts")
    ]
    rows.sort(key=lambda r: (-r.credit, r.peer_id))
    return rows[:want]


#: what a directory's audit says: credit per peer, RAC per worker, receipts audited
AuditFigures = tuple[dict[str, dict[str, Any]], dict[str, float], int]


class CreditServer:
    """A directory's end: its audit's table (`read`, called in a worker thread), top
    `MAX_CREDIT_ROWS`, made at most every `TABLE_S` and cut to each query's `want`;
    `labels`: peer id -> (name, team) of the ads it holds."""

    def __init__(
        self,
        host: MeshHost,
        identity: Identity,
        read: Callable[[], AuditFigures],
        labels: Callable[[], dict[str, tuple[str, str]]],
    ) -> None:
        self.host = host
        self.identity = identity
        self.read = read
        self.labels = labels
        self._table: tuple[float, int, list[CreditRow]] = (-TABLE_S, 0, [])
        self._lock = trio.Lock()

    def start(self) -> None:
        self.host.serve(CREDIT_PROTOCOL, self._answer, max_request=1024)

    async def table(self) -> tuple[int, list[CreditRow]]:
        async with self._lock:  # many askers at once: one computation
            made, receipts, rows = self._table
            if trio.current_time() - made >= TABLE_S:
                labels = self.labels()
                credit, rac, receipts = await trio.to_thread.run_sync(self.read)
                rows = credit_rows(credit, rac, labels, MAX_CREDIT_ROWS)
                self._table = (trio.current_time(), receipts, rows)
            return receipts, rows

    async def _answer(self, peer: str, request: bytes) -> bytes:
        query = open_envelope(
            request, CreditQuery, expected_signer=peer, limits=CREDIT_LIMITS
        ).message
        receipts, rows = await self.table()
        reply = CreditReply(receipts, rows[: query.want], timestamp=time.time())
        return seal(reply, self.identity.signing_key)


async def ask_credit(
    host: MeshHost, identity: Identity, directory: str, want: int = 100
) -> CreditReply:
    """One directory's table; `HostError` or `ProtocolError` when it does not give a
    well-formed one signed by itself."""
    query = seal(CreditQuery(want, timestamp=time.time()), identity.signing_key)
    raw = await host.request(
        directory, CREDIT_PROTOCOL, query, CREDIT_LIMITS.max_bytes, ASK_TIMEOUT_S
    )
    return open_envelope(raw, CreditReply, expected_signer=directory, limits=CREDIT_LIMITS).message


@dataclass
class DirectoryCredit:
    """An asking node's end: a directory's table for the Credit page while this node
    does not audit the network's receipts itself (None while it does)."""

    registration: Registration
    identity: Identity
    _kept: tuple[float, dict[str, Any] | None] = (-KEEP_S, None)

    async def view(self) -> dict[str, Any] | None:
        if self.registration.audits_receipts():
            return None
        made, kept = self._kept
        if kept is not None and trio.current_time() - made < KEEP_S:
            return kept
        asked = self.registration.ask_order(time.monotonic())[:ASKED]
        errors = []
        for directory in asked:
            try:
                reply = await ask_credit(self.registration.host, self.identity, directory)
            except (HostError, ProtocolError) as exc:
                errors.append(f"{directory}: {exc}")
                log.info("credit table from directory %s: %s", directory, exc)
                continue
            kept = {
                "directory": directory,
                "receipts": reply.receipts,
                "peers": [row_plain(r, self.identity.peer_id) for r in reply.rows],
            }
            self._kept = (trio.current_time(), kept)
            return kept
        why = "; ".join(errors) or "no directory is known yet"
        return {"directory": None, "error": f"no directory gave its table ({why})"}


def row_plain(row: CreditRow, own: str) -> dict[str, Any]:
    """A row as the API and the page show it (`own`: this node's peer id)."""
    return {
        "peer_id": row.peer_id,
        "name": row.name,
        "team": row.team,
        "credit": row.credit,
        "rac": row.rac,
        "units": row.units,
        "conflicts": row.conflicts,
        "self": row.peer_id == own,
    }
