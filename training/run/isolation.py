"""What a training subprocess does to itself before it touches a peer's job.

The runner (`python -m training.run.runner`) reads its request, then calls `isolate`
before it parses the spec or imports torch, so everything the job can make it do
happens inside:

- **dies with the daemon**: `PR_SET_PDEATHSIG` = SIGKILL (and it exits at once if the
  daemon is already gone); the executor also starts it in a session of its own and
  kills that whole process group;
- **rlimits**: CPU seconds (the unit's time limit), file size (the unit's disk
  quota), open files, processes, no core dumps;
- **no network**: a new network namespace with nothing in it (as root; otherwise a
  user namespace with one, where the kernel allows that); and Landlock's TCP rules
  (ABI >= 4) refuse every TCP bind and connect as a second layer;
- **no reading the node's files**: Landlock (Linux >= 5.13) allows reading only the
  Python installation, the system's libraries, /proc, /sys and /dev, the blob files
  the request names, and reading and writing only the unit's own folder, /dev and
  /proc's files (CUDA opens its devices and names its threads there; another
  process's memory stays out of reach, by Landlock's ptrace rule). The node's
  identity key, its databases and other units' folders are out of reach.

Every mechanism the kernel refuses is reported, not fatal: `isolate` returns a map of
mechanism -> "on" or the reason it is off, which the runner reports and the node
shows (`meshminer status`, the status page). `python -m training.run.isolation` prints
that map for this machine without isolating anything else; with `--cuda`, whether CUDA
starts inside (what `meshminer doctor` asks on a machine whose torch sees a GPU).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import site
import sys
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# access rights (fs), by the ABI version that introduced them
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

MAX_OPEN_FILES = 4096
MAX_PROCESSES = 4096  # per user, threads included (torch's pools count)
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys")
DEVICE_RW = ("/dev",)
PACKAGES = ("training", "protocol", "node", "ledger")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def isolate(
    workdir: Path,
    read_files: list[Path],
    *,
    cpu_seconds: int = 0,
    max_file_bytes: int = 0,
    parent_pid: int | None = None,
) -> dict[str, str]:
    """Isolate this process (irreversibly); returns mechanism -> "on" or why not."""
    report = {"die_with_daemon": die_with_parent(parent_pid)}
    report["rlimits"] = _rlimits(cpu_seconds, max_file_bytes)
    report["network_namespace"] = _no_network()
    report.update(_landlock(workdir, read_files))
    return report


def die_with_parent(parent_pid: int | None) -> str:
    """Arm SIGKILL for when the daemon dies; exits at once if it already has."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return f"off: prctl: {os.strerror(ctypes.get_errno())}"
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the daemon died before the signal was armed
    return "on"


def _rlimits(cpu_seconds: int, max_file_bytes: int) -> str:
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NOFILE: MAX_OPEN_FILES,
        resource.RLIMIT_NPROC: MAX_PROCESSES,
    }
    if cpu_seconds > 0:
        limits[resource.RLIMIT_CPU] = cpu_seconds
    if max_file_bytes > 0:
        limits[resource.RLIMIT_FSIZE] = max_file_bytes
    refused = []
    for which, value in limits.items():
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, value if which != resource.RLIMIT_CPU else hard))
        except (ValueError, OSError) as exc:
            refused.append(f"{which}: {exc}")
    return "on" if not refused else f"partly: {'; '.join(refused)}"


def _no_network() -> str:
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "on"
    first = os.strerror(ctypes.get_errno())
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "on (in a user namespace)"
    return f"off: unshare: {first}; unprivileged: {os.strerror(ctypes.get_errno())}"


def landlock_abi() -> int:
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(abi, 0)


def _landlock(workdir: Path, read_files: list[Path]) -> dict[str, str]:
    abi = landlock_abi()
    if abi < 1:
        why = f"off: Landlock unavailable ({os.strerror(ctypes.get_errno())})"
        return {"filesystem": why, "tcp": why}
    fs = FS_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    fs |= FS_IOCTL_DEV if abi >= 5 else 0
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    attr = _RulesetAttr(fs, net)
    fd = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if fd < 0:
        why = f"off: {os.strerror(ctypes.get_errno())}"
        return {"filesystem": why, "tcp": why}
    try:
        for path in _readable_trees():
            _allow(fd, path, READ & fs)
        _allow(fd, Path(__file__).resolve().parents[2], FS_READ_DIR)  # to find them
        for path in DEVICE_RW:
            _allow(fd, Path(path), fs)
        # CUDA names its threads through /proc/self/task/*/comm, opened as fopen's "w"
        # opens it (O_TRUNC, its own right from ABI 3): refused, CUDA fails to start
        # (error 304). Landlock keeps other processes' /proc/<pid>/mem out of reach
        # (its ptrace scoping), and /proc/sys stays root's.
        _allow(fd, Path("/proc"), (READ | FS_WRITE_FILE | FS_TRUNCATE) & fs)
        _allow(fd, workdir, fs)
        for path in read_files:
            _allow(fd, path, FS_READ_FILE)
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0) != 0:
            why = f"off: restrict_self: {os.strerror(ctypes.get_errno())}"
            return {"filesystem": why, "tcp": why}
    finally:
        os.close(fd)
    tcp = "on" if net else f"off: Landlock ABI {abi} has no network rules (needs 4)"
    return {"filesystem": f"on (Landlock ABI {abi})", "tcp": tcp}


def _readable_trees() -> list[Path]:
    """The system's libraries and everything Python imports from, this project too."""
    trees = {Path(p) for p in SYSTEM_READ}
    trees |= {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    trees |= {Path(p) for p in site.getsitepackages()}
    project = Path(__file__).resolve().parents[2]
    trees |= {project / package for package in PACKAGES}  # not the folder around them,
    return sorted({t.resolve() for t in trees if t.exists()})  # which may hold a data dir


def _allow(ruleset_fd: int, path: Path, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path this machine does not have
    try:
        if not path.is_dir():
            access &= FILE_ONLY
        rule = _PathBeneath(access, fd)
        _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset_fd, LANDLOCK_RULE_PATH_BENEATH,
                      ctypes.byref(rule), 0)  # fmt: skip
    finally:
        os.close(fd)


def probe() -> dict[str, str]:
    """What `isolate` would get on this machine, measured in a throwaway child."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child isolates itself and reports
        os.close(read_end)
        try:
            report = isolate(_probe_workdir(), [])
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")


def _probe_workdir() -> Path:
    """The folder a probe may write, as a runner writes its unit's: nothing is left."""
    return Path(os.environ.get("TMPDIR", "/tmp"))


def cuda_inside() -> dict[str, str]:
    """Isolate this process as a runner is, then start CUDA: {"cuda": "on"} or why not.
    Run it in a throwaway interpreter (`python -m training.run.isolation --cuda`):
    isolation is irreversible."""
    import warnings

    isolate(_probe_workdir(), [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch

        if torch.cuda.is_available():
            return {"cuda": "on"}
    why = "; ".join(str(w.message) for w in caught) or "torch sees no CUDA device"
    return {"cuda": f"off: {why}"}


if __name__ == "__main__":
    print(json.dumps(cuda_inside() if sys.argv[1:] == ["--cuda"] else probe()))
