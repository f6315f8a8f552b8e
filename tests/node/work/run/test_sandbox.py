"""The runner's sandbox, on real processes: what it cannot read, reach or leave
behind, its limits, the duty cycle and the disk quota, and the cleanup of old units."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import trio
from processes import gone, training_process_in

from node.demo.localnet import LocalNetwork, wait_for
from node.machine.doctor import OK, PROBLEM, sandboxed_cuda_finding
from node.work.run import remove_old_unit_folders
from node.work.run.executor import (
    UnitFailed,
    _disk_quota,
    _duty_cycle,
    folder_bytes,
    run_training,
    runner_env,
)
from training.spec.examples import digits_toml

ROOT = os.geteuid() == 0

CHILD = r"""
import ctypes, json, os, resource, socket, sys, threading
from pathlib import Path
from training.run.isolation import isolate
unit, blob, key, other, port = sys.argv[1:6]
report = isolate(Path(unit), [Path(blob)], cpu_seconds=60, max_file_bytes=1 << 20)

def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return type(exc).__name__

def connect():
    socket.create_connection(("127.0.0.1", int(port)), timeout=2).close()

def name_a_thread():  # as CUDA names its threads when it starts
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        err = ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(thread.ident), b"cuda-EvtHandlr")
    finally:
        done.set()
        thread.join()
    if err:
        raise OSError(err, os.strerror(err))

def rename_through_comm():  # as the driver does: fopen(".../comm", "w"), so O_TRUNC
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write("cuda-EvtHandlr")

def write_parent_memory():
    with open(f"/proc/{os.getppid()}/mem", "r+b") as mem:
        mem.write(b"x")

print(json.dumps({
    "report": report,
    "read key": attempt(lambda: Path(key).read_bytes()),
    "list other unit": attempt(lambda: os.listdir(other)),
    "read blob": attempt(lambda: Path(blob).read_bytes()),
    "write unit": attempt(lambda: (Path(unit) / "x").write_text("x")),
    "write outside": attempt(lambda: (Path(key).parent / "planted").write_text("x")),
    "connect": attempt(connect),
    "name a thread": attempt(name_a_thread),
    "name a thread through its comm file": attempt(rename_through_comm),
    "write the parent's memory": attempt(write_parent_memory),
    "limits": {name: resource.getrlimit(getattr(resource, name))[0]
               for name in ("RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CPU")},
}))
"""


@pytest.mark.skipif(not ROOT, reason="full isolation (network namespace) needs root here")
@pytest.mark.process
def test_a_runner_cannot_read_the_nodes_files_nor_reach_the_network(tmp_path: Path) -> None:
    data = tmp_path / "data"
    unit, other = data / "units" / ("a" * 16), data / "units" / ("b" * 16)
    for folder in (unit, other, data / "blobs"):
        folder.mkdir(parents=True)
    key = data / "identity.key"
    key.write_bytes(b"k" * 32)
    blob = data / "blobs" / ("c" * 64)
    blob.write_bytes(b"data")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(unit), str(blob), str(key), str(other),
             str(listener.getsockname()[1])],
            capture_output=True, text=True, timeout=60, env=runner_env(unit), cwd=unit,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert all(state.startswith("on") for state in seen["report"].values()), seen["report"]
    assert seen["read key"] == "PermissionError"
    assert seen["list other unit"] == "PermissionError"
    assert seen["write outside"] == "PermissionError"
    assert seen["connect"] != "allowed"
    assert (seen["read blob"], seen["write unit"]) == ("allowed", "allowed")
    assert seen["name a thread"] == "allowed"  # refused, CUDA fails to start (error 304)
    assert seen["name a thread through its comm file"] == "allowed"  # Landlock ABI >= 3: truncate
    assert seen["write the parent's memory"] == "PermissionError"
    assert not (data / "planted").exists()
    limits = seen["limits"]
    assert (limits["RLIMIT_CORE"], limits["RLIMIT_NOFILE"]) == (0, 4096)
    assert (limits["RLIMIT_FSIZE"], limits["RLIMIT_CPU"]) == (1 << 20, 60)


def test_the_runner_gets_a_clean_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MESHMINER_TOKEN", "secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    env = runner_env(tmp_path)
    assert "secret" not in env.values()
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.process
def test_the_duty_cycle_caps_cpu_time_and_follows_changes() -> None:
    """A CPU-bound process under a 40% duty cycle is stopped about 60% of the time (so
    it gets at most 40% of a core); raised to 100% while it runs, never. Measured as
    the share of samples of its state that find it stopped, which holds however
    loaded the machine is (its CPU time, printed, does not)."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    share = {"pct": 40.0}

    async def measure() -> tuple[float, float]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_duty_cycle, burner, lambda: share["pct"])
            stopped = []
            for pct in (40.0, 100.0):
                share["pct"] = pct
                await trio.sleep(1.0)  # the change applies from the next period
                cpu, wall = _cpu_seconds(burner.pid), time.monotonic()
                samples = []
                for _ in range(200):
                    samples.append(_stopped(burner.pid))
                    await trio.sleep(0.02)
                rate = (_cpu_seconds(burner.pid) - cpu) / (time.monotonic() - wall)
                print(f"at {pct:.0f}%: CPU share {rate:.2f}")
                stopped.append(sum(samples) / len(samples))
            nursery.cancel_scope.cancel()
        return stopped[0], stopped[1]

    try:
        limited, full = trio.run(measure)
    finally:
        os.killpg(burner.pid, signal.SIGKILL)
        burner.wait()
    print(f"stopped at 40%: {limited:.2f} of the time; at 100%: {full:.2f}")
    assert 0.4 < limited < 0.8
    assert full < 0.05


