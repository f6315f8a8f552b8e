"""Running one unit of training in its own subprocess (`python -m training.runner`).

The subprocess gets the request on stdin and reports JSON lines on stdout. A crash,
a hostile spec or a timeout ends the subprocess and fails the unit; the daemon
carries on. Its stderr goes to a file in the unit's folder for the post-mortem.

The runner starts in a session of its own (its process group is killed as a whole),
with a clean environment and the unit's folder as its working directory and home,
and isolates itself before it reads the spec (`training.isolation`: dies with the
daemon, rlimits, no network, no access to the node's files). Here, beside it:
- the **duty cycle**: the runner trains at most `duty_cycle()` percent of the time,
  stopped and continued (SIGSTOP/SIGCONT on its process group) every
  `DUTY_PERIOD_S`; read again every period, so a change applies while it runs;
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from protocol import encode
from training.runner import SPARE_UNSAFE

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
DUTY_PERIOD_S = 1.0
DISK_CHECK_S = 2.0
SPARE_IDLE_S = 600.0  # a spare runner waits this long for a task, then leaves
#: what the runner inherits from the daemon's environment (thread counts, devices)
PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "CUDA_VISIBLE_DEVICES",
              "TRITON_INTERPRET")  # fmt: skip


class UnitFailed(Exception):
    """The training subprocess did not produce a result; the message says why."""


async def run_training(
    request: dict[str, Any],
    workdir: Path,
    time_limit_s: float,
    on_event: Callable[[dict[str, Any]], None],
    *,
    duty_cycle: Callable[[], float] = lambda: 100.0,
    disk_quota_bytes: int = 0,
    spare_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the runner on `request`; returns its `result` event or raises UnitFailed.

    With `spare_dir`, a spare runner is started there for the next task (see
    `_start_spare`); a task takes the spare when one is ready, whatever its caller."""
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stderr_path = workdir / "stderr.log"
    request = {
        **request,
        "isolation": {
            "cpu_seconds": int(time_limit_s * (os.cpu_count() or 1)) + 60,
            "disk_quota_bytes": disk_quota_bytes,
            "parent_pid": os.getpid(),
        },
    }
    result: dict[str, Any] | None = None
    error = ""
    over_quota: list[str] = []
    runner = _take_spare(stderr_path) or await _start(workdir, stderr_path)
    proc, stdin, stdout = runner.proc, runner.stdin, runner.stdout
    try:
        if spare_dir is not None:
            await _start_spare(spare_dir)
        with trio.move_on_after(time_limit_s) as deadline:
            async with trio.open_nursery() as watchers:
                watchers.start_soon(_duty_cycle, proc, duty_cycle)
                if disk_quota_bytes:
                    watchers.start_soon(_disk_quota, proc, workdir, disk_quota_bytes, over_quota)
                async with stdin:
                    await stdin.send_all(encode(request))
                async for event in _json_lines(stdout):
                    kind = event.get("event")
                    if kind == "result":
                        result = event
                    elif kind == "error":
                        error = str(event.get("message", ""))[:2000]
                    elif kind == "isolation":
                        log.info("runner isolation: %s", event)
                    else:
                        on_event(event)
                await _wait(proc)
                watchers.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise UnitFailed(f"time limit of {time_limit_s / 3600:.2f} h exceeded")
    finally:
        _kill_group(proc)
        with trio.CancelScope(shield=True):
            await _wait(proc)
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
    proc: subprocess.Popen
    stdin: trio.lowlevel.FdStream
    stdout: trio.lowlevel.FdStream
    stderr_path: Path
    started: float = field(default_factory=time.monotonic)

    def discard(self) -> None:
        _kill_group(self.proc)
        self.proc.wait()
        for stream in (self.stdin, self.stdout):
            stream.close()


async def _start(cwd: Path, stderr_path: Path, spare_args: list[str] | None = None) -> _Runner:
    global _spawner
    if _spawner is None:
        _spawner = _Spawner()
    env = runner_env(cwd)
    args = [sys.executable, "-m", "training.runner"]
    if spare_args is not None:
        args += ["--spare", *spare_args]
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # see training.runner._wait_as_spare
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    with open(stderr_path, "wb") as stderr:
        popen = functools.partial(
            subprocess.Popen,
            args,
            stdin=stdin_r,
            stdout=stdout_w,
            stderr=stderr.fileno(),
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        try:
            proc = await trio.to_thread.run_sync(_spawner.spawn, popen)
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
    return _Runner(
        proc, trio.lowlevel.FdStream(stdin_w), trio.lowlevel.FdStream(stdout_r), stderr_path
    )


# The spare runner of this trio run (one node), or None; False once a spare proved
# unusable here (`training.runner.SPARE_UNSAFE`), so none is started again.
_spare: trio.lowlevel.RunVar[_Runner | None | bool] = trio.lowlevel.RunVar("spare", None)


async def _start_spare(folder: Path) -> None:
    """Start a runner that imports torch and waits (`training.runner --spare`), so the
    next task here does not pay a process start and the imports: about 1 s of CPU,
    more on a loaded machine. One at a time; it leaves by itself after SPARE_IDLE_S."""
    if _spare.get() is not None:
        return
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    spare_args = [str(os.getpid()), str(SPARE_IDLE_S)]
    _spare.set(await _start(folder, folder / f"spare-{time.time_ns()}.log", spare_args))


def _take_spare(stderr_path: Path) -> _Runner | None:
    """The spare, if one is alive and not about to leave; its stderr moves to
    `stderr_path`."""
    spare = _spare.get()
    if not isinstance(spare, _Runner):
        return None
    _spare.set(None)
    alive = spare.proc.poll() is None
    if alive and time.monotonic() - spare.started < SPARE_IDLE_S - 30:
        os.replace(spare.stderr_path, stderr_path)
        return spare
    spare.discard()
    if spare.proc.returncode == SPARE_UNSAFE:
        tail = spare.stderr_path.read_bytes()[-500:].decode(errors="replace").strip()
        log.warning("spare runners are off on this machine: %s", tail)
        _spare.set(False)
    spare.stderr_path.unlink(missing_ok=True)
    return None


async def _wait(proc: subprocess.Popen) -> int:
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
        proc.wait()
    return proc.returncode


def runner_env(workdir: Path) -> dict[str, str]:
    """A clean environment: nothing of the daemon's but thread counts and devices."""
    project = str(Path(__file__).resolve().parents[2])
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


def _kill_group(proc: subprocess.Popen) -> None:
    """The runner and everything it started: continued (if stopped), then killed."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


async def _duty_cycle(proc: subprocess.Popen, percent: Callable[[], float]) -> None:
    while True:
        share = min(100.0, max(1.0, float(percent()))) / 100
        if share >= 1.0:
            await trio.sleep(DUTY_PERIOD_S)
            continue
        await trio.sleep(DUTY_PERIOD_S * share)
        try:
            os.killpg(proc.pid, signal.SIGSTOP)
            try:
                await trio.sleep(DUTY_PERIOD_S * (1 - share))
            finally:
                os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return


async def _disk_quota(proc: subprocess.Popen, workdir: Path, quota: int, over: list[str]) -> None:
    while True:
        await trio.sleep(DISK_CHECK_S)
        used = await trio.to_thread.run_sync(folder_bytes, workdir)
        if used > quota:
            over.append(
                f"the unit wrote {used >> 20} MiB, over its disk quota of {quota >> 20} MiB"
            )
            _kill_group(proc)
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
