"""The local HTTP API (aiohttp). Handlers ask the node for state through the bridge.

Who may ask (`AccessGuard`, a middleware in front of every route):
- bound to loopback: only requests whose `Host` is a loopback name, so a web site
  that rebinds its DNS name to 127.0.0.1 gets nothing from the visitor's browser;
  reads and writes need no token (every local user can read them);
- bound to anything else: every request, reads included (weights and specs are
  private), needs the node's API token, as ``Authorization: Bearer <token>`` or as
  the `meshminer_token` cookie the `/login` page sets (HttpOnly, SameSite=Strict);
- everywhere: writes from a web page of another origin are refused (`Origin`).
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
    def reputation(self) -> list[dict[str, Any]]: ...
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


TOKEN_COOKIE = "meshminer_token"
#: reachable without the token on a non-loopback bind: nothing private in them
PUBLIC_PATHS = ("/login", "/static/")


class WriteGuard:
    """Who may read and write (see the module docstring): `middleware` checks every
    request; `check` is what a write handler adds on top (the origin)."""

    def __init__(self, token: str, bind_host: str) -> None:
        self._token = token.encode()
        self.open = is_loopback(bind_host)

    def token_ok(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self._token)

    def _admit(self, request: web.Request) -> None:
        if self.open:
            if not is_loopback(_host_name(request.host)):
                raise web.HTTPForbidden(
                    text="refused: this node's API is bound to loopback and answers only "
                    f"requests for a loopback Host, not {request.host[:100]!r}"
                )
            return
        if request.path.startswith(PUBLIC_PATHS):
            return
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if self.token_ok(given) or self.token_ok(request.cookies.get(TOKEN_COOKIE, "")):
            return
        if request.method == "GET" and not request.path.startswith(("/api/", "/metrics")):
            raise web.HTTPSeeOther(location="/login")  # a page: ask for the token
        raise web.HTTPUnauthorized(
            text="this node's API is not bound to loopback: every request needs "
            "'Authorization: Bearer <token>' with the token from api.token in its data dir"
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        self._admit(request)
        return await handler(request)

    def check(self, request: web.Request) -> None:
        """A write: refused from a page of another origin (on top of `middleware`)."""
        origin = request.headers.get("Origin")
        if origin is not None and origin.rstrip("/") != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(
                text=f"write refused: a page from another origin ({origin[:100]}) cannot "
                "change this node"
            )


_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>meshminer: sign in</title>
<link rel="stylesheet" href="/static/app.css"></head>
<body><main><h1>This node asks for its API token</h1>
<p>It is not bound to loopback, so every page and API call needs the token in
<code>api.token</code> in its data dir (<code>cat DATA_DIR/api.token</code>).</p>
{message}
<form method="post" action="/login"><label>Token
<input name="token" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button></form></main></body></html>
"""


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

    async def find_peers(request: web.Request) -> web.Response:
        try:
            return web.json_response(await bridge.call_async(node.find_peers, dict(request.query)))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from exc

    async def registrations(request: web.Request) -> web.Response:
        try:
            return web.json_response(await bridge.call(node.registrations))
        except LookupError as exc:
            raise web.HTTPNotFound(text=str(exc)) from exc

    async def reputation(request: web.Request) -> web.Response:
        return web.json_response(await bridge.call(node.reputation))

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

    async def login_form(request: web.Request) -> web.Response:
        return web.Response(text=_LOGIN_PAGE.format(message=""), content_type="text/html")

    async def login(request: web.Request) -> web.Response:
        form = await request.post()
        given = str(form.get("token", "")).strip()
        if not guard.token_ok(given):
            page = _LOGIN_PAGE.format(message="<p>That is not this node's token.</p>")
            return web.Response(text=page, content_type="text/html", status=401)
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(
            TOKEN_COOKIE, given, httponly=True, samesite="Strict", secure=request.secure, path="/"
        )
        return response

    async def not_found(request: web.Request) -> web.Response:
        return json_error(404, f"no such endpoint: {request.method} {request.path}")

    app = web.Application(middlewares=[_errors, guard.middleware], client_max_size=1 << 20)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/peers", peers)
    app.router.add_get("/api/v1/peers/find", find_peers)
    app.router.add_get("/api/v1/directory", registrations)
    app.router.add_get("/api/v1/reputation", reputation)
    app.router.add_post("/api/v1/capacity/refresh", refresh_capacity)
    app.router.add_put("/api/v1/policy", set_policy)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    for add_routes in extra_routes:
        add_routes(app)
    app.router.add_route("*", "/api/{tail:.*}", not_found)
    return app
