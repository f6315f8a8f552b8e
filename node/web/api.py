"""The local HTTP API (aiohttp). Handlers ask the node for state through the bridge.

Reads are open. Writes need the node's API token (``Authorization: Bearer ...``,
from `api.token` in the data dir) unless the server is bound to loopback. Writes from a
web page of another origin are refused (a browser says where a request comes from in
`Origin`), and on a loopback bind so are writes whose `Host` is not a loopback name,
so that no web site can write to a local node through the visitor's browser.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from aiohttp import web
from yarl import URL

from node.net.bridge import BridgeClosed, TrioBridge

log = logging.getLogger(__name__)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class NodeState(Protocol):
    """What the API needs from the node; every method runs in the trio thread."""

    def status(self) -> dict[str, Any]: ...
    def peers(self) -> list[dict[str, Any]]: ...
    def metrics(self) -> bytes: ...
    async def refresh_capacity(self) -> dict[str, Any]: ...
    def set_policy(self, changes: dict[str, Any]) -> dict[str, Any]: ...


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, or a 400 that says what is wrong with it."""
    try:
        body = await request.json()
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    return body


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.text or exc.reason)
    except BridgeClosed:
        return json_error(503, "the node is shutting down")
    except Exception:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return json_error(500, "internal error; see the node log")


class WriteGuard:
    """Writes are open on a loopback bind; otherwise they need the node's API token."""

    def __init__(self, token: str, bind_host: str) -> None:
        self._token = token.encode()
        self.open = is_loopback(bind_host)

    def check(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(
                text=f"write refused: a page from another origin ({origin[:100]}) cannot "
                "change this node"
            )
        if self.open:
            if not is_loopback(_host_name(request.host)):
                raise web.HTTPForbidden(
                    text="write refused: this node's API is bound to loopback and takes writes "
                    f"only for a loopback Host, not {request.host[:100]!r}"
                )
            return
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), self._token):
            raise web.HTTPUnauthorized(
                text="this node's API is not bound to loopback: writes need "
                "'Authorization: Bearer <token>' with the token from api.token in its data dir"
            )


def _host_name(host: str) -> str:
    try:
        return URL(f"http://{host}").host or ""
    except ValueError:
        return ""


def make_app(
    node: NodeState,
    bridge: TrioBridge,
    guard: WriteGuard,
    extra_routes: Sequence[Callable[[web.Application], None]] = (),
) -> web.Application:
    """The node's HTTP app; `extra_routes` adds feature routes (jobs, ...)."""

    async def status(request: web.Request) -> web.Response:
        return web.json_response(await bridge.call(node.status))

    async def peers(request: web.Request) -> web.Response:
        return web.json_response(await bridge.call(node.peers))

    async def metrics(request: web.Request) -> web.Response:
        body = await bridge.call(node.metrics)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def refresh_capacity(request: web.Request) -> web.Response:
        guard.check(request)
        return web.json_response(await bridge.call_async(node.refresh_capacity))

    async def set_policy(request: web.Request) -> web.Response:
        guard.check(request)
        body = await json_body(request)
        try:
            return web.json_response(await bridge.call(node.set_policy, body))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc

    async def not_found(request: web.Request) -> web.Response:
        return json_error(404, f"no such endpoint: {request.method} {request.path}")

    app = web.Application(middlewares=[_errors], client_max_size=1 << 20)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/peers", peers)
    app.router.add_post("/api/v1/capacity/refresh", refresh_capacity)
    app.router.add_put("/api/v1/policy", set_policy)
    app.router.add_get("/metrics", metrics)
    for add_routes in extra_routes:
        add_routes(app)
    app.router.add_route("*", "/api/{tail:.*}", not_found)
    return app
