"""The owner's checks of a peer's file, forked by the node's runner fork server.

A delta or weights file from a worker is read outside the daemon
(`training.evidence.check_weights`); a fresh interpreter for each costs 0.3 s of CPU
in imports alone, once per delta of every round. The fork server (`executor`) has
them imported: `check_forked` asks it for the check's child instead, and answers None
when no server runs, so that the caller starts the fresh interpreter as before.
"""

from __future__ import annotations

import trio

from node.work.run.executor import kill_group, usable_fork_server, wait_exited
from node.work.run.forks import ForkServerGone

MAX_ANSWER_BYTES = 4096  # `ok` or one line naming the problem


async def check_forked(args: list[str]) -> tuple[int, str] | None:
    """Run `check_weights` with `args` in a child of this node's fork server: (its
    exit code, what it printed), or None without a usable server. Cancelled (the
    caller's time limit), the child is killed."""
    server = usable_fork_server()
    if server is None:
        return None
    try:
        proc, stdout_r = await trio.to_thread.run_sync(server.fork_check, args)
    except ForkServerGone:
        return None
    answer = b""
    try:
        async with trio.lowlevel.FdStream(stdout_r) as stdout:
            while len(answer) <= MAX_ANSWER_BYTES and (chunk := await stdout.receive_some()):
                answer += chunk
        code = await wait_exited(proc)
    except BaseException:
        kill_group(proc)
        with trio.CancelScope(shield=True):  # reaped by the server, asked once it is gone
            await wait_exited(proc)
        raise
    return code, answer[:MAX_ANSWER_BYTES].decode(errors="replace")
