"""Stopping the node within a bound, whatever the machine is doing.

SIGINT or SIGTERM starts the stop. Each step of it runs under its own deadline
(`Shutdown.step`): a step still running then is abandoned, logged, and the next one
starts. Behind the steps stands a watchdog thread: if the process is still there
`SHUTDOWN_S` after the signal (a step that cannot be cancelled, a shielded wait, a
machine so loaded that the steps themselves crawl), it kills the runner subprocesses'
process groups, logs what the stop was waiting on, and ends the process at once with
code 0 (what the node keeps is in SQLite, whose transactions survive that).

A stop that finishes ends the process with `exit_now` instead of returning through
the interpreter's teardown: freeing torch's and every other module's objects took
3-6 s of CPU time on a loaded 2-core machine after `node stopped` was logged, and
nothing there is needed once the stores are closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

import trio

log = logging.getLogger(__name__)

SHUTDOWN_S = 10.0  # from the signal to the process's exit, at most


class Shutdown:
    """The stop of one node: `requested` is set by the first SIGINT/SIGTERM (see
    `watch`), which also arms the watchdog; `step` bounds each part of the stop;
    `finished` disarms the watchdog."""

    def __init__(self, deadline_s: float = SHUTDOWN_S) -> None:
        self.deadline_s = deadline_s
        self.requested = trio.Event()
        self.doing = "starting"  # what the stop waits on now, for the watchdog's log line
        self.runner_pids: Callable[[], Iterable[int]] = tuple  # killed by the watchdog
        self.exit: Callable[[int], Any] = exit_now  # what the watchdog ends the process with
        self._finished = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._watching = trio.CancelScope()

    async def watch(self, signals: Any) -> None:
        """Read SIGINT/SIGTERM from `signals` (`trio.open_signal_receiver`) until
        `finished`: the first one requests the stop, later ones are only logged."""
        with self._watching:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.requested.is_set():
                    log.info("received %s; already shutting down (%s)", name, self.doing)
                    continue
                log.info("received %s, shutting down", name)
                self.request()

    def request(self) -> None:
        """Start the stop (from the trio thread): wake `requested`, arm the watchdog."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch_deadline, name="shutdown-watchdog", daemon=True
            )
            self._watchdog.start()
        self.requested.set()

    async def step(
        self, what: str, seconds: float, fn: Callable[..., Awaitable[Any]], *args: Any
    ) -> bool:
        """Run `fn(*args)` for at most `seconds`, shielded from the cancellation of the
        scopes around it (a stop after a crash still stops the HTTP server); False when
        it was abandoned."""
        self.doing = what
        with trio.CancelScope(shield=True, deadline=trio.current_time() + seconds) as scope:
            await fn(*args)
        if scope.cancelled_caught:
            log.warning("shutdown: %s abandoned after %.1f s", what, seconds)
            return False
        return True

    def finished(self) -> None:
        """The stop is done (or the node left otherwise): no watchdog, no watching."""
        self._finished.set()
        self._watching.cancel()

    def _watch_deadline(self) -> None:
        if self._finished.wait(self.deadline_s):
            return
        killed = kill_process_groups(self.runner_pids)
        log.error(
            "node stopped: the shutdown was cut short after %.0f s while %s%s",
            self.deadline_s,
            self.doing,
            f"; {killed} runner process(es) killed" if killed else "",
        )
        self.exit(0)


async def in_thread(fn: Callable[..., Any], *args: Any) -> None:
    """`fn(*args)` in a worker thread, left to itself if the step's deadline passes."""
    await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def kill_process_groups(pids: Callable[[], Iterable[int]]) -> int:
    """SIGKILL the process group of each pid `pids()` gives (the runners lead their own
    groups), continued first in case the duty cycle had stopped it; from any thread.
    Returns how many were signalled."""
    for _ in range(3):  # the trio thread may change the set while it is copied
        try:
            groups = tuple(pids())
            break
        except RuntimeError:
            continue
    else:
        return 0
    killed = 0
    for pid in groups:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
                killed += sig == signal.SIGKILL
    return killed


def exit_now(code: int) -> NoReturn:
    """End the process now, without the interpreter's teardown: the log handlers and
    the standard streams are flushed first."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
