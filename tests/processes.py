"""What tests read of live processes in /proc (importable from any test: pytest puts
tests/ on sys.path): the training processes working in a folder, and whether one ended."""

from __future__ import annotations

import os
from pathlib import Path


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def training_processes(folder: Path, module: str = "training.") -> list[int]:
    """Live `python -m <module>...` processes whose working directory is in `folder`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (
                str(folder) in os.readlink(proc / "cwd")
                and f"-m\0{module}".encode() in (proc / "cmdline").read_bytes()
                and not gone(int(proc.name))
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def training_process_in(folder: Path) -> int | None:
    """A live training process (a runner, or the fork server) working in `folder`."""
    return next(iter(training_processes(folder)), None)


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat: "T" while stopped (SIGSTOP)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def torch_mapped(pid: int) -> bool:
    """The process has torch's library mapped (it imported torch)."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
