"""What the CLI's command modules share: consoles, common options, failing cleanly."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console

from node.client import ApiError, NodeUnreachable, api_url, request_json

T = TypeVar("T")

console = Console()
err = Console(stderr=True)

ApiOption = Annotated[
    str | None,
    typer.Option(
        "--api",
        help="node API URL [env MESHMINER_API; default http://127.0.0.1:8470]",
        show_default=False,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token for a node not bound to loopback [env MESHMINER_TOKEN; default "
        "api.token in the data dir, for an API on this machine]",
        show_default=False,
    ),
]
DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="data dir [env MESHMINER_DATA_DIR; default ~/.local/share/meshminer]",
        show_default=False,
    ),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` as an error; raise the returned Exit to end with `code`."""
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call the node's API; a node that is not there, or says no, ends the command."""
    try:
        return fn(*args, **kwargs)
    except (NodeUnreachable, ApiError) as exc:
        raise fail(str(exc)) from None


def token_for(api: str, given: str | None = None) -> str | None:
    """The token to send: --token, else $MESHMINER_TOKEN, else this user's own node's
    `api.token` (in $MESHMINER_DATA_DIR or the default data dir), but only to an API on
    this machine, so a node's token never travels to another host unasked."""
    if given or os.environ.get("MESHMINER_TOKEN"):
        return given or os.environ["MESHMINER_TOKEN"]
    from node.identity import TOKEN_FILE
    from node.settings import data_dir_from
    from node.web.api import is_loopback

    if not is_loopback(urlsplit(api).hostname or ""):
        return None
    try:
        return (data_dir_from(None) / TOKEN_FILE).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def get(api: str | None, path: str, timeout: float = 30) -> Any:
    """A read; a node not bound to loopback wants the token for reads too."""
    url = api_url(api)
    return call(request_json, url, "GET", path, token=token_for(url), timeout=timeout)


def short(peer_id: str) -> str:
    return f"{peer_id[:8]}…{peer_id[-6:]}" if peer_id else "-"
