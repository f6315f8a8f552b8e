"""A warm parent for runners: imports torch once, then forks one runner per task.

`python -m training.run.forkserver PARENT_PID IDLE_S CONTROL_FD`, started by a node for work that
comes in series (an elastic job's rounds, a sweep's trials). A fresh runner spends
2-4 s of CPU importing torch and the training modules before its task starts; on a
busy machine, with every worker of a round doing it at once, that was most of a
short round. A runner forked from here starts with all of that done, in
milliseconds, and is otherwise what a fresh runner is: a process in its own session
that reads one request on stdin, isolates itself (`training.run.isolation`) and reports
on stdout. Isolation is per task and irreversible, so a runner serves one task; this
process never runs one and never isolates itself.

The node talks to it over a Unix SEQPACKET socket (`CONTROL_FD`), one message each
way:
- `F` + the cwd, with three descriptors (the runner's stdin, stdout and stderr)
  passed as SCM_RIGHTS: fork a runner; the reply is its pid (8 bytes, signed);
- `C` + the arguments of `training.evidence.check_weights` (NUL-separated), with the
  same three descriptors: fork a check of a peer's weights or delta file, which costs
  a fresh Python 0.3 s of CPU in imports alone (numpy); the reply is its pid;
- `S` + a pid (8 bytes): that runner's exit status, as `Popen.returncode` gives it
  (negative: killed by that signal); asked once the node has seen it exit.

It dies with the node, and leaves after `IDLE_S` without a fork once none of its
runners is alive or unasked. Forking is safe only from a process with one thread
(the child would inherit locks held by the others, and Landlock binds only the
thread that applies it and those it starts later), so the imports must leave one
thread: numpy's OpenBLAS pool would be a second (the node starts this with
`OPENBLAS_NUM_THREADS=1`). With a second thread it exits with `UNSAFE` and the node
goes back to a fresh runner per task.
"""

from __future__ import annotations

import array
import os
import select
import socket
import struct
import sys

UNSAFE = 3  # exit code: the imports left a second thread; forking is off here
PID = struct.Struct("!q")


def _warm_up() -> None:
    """Everything a task imports, and what `deterministic` imports lazily. Importing
    `training.ops` sets torch.optim and our custom ops to run without torch._dynamo
    (`training.run.no_dynamo`), here and so in every runner forked from here."""
    import training.elastic.tasks  # noqa: F401  (torch, numpy and the training modules)
    import training.run.runner  # noqa: F401
    from training.run.execute import deterministic
    from training.run.no_dynamo import skip_dynamo_wrappers

    with deterministic(0):
        pass
    skip_dynamo_wrappers()  # after every import of torch's: no runner scans again


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fork(cwd: str, fds: list[int], control: socket.socket, check: list[str] | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: its own session, the node's pipes as stdin, stdout and stderr
        control.close()
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(cwd)
        if check is None:
            from training.run.runner import main

            code = main()
        else:
            from training.evidence.check_weights import main as check_main

            code = check_main(check)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _text(raw: bytes) -> str | None:
    """A message's UTF-8 text (a cwd, or a check's arguments), or None if it is not."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def serve(parent_pid: int, idle_s: float, control_fd: int) -> int:
    from training.run.isolation import die_with_parent

    die_with_parent(parent_pid)
    _warm_up()
    if _threads() != 1:
        print(
            f"a fork server must have one thread, not {_threads()}; runners start fresh",
            file=sys.stderr,
        )
        return UNSAFE
    control = socket.socket(fileno=control_fd)
    live: set[int] = set()
    ended: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([control], [], [], idle_s)
        if not ready:
            for pid in list(live):  # reap what ended, keep the statuses for the node
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    live.discard(pid)
                    ended[pid] = os.waitstatus_to_exitcode(status)
            if not live and not ended:
                return 0
            continue
        fds = array.array("i")
        message, ancillary, _, _ = control.recvmsg(4096, socket.CMSG_SPACE(3 * fds.itemsize))
        if not message:  # the node let it go: its runners die with it, so wait for them
            for pid in live:
                os.waitpid(pid, 0)
            return 0
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        text = _text(message[1:])
        if message[:1] in (b"F", b"C") and len(fds) == 3 and text is not None:
            check = text.split("\0") if message[:1] == b"C" else None
            pid = _fork("/" if check else text, list(fds), control, check)
            live.add(pid)
            reply = pid
        elif message[:1] == b"S" and len(message) == 1 + PID.size:
            pid = PID.unpack(message[1:])[0]
            if pid in live:
                live.discard(pid)
                ended[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            reply = ended.pop(pid, -1)
        else:
            reply = -1
        for fd in fds:
            os.close(fd)
        control.send(PID.pack(reply))


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])))
