"""Running one unit of training in its own subprocess (`python -m training.run.runner`).

The subprocess gets the request on stdin and reports JSON lines on stdout. A crash,
a hostile spec or a timeout ends the subprocess and fails the unit; the daemon
carries on. Its stderr goes to a file in the unit's folder for the post-mortem.

The runner starts in a session of its own (its process group is killed as a whole),
with a clean environment and the unit's folder as its working directory and home,
and isolates itself before it reads the spec (`training.run.isolation`: dies with the
daemon, rlimits, no network, no access to the node's files). Here, beside it:
- the **duty cycle**: the runner trains at most `duty_cycle()` percent of the time,
  stopped and continued (SIGSTOP/SIGCONT on its process group) every
  `DUTY_PERIOD_S`; read again every period, so a change applies while it runs. At 0
  (the volunteer's preferences pause training) it stays stopped until allowed again,
  and the time it waits does not count against its time limit;
- the **disk quota**: the unit's folder is measured every `DISK_CHECK_S`; over quota,
  the runner is killed and the unit fails saying so (RLIMIT_FSIZE backs it up).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.work.run.forks import ForkedRunner, ForkServer, ForkServerGone
from node.work.run.request import RunnerRequest
from protocol import encode
from training.run.forkserver import UNSAFE

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
DUTY_PERIOD_S = 1.0
PAUSE_CHECK_S = 0.25  # how soon a paused runner continues once allowed
DISK_CHECK_S = 2.0
#: what the runner inherits from the daemon's environment (thread counts, devices)
PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "CUDA_VISIBLE_DEVICES",
              "TRITON_INTERPRET")  # fmt: skip


class UnitFailed(Exception):
    """The training subprocess did not produce a result; the message says why."""


async def run_training(
    request: RunnerRequest,
    workdir: Path,
    time_limit_s: float,
    on_event: Callable[[dict[str, Any]], None],
    *,
    duty_cycle: Callable[[], float] = lambda: 100.0,
    disk_quota_bytes: int = 0,
    warm_dir: Path | None = None,
    pids: set[int] | None = None,
) -> dict[str, Any]:
    """Run the runner on `request`; returns its `result` event or raises UnitFailed.

    With `warm_dir`, the runner is forked from the node's fork server, started there
    when none runs (`warm_runners`); without, or when the server cannot fork,
    it is a fresh process. `pids` holds the runner's pid while it runs."""
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stderr_path = workdir / "stderr.log"
    result: dict[str, Any] | None = None
    error = ""
    over_quota: list[str] = []
    runner = None
    if warm_dir is not None:
        await warm_runners(warm_dir)
        runner = await _fork(workdir, stderr_path)
    runner = runner or await _start(workdir, stderr_path)
    proc, stdin, stdout = runner.proc, runner.stdin, runner.stdout
    pids = set() if pids is None else pids
    pids.add(proc.pid)
    plain = {
        **request.as_plain(),
        "isolation": {
            "cpu_seconds": int(time_limit_s * (os.cpu_count() or 1)) + 60,
            "disk_quota_bytes": disk_quota_bytes,
            "parent_pid": runner.parent_pid,  # the runner dies with it
        },
    }
    try:
        with trio.move_on_after(time_limit_s) as deadline:
            async with trio.open_nursery() as watchers:
                watchers.start_soon(_duty_cycle, proc, duty_cycle, deadline)
                if disk_quota_bytes:
                    watchers.start_soon(_disk_quota, proc, workdir, disk_quota_bytes, over_quota)
                async with stdin:
                    await stdin.send_all(encode(plain))
                async for event in _json_lines(stdout):
                    kind = event.get("event")
                    if kind == "result":
                        result = event
                    elif kind == "error":
                        error = str(event.get("message", ""))[:2000]
                    elif kind == "isolation":
                        log.info("runner isolation: %s", event)
                    elif kind == "note":  # no CUDA where a GPU is, a limit not applied
                        log.warning("runner: %s", str(event.get("message", ""))[:500])
                    else:
                        on_event(event)
                await wait_exited(proc)
                watchers.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise UnitFailed(f"time limit of {time_limit_s / 3600:.2f} h exceeded")
    finally:
        pids.discard(proc.pid)
        kill_group(proc)
        with trio.CancelScope(shield=True):
            await wait_exited(proc)
            await stdout.aclose()
    if over_quota:
        raise UnitFailed(over_quota[0])
    if proc.returncode == -signal.SIGXFSZ:
        raise UnitFailed(
            f"the unit wrote a file over its disk quota of {disk_quota_bytes >> 20} MiB"
        )
    if proc.returncode == 0 and result is not None:
        return result
    if not error:
        tail = stderr_path.read_bytes()[-1500:].decode(errors="replace").strip()
        error = f"training process exited with {proc.returncode}" + (f": {tail}" if tail else "")
    raise UnitFailed(error)


