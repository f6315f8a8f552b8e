"""The node's live event feed: what it publishes, and `GET /api/v1/events` (SSE).

Publishing happens where node state changes, in the node's own thread: a job created
or updated (`JobStore`'s listener), a peer that joined, changed or left (`watch_peers`
compares the peer table twice a second), a ledger entry appended (`PublishingLedger`
wraps the node's ledger), a policy, load or capacity change (`Node`). Events reach the
HTTP side only through `node.net.bridge.EventFeed`.

Event kinds and their `data` (JSON):

- `job`: `{id, name, state, mode, worker, reason, progress, point}`, where `progress`
  is `{phase, step, total_steps, fraction, loss, samples_per_s}` and `point` the
  newest loss point `[step, loss, val_loss]` (or null);
- `peer`: `{change: "joined" | "updated" | "left", peer_id, tflops, load, accepting,
  stale}` (only `change` and `peer_id` for "left");
- `ledger`: `{seq, kind, job_id, unit_id, worker, owner, credit}`;
- `status`: `{load, policy, tflops}`.

Each stream also gets `hello` first (`{peer_id, boot}`; a new `boot` means the node
restarted), `tick` every `heartbeat` seconds (`{t}`; it keeps proxies and the
connection alive), and `lagged` (`{dropped}`) when its queue overflowed: the client
missed events and should fetch the state again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import trio
from aiohttp import web

from node.net.bridge import EventFeed, FeedClosed, TooManySubscribers

log = logging.getLogger(__name__)

KINDS = ("job", "peer", "ledger", "status")
HEARTBEAT_S = 15.0
RETRY_MS = 1000  # how soon a browser reconnects after the stream breaks
PEER_WATCH_S = 0.5


class NodeEvents:
    """Builds and publishes the node's events (called in the node's thread)."""

    def __init__(self, feed: EventFeed) -> None:
        self.feed = feed

    def job(self, job: Any) -> None:
        if not self.feed.has_subscribers:
            return  # nobody listens: skip building the event
        progress = job.progress or {}
        history = progress.get("history") or []
        self.feed.publish(
            "job",
            {
                "id": job.id,
                "name": job.name,
                "state": job.state,
                "mode": job.mode,
                "worker": job.worker,
                "reason": job.reason,
                "progress": {
                    k: progress.get(k)
                    for k in ("phase", "step", "total_steps", "fraction", "loss", "samples_per_s")
                },
                "point": history[-1] if history else None,
            },
        )

    def status(self, load: int, policy: dict[str, Any], tflops: float) -> None:
        self.feed.publish("status", {"load": load, "policy": policy, "tflops": tflops})

    def ledger(self, entry: Any) -> None:
        self.feed.publish(
            "ledger",
            {
                "seq": entry.seq,
                "kind": entry.kind,
                "job_id": entry.job_id,
                "unit_id": entry.unit_id,
                "worker": entry.worker,
                "owner": entry.owner,
                "credit": entry.credit,
            },
        )

    def peer(self, change: str, peer_id: str, entry: Any = None) -> None:
        data: dict[str, Any] = {"change": change, "peer_id": peer_id}
        if entry is not None:
            data.update(
                tflops=entry.ad.tflops,
                load=entry.ad.load_pct,
                accepting=entry.ad.policy.accepting,
                stale=entry.stale,
            )
        self.feed.publish("peer", data)


def _peer_marks(peers: Any) -> dict[str, tuple]:
    return {e.ad.peer_id: (e.ad.seq, e.stale) for e in peers.entries()}


async def watch_peers(
    peers: Any,
    events: NodeEvents,
    interval: float = PEER_WATCH_S,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Publish `peer` events for joins, newer ads and departures in the peer table."""
    known = _peer_marks(peers)
    task_status.started()
    while True:
        await trio.sleep(interval)
        now = _peer_marks(peers)
        if now == known:
            continue
        for peer_id, mark in now.items():
            if known.get(peer_id) != mark:
                change = "updated" if peer_id in known else "joined"
                events.peer(change, peer_id, peers.get(peer_id))
        for peer_id in known.keys() - now.keys():
            events.peer("left", peer_id)
        known = now


class PublishingLedger:
    """The node's `Ledger`, publishing a `ledger` event after every append."""

    def __init__(self, ledger: Any, events: NodeEvents) -> None:
        self._ledger = ledger
        self._events = events

    def append_work(self, *args: Any, **kwargs: Any) -> Any:
        entry = self._ledger.append_work(*args, **kwargs)
        self._events.ledger(entry)
        return entry

    def append_rejected(self, *args: Any, **kwargs: Any) -> Any:
        entry = self._ledger.append_rejected(*args, **kwargs)
        self._events.ledger(entry)
        return entry

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)


# -- the SSE endpoint (HTTP side) ----------------------------------------------------------


def sse_message(kind: str, data: str, event_id: str = "") -> bytes:
    """One server-sent event; `data` is JSON text (one line)."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: {data}\n\n".encode()


def _kinds_param(request: web.Request) -> frozenset[str]:
    raw = request.query.get("kinds")
    if raw is None:
        return frozenset(KINDS)
    kinds = {k.strip() for k in raw.split(",") if k.strip()}
    unknown = sorted(kinds - set(KINDS))
    if not kinds or unknown:
        raise web.HTTPBadRequest(
            text=f"'kinds' must be a comma-separated list of {', '.join(KINDS)}; got {raw[:80]!r}"
        )
    return frozenset(kinds)


def _heartbeat_param(request: web.Request, default: float) -> float:
    raw = request.query.get("heartbeat")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 60:  # also false for nan
        raise web.HTTPBadRequest(text=f"'heartbeat' must be 1..60 seconds, got {raw[:40]!r}")
    return value


def event_routes(
    feed: EventFeed, peer_id: str, heartbeat_s: float = HEARTBEAT_S
) -> Callable[[web.Application], None]:
    """`GET /api/v1/events[?kinds=job,peer][&heartbeat=S]`: the feed as text/event-stream."""

    async def events(request: web.Request) -> web.StreamResponse:
        kinds = _kinds_param(request)
        heartbeat = _heartbeat_param(request, heartbeat_s)
        try:
            subscription = feed.subscribe()
        except TooManySubscribers as exc:
            raise web.HTTPServiceUnavailable(text=str(exc)) from exc
        except FeedClosed as exc:
            raise web.HTTPServiceUnavailable(text="the node is shutting down") from exc
        with subscription:
            response = web.StreamResponse(
                headers={
                    "Content-Type": "text/event-stream; charset=utf-8",
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                }
            )
            await response.prepare(request)
            hello = json.dumps({"peer_id": peer_id, "boot": feed.boot})
            await response.write(f"retry: {RETRY_MS}\n".encode() + sse_message("hello", hello))
            try:
                while True:
                    event = await subscription.next(heartbeat)
                    dropped = subscription.take_dropped()
                    if dropped:
                        lagged = json.dumps({"dropped": dropped})
                        await response.write(sse_message("lagged", lagged))
                    if event is None:
                        tick = json.dumps({"t": round(time.time(), 3)})
                        await response.write(sse_message("tick", tick))
                    elif event.kind in kinds:
                        ident = f"{feed.boot}-{event.seq}"
                        await response.write(sse_message(event.kind, event.data, ident))
            except (FeedClosed, ConnectionResetError):
                pass  # the server stops, or the client went away
        return response

    async def close_feed(app: web.Application) -> None:
        feed.close()  # open streams end now rather than at the shutdown timeout

    def add(app: web.Application) -> None:
        app.router.add_get("/api/v1/events", events)
        app.on_shutdown.append(close_feed)

    return add
