"""What the CLI's command modules share: consoles, common options, failing cleanly."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

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
        help="API token for a node not bound to loopback [env MESHMINER_TOKEN]",
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


def get(api: str | None, path: str, timeout: float = 30) -> Any:
    """A read; a node not bound to loopback wants the token for reads too
    (`MESHMINER_TOKEN`)."""
    token = os.environ.get("MESHMINER_TOKEN") or None
    return call(request_json, api_url(api), "GET", path, token=token, timeout=timeout)


def short(peer_id: str) -> str:
    return f"{peer_id[:8]}…{peer_id[-6:]}" if peer_id else "-"
