"""The node's HTTP API: where it is, which token to send, and the requests this package makes.

Both are found as the `meshminer` CLI finds them, so a script and the CLI talk to the
same node: the URL is `api=`, else $MESHMINER_API, else http://127.0.0.1:8470; the token
is `token=`, else $MESHMINER_TOKEN, else the `api.token` file in the node's data dir
($MESHMINER_DATA_DIR, else ~/.local/share/meshminer), but that file only for an API on
this machine, so a node's token never travels to another host unasked.
"""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from meshminer.errors import NodeError, NodeUnreachable
from meshminer.multipart import Form

DEFAULT_API = "http://127.0.0.1:8470"
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "meshminer"
TOKEN_FILE = "api.token"


def api_url(api: str | None = None) -> str:
    """`api`, else $MESHMINER_API, else the default local node."""
    return (api or os.environ.get("MESHMINER_API") or DEFAULT_API).rstrip("/")


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine (a loopback name or address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_for(url: str, token: str | None = None) -> str | None:
    """The token to send to `url` (see the module docstring), or None."""
    if token or os.environ.get("MESHMINER_TOKEN"):
        return token or os.environ["MESHMINER_TOKEN"]
    if not is_loopback(urlsplit(url).hostname or ""):
        return None
    env_dir = os.environ.get("MESHMINER_DATA_DIR")
    data_dir = Path(env_dir).expanduser() if env_dir else DEFAULT_DATA_DIR
    try:
        return (data_dir / TOKEN_FILE).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class Connection:
    """A node's API URL and the token that goes with every request to it."""

    url: str
    token: str | None

    @classmethod
    def to(cls, api: str | None = None, token: str | None = None) -> Connection:
        url = api_url(api)
        return cls(url, token_for(url, token))

    def get_json(self, path: str, timeout: float = 30) -> Any:
        return json.loads(self._send(self._request("GET", path), timeout))

    def get_bytes(self, path: str, timeout: float = 300) -> bytes:
        return self._send(self._request("GET", path), timeout)

    def post_form(self, path: str, form: Form, timeout: float = 600) -> Any:
        """POST `form` as multipart/form-data, its files streamed; the JSON answer.
        The long default timeout covers a node checking a large upload before it answers."""
        request = self._request("POST", path, data=form.chunks())
        request.add_header("Content-Type", form.content_type)
        request.add_header("Content-Length", str(form.size))
        return json.loads(self._send(request, timeout))

    def _request(self, method: str, path: str, data: Any = None) -> urllib.request.Request:
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        return request

    def _send(self, request: urllib.request.Request, timeout: float) -> bytes:
        what = f"{request.get_method()} {urlsplit(request.full_url).path}"
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise NodeError(f"{what}: {exc.code} {_node_message(exc)}", exc.code) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise NodeUnreachable(
                f"no meshminer node answered at {self.url} ({getattr(exc, 'reason', exc)}). "
                "Start one with `meshminer node run`, or point at another with api=URL "
                "(or $MESHMINER_API)."
            ) from None


def _node_message(error: urllib.error.HTTPError) -> str:
    """The node's own words: its JSON errors are {"error": "...", "status": N}."""
    body = error.read()
    try:
        message = json.loads(body).get("error")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else (body.decode(errors="replace")[:500] or error.reason)
