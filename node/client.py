"""A small client for a node's HTTP API, used by the CLI and the demo."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

DEFAULT_API = "http://127.0.0.1:8470"


class NodeUnreachable(Exception):
    """No node answered at the API URL."""


class ApiError(Exception):
    """The node answered with an error; the message is the node's."""


def api_url(cli_value: str | None) -> str:
    return (cli_value or os.environ.get("MESHMINER_API") or DEFAULT_API).rstrip("/")


def get_json(api: str, path: str, timeout: float = 5.0) -> Any:
    return request_json(api, "GET", path, timeout=timeout)


def request_json(
    api: str,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = None,
    timeout: float = 5.0,
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{api}{path}", data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise ApiError(f"{method} {path}: {exc.code} {message}") from exc
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise NodeUnreachable(
            f"no meshminer node is answering at {api} ({getattr(exc, 'reason', exc)}).\n"
            "Start one with `meshminer node run`, or point at another with --api URL "
            "(or MESHMINER_API)."
        ) from exc
