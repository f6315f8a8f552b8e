"""The node as a systemd user service: the unit file, and asking systemd about it.

A volunteer installs once and forgets: `meshminer node install-service` writes
`~/.config/systemd/user/meshminer.service` running `node run` with the data dir and
flags it was given, enables it (it starts at login; with `loginctl enable-linger`, at
boot) and starts it. systemd sends the node's stderr to the journal; the node writes
its own log file in the data dir as well.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

UNIT_NAME = "meshminer.service"


class ServiceError(Exception):
    """systemd could not do what was asked; the message says what to do instead."""


def unit_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


def unit_text(data_dir: Path, run_args: list[str], python: str = sys.executable) -> str:
    """The unit file: `python -m node node run --data-dir DIR ARGS...`, restarted when
    it fails, stopped with SIGTERM (the node hands running units back)."""
    command = [python, "-m", "node", "node", "run", "--data-dir", str(data_dir), *run_args]
    return f"""\
[Unit]
Description=meshminer node: volunteer GPU compute for peers
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={" ".join(_quote(part) for part in command)}
Restart=on-failure
RestartSec=15
KillSignal=SIGTERM
TimeoutStopSec=30
Environment=PYTHONUNBUFFERED=1
# the log: `journalctl --user -u {UNIT_NAME}`, and {data_dir}/logs/node.log

[Install]
WantedBy=default.target
"""


def _quote(part: str) -> str:
    """systemd's ExecStart quoting: like a shell's, and `%` doubled (a specifier)."""
    return shlex.quote(part).replace("%", "%%")


def install(data_dir: Path, run_args: list[str], start: bool = True) -> Path:
    """Write the unit; with `start`, reload systemd, enable and start it."""
    path = unit_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(unit_text(data_dir, run_args))
    if start:
        systemctl("daemon-reload")
        systemctl("enable", "--now", UNIT_NAME)
    return path


def uninstall() -> str:
    """Stop and disable the service and remove its unit file; what was done."""
    path = unit_path()
    if not path.exists():
        return f"no {UNIT_NAME} here ({path})"
    try:
        systemctl("disable", "--now", UNIT_NAME)
        stopped = "stopped, disabled and "
    except ServiceError as exc:
        stopped = f"not stopped ({exc}); "
    path.unlink()
    with suppress(ServiceError):
        systemctl("daemon-reload")
    return f"{UNIT_NAME} {stopped}removed ({path})"


def state() -> str:
    """ "active", "inactive", "failed", ... as systemd says; "not installed"; or why
    systemd cannot be asked."""
    if not unit_path().exists():
        return "not installed"
    try:
        return systemctl("is-active", UNIT_NAME, check=False).strip() or "unknown"
    except ServiceError as exc:
        return f"unknown ({exc})"


def systemctl(*args: str, check: bool = True) -> str:
    if shutil.which("systemctl") is None:
        raise ServiceError("systemctl is not installed: this machine does not run systemd")
    done = subprocess.run(
        ["systemctl", "--user", *args], capture_output=True, text=True, timeout=60
    )
    if "Failed to connect to bus" in done.stderr:
        raise ServiceError(
            f"no systemd user manager is reachable (no login session?): {done.stderr.strip()}"
        )
    if check and done.returncode != 0:
        raise ServiceError(f"systemctl --user {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout
