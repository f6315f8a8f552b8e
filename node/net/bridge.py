"""The one seam between trio (py-libp2p, node state) and asyncio (aiohttp).

Node state lives in the trio thread and is touched only there. The HTTP server
runs on its own asyncio loop in its own thread and reaches node state through
`TrioBridge.call` / `call_async`, which schedule work on the trio loop and await the
answer without blocking either loop (~110 µs a round trip). The other direction is
`EventFeed`: the trio thread publishes events (job progress, peers, ledger, policy)
and each asyncio subscriber (a server-sent-events stream) receives them in a bounded
queue that drops its oldest events when the client lags. No other module knows that
there are two loops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from aiohttp import web

log = logging.getLogger(__name__)

T = TypeVar("T")


class BridgeClosed(RuntimeError):
    """The node is shutting down; nothing more can be asked of it."""


class TrioBridge:
    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery) -> None:
        self._token = token
        self._nursery = nursery

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function in the trio thread and return its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def run() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:
                _reply(loop, future, None, exc)
            else:
                _reply(loop, future, result, None)

        self._schedule(run)
        return await future

    async def call_async(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run a trio coroutine function in the node's nursery and return its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        async def run() -> None:
            try:
                result = await fn(*args)
            except BaseException as exc:
                _reply(loop, future, None, exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                _reply(loop, future, result, None)

        self._schedule(lambda: self._nursery.start_soon(run))
        return await future

    def _schedule(self, fn: Callable[[], None]) -> None:
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError as exc:
            raise BridgeClosed("the node is shutting down") from exc


def _reply(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, exc: BaseException | None
) -> None:
    """Hand a result from the trio thread to the asyncio loop, unless it has closed."""
    with contextlib.suppress(RuntimeError):  # the HTTP loop already shut down
        loop.call_soon_threadsafe(_settle, future, result, exc)


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc if isinstance(exc, Exception) else BridgeClosed(str(exc)))


@dataclass(frozen=True)
class Event:
    """One published event: `data` is JSON text, encoded once by the publisher."""

    seq: int
    kind: str
    data: str
    ts: float


class FeedClosed(RuntimeError):
    """The feed was closed (the HTTP server is stopping)."""


class TooManySubscribers(RuntimeError):
    """The feed has `max_subscribers` subscribers already."""


class EventFeed:
    """A broadcast from the trio thread to subscribers on the asyncio loop.

    `publish` may be called from any thread and never blocks: it encodes the event once
    and hands it to each subscriber's loop with `call_soon_threadsafe`. Each
    subscriber keeps at most `queue_size` events; when a slow client lets its queue
    fill, the oldest event is dropped and counted, so the reader can tell its client
    to fetch the state afresh. `boot` is random per feed (per node process), so a
    client can tell a restarted node from a reconnect to the same one.
    """

    def __init__(self, queue_size: int = 256, max_subscribers: int = 64) -> None:
        self.queue_size = queue_size
        self.max_subscribers = max_subscribers
        self.boot = secrets.token_hex(6)
        self._lock = threading.Lock()
        self._subscribers: set[Subscription] = set()
        self._seq = 0
        self._closed = False

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        """Send `data` (JSON-able, finite numbers) to every subscriber; any thread."""
        with self._lock:
            subscribers = tuple(self._subscribers)
            self._seq += 1
            seq = self._seq
        if not subscribers:
            return
        try:
            text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            log.warning("event %s not published: %s", kind, exc)
            return
        event = Event(seq, kind, text, time.time())
        for subscriber in subscribers:
            subscriber._deliver(event)

    def subscribe(self) -> Subscription:
        """A new subscriber on the running asyncio loop (use it as a context manager)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise FeedClosed("the event feed is closed")
            if len(self._subscribers) >= self.max_subscribers:
                raise TooManySubscribers(
                    f"{self.max_subscribers} event streams are open already; close one"
                )
            subscription = Subscription(self, loop, self.queue_size)
            self._subscribers.add(subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(subscription)

    def close(self) -> None:
        """End every subscription (their `next` raises `FeedClosed`); asyncio thread."""
        with self._lock:
            self._closed = True
            subscribers = tuple(self._subscribers)
        for subscription in subscribers:
            subscription.close()


class Subscription:
    """One subscriber's bounded queue; read it with `next` on its own loop."""

    def __init__(self, feed: EventFeed, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self._feed = feed
        self._loop = loop
        self._queue: collections.deque[Event] = collections.deque(maxlen=size)
        self._ready = asyncio.Event()
        self._closed = False
        self.dropped = 0  # events lost to a full queue since the last `take_dropped`

    def _deliver(self, event: Event) -> None:  # any thread
        with contextlib.suppress(RuntimeError):  # the HTTP loop already shut down
            self._loop.call_soon_threadsafe(self._push, event)

    def _push(self, event: Event) -> None:
        if self._closed:
            return
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1  # the deque drops the oldest
        self._queue.append(event)
        self._ready.set()

    async def next(self, timeout: float) -> Event | None:
        """The next event, or None after `timeout` seconds without one."""
        if not self._queue and not self._closed:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
        if self._closed:
            raise FeedClosed("the event feed is closed")
        return self._queue.popleft() if self._queue else None

    def take_dropped(self) -> int:
        dropped, self.dropped = self.dropped, 0
        return dropped

    def close(self) -> None:
        self._closed = True
        self._ready.set()
        self._feed._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HttpServerThread:
    """An aiohttp application served from its own thread and asyncio loop."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="http", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        """Start serving; raises OSError if the address cannot be bound."""
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"HTTP server on {self._host}:{self._port} did not start")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _serve(self) -> None:
        self._runner = web.AppRunner(
            self._app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()

    def stop(self, timeout: float = 3.0) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
