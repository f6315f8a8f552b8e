"""Running one unit of training in its own subprocess (`python -m training.runner`).

The subprocess gets the request on stdin and reports JSON lines on stdout. A crash,
a hostile spec or a timeout ends the subprocess and fails the unit; the daemon
carries on. Its stderr goes to a file in the unit's folder for the post-mortem.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from protocol import encode

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024


class UnitFailed(Exception):
    """The training subprocess did not produce a result; the message says why."""


async def run_training(
    request: dict[str, Any],
    workdir: Path,
    time_limit_s: float,
    on_event: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run the runner on `request`; returns its `result` event or raises UnitFailed."""
    workdir.mkdir(parents=True, exist_ok=True)
    stderr_path = workdir / "stderr.log"
    result: dict[str, Any] | None = None
    error = ""
    with open(stderr_path, "wb") as stderr:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "training.runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            with trio.move_on_after(time_limit_s) as deadline:
                assert proc.stdin is not None and proc.stdout is not None
                await proc.stdin.send_all(encode(request))
                await proc.stdin.aclose()
                async for event in _json_lines(proc.stdout):
                    kind = event.get("event")
                    if kind == "result":
                        result = event
                    elif kind == "error":
                        error = str(event.get("message", ""))[:2000]
                    else:
                        on_event(event)
                await proc.wait()
            if deadline.cancelled_caught:
                raise UnitFailed(f"time limit of {time_limit_s / 3600:.2f} h exceeded")
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
    if proc.returncode == 0 and result is not None:
        return result
    if not error:
        tail = stderr_path.read_bytes()[-1500:].decode(errors="replace").strip()
        error = f"training process exited with {proc.returncode}" + (f": {tail}" if tail else "")
    raise UnitFailed(error)


async def _json_lines(stream: trio.abc.ReceiveStream):
    buffer = b""
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                event = json.loads(line)
            except ValueError:
                log.debug("runner printed a non-JSON line: %r", line[:200])
                continue
            if isinstance(event, dict):
                yield event
        if len(buffer) > MAX_LINE:
            raise UnitFailed("training process wrote an over-long line")
