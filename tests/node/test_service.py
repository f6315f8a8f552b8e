"""The node as a systemd user service: the unit file `node install-service` writes
(with the data dir and the flags given), `node status` and `uninstall-service`; where
a systemd user manager runs, the service is started and answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.machine.service_unit import UNIT_NAME, unit_text


def _cli(*args: str, config: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "XDG_CONFIG_HOME": str(config),
           "HOME": str(config), "MESHMINER_API": "http://127.0.0.1:9"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "node", *args], capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip


@pytest.mark.process
def test_install_service_writes_a_unit_with_the_data_dir_and_flags(tmp_path: Path) -> None:
    data = tmp_path / "data dir"  # a space: quoted in ExecStart
    done = _cli("node", "install-service", "--no-start", "--data-dir", str(data), "--",
                "--hours", "22:00-07:00", "--gpus", "0,1", config=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "systemd" / "user" / UNIT_NAME
    text = unit.read_text()
    exec_start = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    assert exec_start == (
        f"ExecStart={sys.executable} -m node node run --data-dir '{data}' "
        "--hours 22:00-07:00 --gpus 0,1"
    )
    for line in ("Restart=on-failure", "KillSignal=SIGTERM", "WantedBy=default.target"):
        assert line in text.splitlines()

    status = _cli("node", "status", config=tmp_path)
    assert status.returncode == 1  # no node answers at the API given
    assert "service: meshminer.service" in status.stdout
    assert "not installed" not in status.stdout
    assert "not answering" in status.stderr

    removed = _cli("node", "uninstall-service", config=tmp_path)
    assert removed.returncode == 0 and "removed" in removed.stdout
    assert not unit.exists()
    status = _cli("node", "status", config=tmp_path)
    assert "meshminer.service not installed" in status.stdout


def test_a_percent_in_a_path_is_not_a_systemd_specifier(tmp_path: Path) -> None:
    text = unit_text(tmp_path / "100%", [], python="/usr/bin/python3")
    assert f"--data-dir {tmp_path}/100%%" in text


def _user_systemd() -> bool:
    if not os.path.exists("/usr/bin/systemctl"):
        return False
    done = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True)
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _user_systemd(), reason="no systemd user manager runs here")
def test_where_systemd_runs_the_service_starts_and_stops(tmp_path: Path) -> None:
    done = _cli("node", "install-service", "--data-dir", str(tmp_path / "data"), "--",
                "--http", "127.0.0.1:0", "--listen", "/ip4/127.0.0.1/tcp/0",
                config=Path.home() / ".config")  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        state = subprocess.run(["systemctl", "--user", "is-active", UNIT_NAME],
                               capture_output=True, text=True)  # fmt: skip
        assert state.stdout.strip() in ("active", "activating")
    finally:
        _cli("node", "uninstall-service", config=Path.home() / ".config")
