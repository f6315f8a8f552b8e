"""`meshminer doctor`: each finding from the facts it reads, and the command against a
real node. (Inside NATed namespaces: tests/netlab/test_nat.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.demo.localnet import LocalNetwork, wait_for
from node.machine.doctor import PROBLEM, data_dir_findings, node_findings


def _status(**reachability: object) -> dict:
    return {
        "addrs": ["/ip4/192.168.1.2/tcp/4470/p2p/me"],
        "connections": 1,
        "reachability": {"state": "unknown", "how": "", "relayed_through": [], **reachability},
        "ports": {"listen": "/ip4/192.168.1.2/tcp/4470", "http": "127.0.0.1:8470", "data": 1},
        "sandbox": {"filesystem": "on (Landlock ABI 7)", "tcp": "off: no Landlock TCP rules"},
    }


def _by_name(findings: list) -> dict:
    return {f.name: f for f in findings}


def test_a_nated_node_without_a_relay_slot_is_a_problem_with_its_fix() -> None:
    now = time.time()
    peers = [{"ad_timestamp": now, "last_seen": now, "path": "direct"}]
    alone = _by_name(node_findings(_status(state="private", how="1 of 1"), peers, now))
    assert alone["reachability"].state == PROBLEM
    assert "--bootstrap" in alone["reachability"].fix
    relayed = _status(state="private", how="1 of 1", relayed_through=["relay"])
    assert _by_name(node_findings(relayed, peers, now))["reachability"].state == "ok"
    assert _by_name(node_findings(_status(), peers, now))["reachability"].state == "warn"
    assert alone["isolation: tcp"].state == "warn" and alone["isolation: tcp"].fix


def test_a_machine_guard_set_where_its_sensor_is_missing_is_a_warning() -> None:
    missing = [
        "no CPU temperature (no readable /sys/class/thermal zone): max_cpu_temp_c",
        "no GPU temperature (no NVML, or no NVIDIA driver): max_gpu_temp_c",
    ]
    status = {**_status(state="public"), "availability": {"sensors_missing": missing}}
    unset = _by_name(node_findings({**status, "preferences": {}}, [], time.time()))
    assert unset["machine guards"].state == "ok"
    assert unset["machine guards"].detail == "unread here: max_cpu_temp_c, max_gpu_temp_c"
    set_ = {**status, "preferences": {"max_cpu_temp_c": 85, "max_gpu_temp_c": 0}}
    guards = _by_name(node_findings(set_, [], time.time()))["machine guards"]
    assert guards.state == "warn" and guards.detail.startswith("no CPU temperature")
    assert "never pauses" in guards.detail and "GPU" not in guards.detail
    assert "volunteer.md" in guards.fix


def test_a_clock_far_from_the_peers_is_a_problem() -> None:
    now = time.time()
    peers = [{"ad_timestamp": now + 120, "last_seen": now, "path": "direct"} for _ in range(3)]
    clock = _by_name(node_findings(_status(state="public"), peers, now))["clock"]
    assert clock.state == PROBLEM and "+120.0 s" in clock.detail and "ntp" in clock.fix


def test_a_data_dir_others_can_read_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "identity.key").write_bytes(b"k")
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / "identity.key", 0o644)
    found = _by_name(data_dir_findings(tmp_path))
    assert found[f"permissions: {tmp_path.name}"].fix == f"chmod 700 {tmp_path}"
    assert found["permissions: identity.key"].state == PROBLEM


@pytest.mark.process
def test_doctor_reports_a_running_node_as_json(localnet: LocalNetwork) -> None:
    first, second = localnet.start(2)
    wait_for(
        lambda: second.get("/api/v1/status")["reachability"]["state"] == "public",
        30,
        "a dial-back from the first node",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "node",
            "doctor",
            "--json",
            "--api",
            second.api,
            "--data-dir",
            str(second.data_dir),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    found = {f["name"]: f for f in report["findings"]}
    assert found["reachability"]["state"] == "ok" and "public" in found["reachability"]["detail"]
    assert found["peers"]["state"] == "ok" and "1 direct" in found["peers"]["detail"]
    assert found["clock"]["state"] == "ok"
    assert report["state"] != PROBLEM and done.returncode == 0, report