@pytest.mark.process
def test_a_unit_over_its_disk_quota_is_killed(tmp_path: Path) -> None:
    import tomllib

    from node.work.run import RunnerRequest
    from training.spec.job import parse_spec, spec_to_plain

    spec = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=5, hidden=(256,)))))
    unit = tmp_path / ("d" * 16)
    request = RunnerRequest.for_spec(
        spec, {}, unit / "weights.safetensors", gpu_memory_fraction=1.0, memory_limit_mb=0
    )
    unit.mkdir()
    with pytest.raises(UnitFailed, match="over its disk quota"):
        trio.run(lambda: run_training(request, unit, 600, lambda e: None, disk_quota_bytes=4096))
    assert folder_bytes(unit) < 1 << 20


@pytest.mark.process
def test_a_unit_over_quota_with_its_evidence_says_so(tmp_path: Path) -> None:
    """When most of what a unit wrote is its spot-check evidence, the failure says which
    setting lowers it."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint-00000000.safetensors").write_bytes(b"x" * (3 << 20))
    (tmp_path / "weights.safetensors").write_bytes(b"x" * (1 << 19))
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    over: list[str] = []
    try:
        trio.run(_disk_quota, sleeper, tmp_path, 1 << 20, over)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.returncode == -signal.SIGKILL
    assert "over its disk quota of 1 MiB; 3 MiB of it are checkpoints kept as evidence" in over[0]
    assert "trust.checkpoints" in over[0]


def test_old_finished_unit_folders_are_removed_and_running_ones_kept(tmp_path: Path) -> None:
    units = tmp_path / "units"
    now = time.time()
    for name, age_h in (("old", 30), ("running", 30), ("fresh", 1)):
        folder = units / name
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text("x")
        for path in (folder / "stderr.log", folder):
            os.utime(path, (now - age_h * 3600, now - age_h * 3600))
    assert remove_old_unit_folders(units, 24 * 3600, {"running"}, now) == ["old"]
    assert sorted(p.name for p in units.iterdir()) == ["fresh", "running"]


@pytest.mark.slow
def test_kill_9_of_the_daemon_leaves_no_runner(localnet: LocalNetwork) -> None:
    node = localnet.add()
    spec = 'placement = "local"\n' + digits_toml("long", steps=200_000, hidden=(64,))
    from node.client import request_json

    request_json(node.api, "POST", "/api/v1/jobs", {"spec": spec})

    pid = wait_for(lambda: training_process_in(node.data_dir / "units"), 60, "the runner to start")
    server = training_process_in(node.data_dir / "runners")  # the runner's parent
    assert server is not None
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait()
    for dying in (pid, server):
        wait_for(lambda p=dying: gone(p), 10, "it to die")


@pytest.mark.process
def test_doctor_asks_whether_cuda_starts_inside_the_sandbox() -> None:
    # where torch sees a GPU, CUDA must start in a runner's isolation too: on an H200
    # with Landlock ABI 7 it did not (error 304), and every unit trained on the CPU
    finding = sandboxed_cuda_finding()
    if torch.cuda.is_available():
        assert finding.state == OK, finding.detail
    else:
        assert finding.state == PROBLEM
        assert "units train on the CPU (off: torch sees no CUDA device)" in finding.detail
