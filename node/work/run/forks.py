"""The node's side of `training.run.forkserver`: a warm parent that forks runners.

`ForkServer.fork` hands the server a new runner's stdin, stdout and stderr and gets
back its pid; the runner is the server's child, not ours, so `ForkedRunner` stands
in for the `subprocess.Popen` the executor otherwise holds: its exit is seen through
a pidfd, its status asked of the server. Every call here blocks (briefly, except a
first fork while the server still imports torch): the executor makes them from a
worker thread or once the runner has exited.
"""

from __future__ import annotations

import array
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from training.run.forkserver import PID

IDLE_S = 600.0  # the server leaves after this long without a fork


class ForkServerGone(Exception):
    """The server exited or stopped answering; start runners fresh."""


class ForkedRunner:
    """What the executor uses of a `subprocess.Popen` (`pid`, `wait`, `returncode`),
    for a runner the server forked."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server

    def wait(self) -> int:
        if self.returncode is None:
            _exited(self.pid)
            self.returncode = self._server.status(self.pid)
        return self.returncode


class ForkServer:
    def __init__(self, proc: subprocess.Popen, control: socket.socket) -> None:
        self.proc = proc
        self._control = control
        self._lock = threading.Lock()
        self.last_used = time.monotonic()

    @classmethod
    def start(
        cls,
        folder: Path,
        env: dict[str, str],
        spawn: Callable[[Callable[[], subprocess.Popen]], subprocess.Popen],
    ) -> ForkServer:
        """Start a server in `folder` (its stderr in `forkserver.log` there); `spawn`
        runs the Popen in the thread whose exit the server's parent-death signal
        follows."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        args = [sys.executable, "-m", "training.run.forkserver", str(os.getpid()), str(IDLE_S)]
        args.append(str(theirs.fileno()))
        try:
            with open(folder / "forkserver.log", "ab") as log:
                proc = spawn(
                    lambda: subprocess.Popen(
                        args,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        cwd=folder,
                        env={**env, "OPENBLAS_NUM_THREADS": "1"},  # see training.run.forkserver
                        pass_fds=(theirs.fileno(),),
                        start_new_session=True,
                    )
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(proc, ours)

    def usable(self) -> bool:
        """Alive, and not about to leave for want of work."""
        return self.proc.poll() is None and time.monotonic() - self.last_used < IDLE_S - 30

    def fork(self, cwd: Path, stderr_path: Path) -> tuple[ForkedRunner, int, int]:
        """A runner in `cwd` with its stderr in `stderr_path`: (it, the write end of its
        stdin, the read end of its stdout)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        message = b"F" + str(cwd).encode()
        child = self._fork_child(message, (stdin_r, stdout_w, err), (stdin_w, stdout_r))
        return child, stdin_w, stdout_r

    def fork_check(self, args: list[str]) -> tuple[ForkedRunner, int]:
        """A check of a peer's file (`training.evidence.check_weights` `args`): (it,
        the read end of its stdout)."""
        stdout_r, stdout_w = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        message = b"C" + "\0".join(args).encode()
        return self._fork_child(message, (null, stdout_w, null), (stdout_r,)), stdout_r

    def _fork_child(
        self, message: bytes, theirs: tuple[int, int, int], ours: tuple[int, ...]
    ) -> ForkedRunner:
        """Have the server fork a child for `message` on `theirs` (its stdin, stdout
        and stderr, closed here once sent); `ours`, the other ends of its pipes, are
        closed too when it fails."""
        fds = array.array("i", theirs)
        try:
            pid = self._ask(message, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except BaseException:
            _close(ours)
            raise
        finally:
            _close(dict.fromkeys(theirs))  # one descriptor may stand for two
        if pid <= 0:
            _close(ours)
            raise ForkServerGone("the fork server could not fork a child")
        return ForkedRunner(pid, self)

    def status(self, pid: int) -> int:
        """The exit status of a runner that has exited (-1 if the server is gone)."""
        try:
            return self._ask(b"S" + PID.pack(pid), [])
        except ForkServerGone:
            return -1

    def close(self) -> None:
        """Let the server go (it waits for its running runners, then exits)."""
        self._control.close()

    def _ask(self, message: bytes, ancillary: list) -> int:
        with self._lock:
            try:
                self._control.sendmsg([message], ancillary)
                reply = self._control.recv(PID.size)
            except OSError as exc:
                raise ForkServerGone(f"the fork server is gone: {exc}") from None
            self.last_used = time.monotonic()
        if len(reply) != PID.size:
            raise ForkServerGone("the fork server is gone")
        return PID.unpack(reply)[0]


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        os.close(fd)


def _exited(pid: int) -> None:
    """Wait until `pid` (not our child: no waitpid) has exited."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
