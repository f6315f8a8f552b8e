"""The one seam between trio (py-libp2p, node state) and asyncio (aiohttp).

Node state lives in the trio thread and is touched only there. The HTTP server
runs on its own asyncio loop in its own thread and reaches node state through
`TrioBridge.call` / `call_async`, which schedule work on the trio loop and await the
answer without blocking either loop (~110 µs a round trip). No other module knows
that there are two loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
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
