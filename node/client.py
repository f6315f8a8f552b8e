"""A small client for a node's HTTP API, used by the CLI and the demo."""

from __future__ import annotations

import json
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

DEFAULT_API = "http://127.0.0.1:8470"


class NodeUnreachable(Exception):
    """No node answered at the API URL."""


class ApiError(Exception):
    """The node answered with an error; the message is the node's."""


def api_url(cli_value: str | None) -> str:
    return (cli_value or os.environ.get("MESHMINER_API") or DEFAULT_API).rstrip("/")


READ_TIMEOUT_S = 15.0
WRITE_TIMEOUT_S = 120.0


def request_json(
    api: str,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = None,
    timeout: float | None = None,
) -> Any:
    """One API call; its JSON answer. A read waits `READ_TIMEOUT_S` by default, a write
    (a submission validates its spec first) `WRITE_TIMEOUT_S`: a busy node is slow, not
    gone."""
    if timeout is None:
        timeout = READ_TIMEOUT_S if method == "GET" else WRITE_TIMEOUT_S
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{api}{path}", data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return _send(req, api, f"{method} {path}", timeout)


def _send(req: urllib.request.Request, api: str, what: str, timeout: float) -> Any:
    """Send `req`; the JSON answer, or ApiError with the node's message, or NodeUnreachable."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise ApiError(f"{what}: {exc.code} {message}") from exc
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise NodeUnreachable(
            f"no meshminer node is answering at {api} ({getattr(exc, 'reason', exc)}).\n"
            "Start one with `meshminer node run`, or point at another with --api URL "
            "(or MESHMINER_API)."
        ) from exc


def submit_job(
    api: str,
    spec_text: str,
    data_file: Path | None,
    token: str | None = None,
    timeout: float = 600,
    files: dict[str, Path] | None = None,
    shards: Sequence[Path] = (),
) -> dict[str, Any]:
    """POST /api/v1/jobs as multipart/form-data: the spec TOML and, streamed, its data
    and any other `files` by form field (a program's `program` and `eval_program`).
    A sharded spec's files are `shards`, in `data.shards` order, sent as `shard0`,
    `shard1`, ... instead of `data_file`."""
    if shards and data_file is not None:
        raise ValueError("a job's data is one file or its shards, not both")
    boundary = f"meshminer-{secrets.token_hex(12)}"
    spec_part = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="spec"; '
            f'filename="spec.toml"\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n'
        ).encode()
        + spec_text.encode()
        + b"\r\n"
    )
    tail = f"--{boundary}--\r\n".encode()
    parts = {**({"data": data_file} if data_file is not None else {}), **shard_fields(shards)}
    parts.update(files or {})
    heads = {
        field: (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
            f'filename="{path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        for field, path in parts.items()
    }
    length = len(spec_part) + len(tail)
    length += sum(len(heads[f]) + path.stat().st_size + 2 for f, path in parts.items())

    def body() -> Iterator[bytes]:
        yield spec_part
        for field, path in parts.items():
            yield heads[field]
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk
            yield b"\r\n"
        yield tail

    req = urllib.request.Request(f"{api}/api/v1/jobs", data=body(), method="POST")
    req.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
    req.add_header("Content-Length", str(length))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return _send(req, api, "submit", timeout)


def shard_fields(shards: Sequence[Path]) -> dict[str, Path]:
    """The form field of each shard: `shard<k>` carries `data.shards[k]`."""
    return {f"shard{k}": path for k, path in enumerate(shards)}
