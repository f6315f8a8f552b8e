"""The fork server: started with a node (or, with `--cold-runners`, its first task),
it forks every task's runner with torch imported already, and each runner isolates
itself for its task as a fresh one does."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import trio
from processes import gone, training_processes
from safetensors.numpy import save_file

from node.demo.localnet import LocalNetwork, wait_for
from node.work.run import (
    RunnerRequest,
    UnitFailed,
    check_forked,
    run_training,
    runner_env,
    warm_runners,
)
from training.evidence.result_check import WeightsRejected, check_weights_values
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain

pytestmark = pytest.mark.process  # the fork server and its runners


def _request(unit: Path, steps: int = 3) -> RunnerRequest:
    spec = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=steps, hidden=(8,)))))
    return RunnerRequest.for_spec(
        spec, {}, unit / "weights.safetensors", gpu_memory_fraction=1.0, memory_limit_mb=0
    )


def test_every_task_is_forked_by_one_server_and_isolates_itself(tmp_path: Path, caplog) -> None:
    warm = tmp_path / "runners"
    units = [tmp_path / (c * 16) for c in "abc"]
    caplog.set_level(logging.INFO, "node.work.run.executor")
    parents: list[int] = []

    async def main() -> list[list[int]]:
        seen = []
        for unit in units[:2]:
            result = await run_training(_request(unit), unit, 600, parents.append, warm_dir=warm)
            assert result["event"] == "result"
            seen.append(training_processes(warm, "training.run.forkserver"))
        # a runner that is killed (its time limit) is reported as such, and the
        # server forks the next one all the same
        with pytest.raises(UnitFailed, match="time limit"):
            await run_training(
                _request(units[2], 10**6), units[2], 3, lambda e: None, warm_dir=warm
            )
        result = await run_training(
            _request(units[0]), units[0], 600, lambda e: None, warm_dir=warm
        )
        assert result["event"] == "result"
        seen.append(training_processes(warm, "training.run.forkserver"))
        return seen

    first, second, third = trio.run(main)
    assert len(first) == 1 and first == second == third  # one server, every time
    for unit in units[:2]:
        assert (unit / "stderr.log").is_file() and (unit / "weights.safetensors").is_file()
    isolation = [r.getMessage() for r in caplog.records if "runner isolation" in r.getMessage()]
    assert len(isolation) == 4 and len(set(isolation)) == 1  # each isolated itself
    assert "on" in isolation[0]
    os.kill(first[0], 9)


def test_a_node_starts_its_fork_server_with_itself_unless_told_not_to(tmp_path: Path) -> None:
    with LocalNetwork(tmp_path / "net", ["--not-accepting"]) as net:
        warm, cold = net.add(), net.add(["--cold-runners"])
        servers = wait_for(
            lambda: training_processes(warm.data_dir / "runners", "training.run.forkserver"),
            120,
            "the warm node's fork server",
        )
        assert len(servers) == 1
        assert training_processes(cold.data_dir, "training.run.forkserver") == []
        assert not (cold.data_dir / "runners" / "forkserver.log").exists()
        warm.stop()
        wait_for(lambda: all(gone(pid) for pid in servers), 30, "the server to leave with its node")


def _serve(tmp_path: Path, idle: str, threads: str) -> subprocess.CompletedProcess:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = {**runner_env(tmp_path), "OPENBLAS_NUM_THREADS": threads}
    args = [sys.executable, "-m", "training.run.forkserver", str(os.getpid()), idle]
    try:
        return subprocess.run(
            [*args, str(theirs.fileno())],
            capture_output=True, cwd=tmp_path, env=env, timeout=120,
            pass_fds=(theirs.fileno(),),
        )  # fmt: skip
    finally:
        ours.close()
        theirs.close()


def test_a_server_keeps_one_thread_and_leaves_when_idle(tmp_path: Path) -> None:
    served = _serve(tmp_path, "0.5", "1")
    assert served.returncode == 0, served.stderr.decode()
    assert served.stdout == b""


def test_a_server_that_would_have_threads_refuses(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("OpenBLAS starts no pool thread on one core")
    served = _serve(tmp_path, "5", "2")
    assert served.returncode == 3, served.stderr.decode()
    assert b"one thread" in served.stderr


def test_a_peers_file_is_checked_in_a_child_of_the_fork_server(tmp_path: Path) -> None:
    """The owner's value check of a worker's file: forked by the warm server when one
    runs (no fresh interpreter and its imports), with the answers a fresh one gives."""
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    save_file({"w": np.ones(8, np.float32)}, str(good))
    save_file({"w": np.array([1.0, np.nan], np.float32)}, str(bad))
    warm = tmp_path / "runners"

    async def main() -> tuple:
        before = await check_forked([str(good)])  # no server: the caller starts a fresh one
        await warm_runners(warm)
        answers = await check_forked([str(good)]), await check_forked([str(bad)])
        await check_weights_values(good, forked=check_forked)
        with pytest.raises(WeightsRejected, match="NaN or Inf"):
            await check_weights_values(bad, forked=check_forked)
        return before, answers

    before, (ok, nan) = trio.run(main)
    assert before is None
    assert ok == (0, "ok\n")
    assert nan[0] == 1 and "holds NaN or Inf" in nan[1]
    for pid in training_processes(warm, "training.run.forkserver"):
        os.kill(pid, 9)


def test_malformed_checks_fail_in_their_child_and_the_server_serves_on(tmp_path: Path) -> None:
    """A check with missing or wrong arguments exits 1 naming the problem, a message
    that is not UTF-8 is refused with no child forked, and the server still answers."""
    good = tmp_path / "good.safetensors"
    save_file({"w": np.ones(8, np.float32)}, str(good))
    (tmp_path / "junk").write_bytes(b"\x00" * 64)
    warm = tmp_path / "runners"

    async def main() -> list:
        from node.work.run.executor import usable_fork_server

        await warm_runners(warm)
        answers = [
            await check_forked(args)
            for args in (
                [str(tmp_path / "missing")],
                [str(tmp_path / "junk")],
                ["--delta", str(good), "not a number", "j", "0", "b", "int4"],
                ["--delta", str(good)],
            )
        ]
        server = usable_fork_server()
        assert server is not None
        null = os.open(os.devnull, os.O_RDWR)
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, np.array([null] * 3, np.int32).tobytes())]
        try:
            answers.append(server._ask(b"C\xff\xfe", fds))
        finally:
            os.close(null)
        answers.append(await check_forked([str(good)]))
        return answers

    *failed, refused, ok = trio.run(main)
    problems = ["No such file", "header", "must be integers", "got 2"]
    for (code, printed), problem in zip(failed, problems, strict=True):
        assert code == 1 and problem in printed and printed.count("\n") == 1, printed
    assert refused == -1
    assert ok == (0, "ok\n")
    for pid in training_processes(warm, "training.run.forkserver"):
        os.kill(pid, 9)