class _Spawner:
    """One thread, alive as long as the daemon, forks every runner.

    A child's parent-death signal fires when the *thread* that forked it ends, and
    trio's worker threads end after a few idle seconds: a runner forked there would be
    killed mid-training. Forked here, it is killed exactly when the daemon dies."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="runner-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def spawn(self, fn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future.result()


_spawner: _Spawner | None = None


@dataclass
class _Runner:
    proc: subprocess.Popen | ForkedRunner
    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    parent_pid: int  # the process it dies with: this node, or the fork server


async def _start(cwd: Path, stderr_path: Path) -> _Runner:
    """A fresh runner process."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    with open(stderr_path, "wb") as stderr:
        popen = functools.partial(
            subprocess.Popen,
            [sys.executable, "-m", "training.run.runner"],
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr.fileno(),
            cwd=cwd,
            env=runner_env(cwd),
            start_new_session=True,
        )
        try:
            proc = await trio.to_thread.run_sync(_spawn, popen)
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
    return _Runner(
        proc, trio.lowlevel.FdStream(stdin_w), trio.lowlevel.FdStream(stdout_r), os.getpid()
    )


def _spawn(popen: Callable[[], subprocess.Popen]) -> subprocess.Popen:
    global _spawner
    if _spawner is None:
        _spawner = _Spawner()
    return _spawner.spawn(popen)


# The fork server of this trio run (one node), or None; False once a server proved
# unusable here (`training.run.forkserver.UNSAFE`), so none is started again.
_forks: trio.lowlevel.RunVar[ForkServer | None | bool] = trio.lowlevel.RunVar("forks", None)
_starting: trio.lowlevel.RunVar[trio.Lock] = trio.lowlevel.RunVar("forks_lock")


async def warm_runners(folder: Path) -> None:
    """Start the fork server (`training.run.forkserver`) in `folder` when none runs, so
    the tasks to come start in milliseconds instead of 2-4 s of CPU. Returns once it is
    spawned; it imports torch meanwhile (a fork waits for that) and leaves by itself
    after `forks.IDLE_S` without a fork."""
    try:
        lock = _starting.get()
    except LookupError:
        lock = trio.Lock()
        _starting.set(lock)
    async with lock:  # two tasks at once start one server
        current = _forks.get()
        if current is False or (isinstance(current, ForkServer) and current.usable()):
            return
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = runner_env(folder)
        _forks.set(await trio.to_thread.run_sync(ForkServer.start, folder, env, _spawn))


def usable_fork_server() -> ForkServer | None:
    """This node's fork server, when one runs and will not leave before it is asked."""
    server = _forks.get()
    return server if isinstance(server, ForkServer) and server.usable() else None


