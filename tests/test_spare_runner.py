"""The spare runner: started ahead of an elastic job's next task, it has torch imported
when the task comes, and isolates itself for that task as a fresh runner would."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import trio

from node.work.executor import run_training, runner_env
from node.work.service import runner_request
from training.examples import digits_toml
from training.spec import parse_spec, spec_to_plain


def _request(unit: Path) -> dict:
    spec = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=3, hidden=(8,)))))
    return runner_request(
        spec, {}, unit / "weights.safetensors", gpu_memory_fraction=1.0, memory_limit_mb=0
    )


def _spares(folder: Path) -> list[int]:
    """Pids of the spare runners waiting in `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and os.readlink(proc / "cwd") == str(folder)
                and b"--spare" in (proc / "cmdline").read_bytes()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_task_runs_in_the_spare_and_leaves_a_new_one(tmp_path: Path, caplog) -> None:
    spares = tmp_path / "runners"
    units = [tmp_path / (c * 16) for c in "ab"]
    caplog.set_level(logging.INFO, "node.work.executor")

    async def main() -> list[int]:
        seen = []
        for unit in units:
            result = await run_training(_request(unit), unit, 600, lambda e: None, spare_dir=spares)
            assert result["event"] == "result"
            seen.append(_spares(spares))
        return seen

    first, second = trio.run(main)
    assert len(first) == 1 and len(second) == 1 and first != second  # the spare was used
    assert not Path(f"/proc/{first[0]}").exists() or _zombie(first[0])
    assert len(list(spares.glob("spare-*.log"))) == 1  # the used spare's log moved to b
    assert (units[1] / "stderr.log").is_file() and (units[1] / "weights.safetensors").is_file()
    isolation = [r.getMessage() for r in caplog.records if "runner isolation" in r.getMessage()]
    assert len(isolation) == 2 and isolation[0] == isolation[1]  # the spare isolated itself too
    os.kill(second[0], 9)


def test_a_spare_keeps_one_thread_and_leaves_when_idle(tmp_path: Path) -> None:
    env = {**runner_env(tmp_path), "OPENBLAS_NUM_THREADS": "1"}
    spare = subprocess.Popen(
        [sys.executable, "-m", "training.runner", "--spare", str(os.getpid()), "0.5"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    out, err = spare.communicate(timeout=120)  # stdin stays open until it exits
    assert spare.returncode == 0, err.decode()
    assert out == b""


def test_a_spare_that_would_start_threads_refuses(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("OpenBLAS starts no pool thread on one core")
    env = {**runner_env(tmp_path), "OPENBLAS_NUM_THREADS": "2"}
    spare = subprocess.run(
        [sys.executable, "-m", "training.runner", "--spare", str(os.getpid()), "5"],
        input=b"", capture_output=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert spare.returncode == 3, spare.stderr.decode()
    assert b"one thread" in spare.stderr


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