async def _fork(cwd: Path, stderr_path: Path) -> _Runner | None:
    """A runner forked by the fork server, when one runs and answers."""
    server = _forks.get()
    if not isinstance(server, ForkServer):
        return None
    try:
        if not server.usable():
            raise ForkServerGone("the fork server has left")
        proc, stdin_w, stdout_r = await trio.to_thread.run_sync(server.fork, cwd, stderr_path)
    except ForkServerGone as exc:
        log.info("%s; starting a fresh runner", exc)
        await _drop(server)
        return None
    return _Runner(
        proc,
        trio.lowlevel.FdStream(stdin_w),
        trio.lowlevel.FdStream(stdout_r),
        server.proc.pid,
    )


async def _drop(server: ForkServer) -> None:
    """Let a server that failed us go (its runners still running finish first); none
    is started again if it had threads."""
    server.close()
    with contextlib.suppress(subprocess.TimeoutExpired):  # gone, or leaving in its time
        await trio.to_thread.run_sync(functools.partial(server.proc.wait, timeout=1))
    if server.proc.returncode == UNSAFE:
        log.warning("runners start fresh on this machine: the fork server had threads")
    _forks.set(False if server.proc.returncode == UNSAFE else None)


async def wait_exited(proc: subprocess.Popen | ForkedRunner) -> int:
    """Wait for the runner without a thread: its pidfd turns readable when it exits."""
    if proc.returncode is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            pidfd = -1
        if pidfd >= 0:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        if isinstance(proc, ForkedRunner):  # its status comes from the fork server
            await trio.to_thread.run_sync(proc.wait)
        else:
            proc.wait()
    return proc.returncode


def runner_env(workdir: Path) -> dict[str, str]:
    """A clean environment: nothing of the daemon's but thread counts and devices."""
    project = str(Path(__file__).resolve().parents[3])
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONPATH": project,
        "PYTHONNOUSERSITE": "1",
    }
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    return env


def kill_group(proc: subprocess.Popen | ForkedRunner) -> None:
    """The runner and everything it started: continued (if stopped), then killed."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


async def _duty_cycle(
    proc: subprocess.Popen | ForkedRunner,
    percent: Callable[[], float],
    limit: trio.CancelScope | None = None,
) -> None:
    while True:
        share = min(100.0, max(0.0, float(percent()))) / 100
        try:
            if share <= 0:
                await _paused(proc, percent, limit)
            elif share >= 1.0:
                await trio.sleep(DUTY_PERIOD_S)
            else:
                await trio.sleep(DUTY_PERIOD_S * share)
                os.killpg(proc.pid, signal.SIGSTOP)
                try:
                    await trio.sleep(DUTY_PERIOD_S * (1 - share))
                finally:
                    os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return


async def _paused(
    proc: subprocess.Popen | ForkedRunner,
    percent: Callable[[], float],
    limit: trio.CancelScope | None,
) -> None:
    """Stopped until `percent()` allows training again; the time limit (`limit`'s
    deadline) moves on by the time it waited."""
    stopped_at = trio.current_time()
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        while percent() <= 0:
            await trio.sleep(PAUSE_CHECK_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        if limit is not None:
            limit.deadline += trio.current_time() - stopped_at


async def _disk_quota(
    proc: subprocess.Popen | ForkedRunner, workdir: Path, quota: int, over: list[str]
) -> None:
    while True:
        await trio.sleep(DISK_CHECK_S)
        used = await trio.to_thread.run_sync(folder_bytes, workdir)
        if used > quota:
            kill_group(proc)
            evidence = await trio.to_thread.run_sync(folder_bytes, workdir / "checkpoints")
            why = ""
            if evidence > used // 2:  # say what a user can change
                why = (
                    f"; {evidence >> 20} MiB of it are checkpoints kept as evidence for spot "
                    "checks (fewer with a smaller trust.checkpoints, none with 0)"
                )
            over.append(
                f"the unit wrote {used >> 20} MiB, over its disk quota of {quota >> 20} MiB{why}"
            )
            return


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_blocks * 512
    return total


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
