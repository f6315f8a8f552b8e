"""kill -9 at random moments while appending: after every kill the chain verifies, there
is no half entry, and no append that had returned is lost.

The appender is a separate process killed with SIGKILL: 100 times a forked child of
this test process (cheap to start, so each run can be short), and a few times a fresh
`python -c` interpreter. Each child opens the ledger (the first run in a data dir
creates the genesis, so some kills land there) and appends work and rejected entries
in a loop, writing each committed seq to a pipe; the kill comes after a random delay.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ledger_factories import cosigned, key_from, peer_id_of

from ledger import Ledger

pytestmark = pytest.mark.process  # kills appender processes

NODE = key_from(21)
OWNER = key_from(22)
KILLS = 100
KILLS_PER_DIR = 10


def append_forever(data_dir: Path, out_fd: int, tag: str) -> None:
    """Append entries until killed, writing each committed seq (int64) to `out_fd`."""
    ledger = Ledger.open(data_dir, NODE)
    node, owner = peer_id_of(NODE), peer_id_of(OWNER)
    i = 0
    while True:
        if i % 2 == 0:
            credit = 0.001 * (i + 1)
            receipt = cosigned(OWNER, NODE, credit, job_id=tag, unit_id=f"{i:016x}")
            entry = ledger.append_work("work_done", receipt, credit, credit)
        else:
            entry = ledger.append_rejected(tag, f"u{i}", owner, node, "weights hash mismatch")
        os.write(out_fd, struct.pack("<q", entry.seq))
        i += 1


def check_after_kill(data_dir: Path, reported: list[int]) -> int:
    """The ledger opens, verifies in full, and holds every reported append."""
    with Ledger.open(data_dir, NODE) as ledger:
        report = ledger.verify()
        assert report.ok, report.error
        assert ledger.count() == report.entries == report.head_seq + 1
        if reported:
            assert report.head_seq >= max(reported), "an append that had returned was lost"
        return report.head_seq


def kill_forked_appender(
    data_dir: Path, tag: str, delay_s: float, after_first_append: bool = False
) -> list[int]:
    """Kill the appender `delay_s` after it started, or (`after_first_append`) after
    its first append returned: on a loaded machine opening the ledger can take longer
    than any delay, and the kill would never land mid-append."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_fd)
            append_forever(data_dir, write_fd, tag)
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(write_fd)
    first = b""
    if after_first_append:
        ready, _, _ = select.select([read_fd], [], [], 30)
        first = os.read(read_fd, 8) if ready else b""
    time.sleep(delay_s)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        data = first + pipe.read()
    assert os.WIFSIGNALED(status), f"the appender stopped by itself (status {status})"
    return [seq for (seq,) in struct.iter_unpack("<q", data[: len(data) // 8 * 8])]


def test_kill_9_at_random_moments_leaves_a_valid_chain(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    started = time.monotonic()
    mid_append = during_open = 0
    total = 0
    for kill in range(KILLS):
        data_dir = tmp_path / f"ledger-{kill // KILLS_PER_DIR}"
        first_in_dir = kill % KILLS_PER_DIR == 0
        # the first run in a dir is killed early, often while it creates the genesis
        delay = rng.uniform(0, 0.004) if first_in_dir else rng.uniform(0, 0.03)
        reported = kill_forked_appender(
            data_dir, f"{kill + 0xABC0:016x}", delay, after_first_append=not first_in_dir
        )
        if reported:
            mid_append += 1
        elif first_in_dir:
            during_open += 1
        try:
            head = check_after_kill(data_dir, reported) if data_dir.exists() else -1
        except AssertionError as exc:
            raise AssertionError(f"kill {kill} (seed {seed}, delay {delay:.4f} s): {exc}") from exc
        total += len(reported)
        assert head >= -1
    elapsed = time.monotonic() - started
    print(f"{KILLS} kills in {elapsed:.1f} s, {total} appends, seed {seed}")
    # most kills must land while entries are being appended, not before the loop starts
    assert mid_append >= KILLS // 2, (mid_append, during_open)


CHILD = """
import os, struct, sys
from pathlib import Path
here = Path(sys.argv[2])
sys.path[:0] = [str(here), str(here.parent)]  # this module, and tests/ (ledger_factories)
from test_ledger_crash import append_forever
append_forever(Path(sys.argv[1]), sys.stdout.fileno(), sys.argv[3])
"""


def test_kill_9_of_a_fresh_interpreter(tmp_path: Path) -> None:
    rng = random.Random()
    tests_dir = str(Path(__file__).resolve().parent)
    for run in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), tests_dir, f"{run + 0xCAFE0000:016x}"],
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None
        first = child.stdout.read(8)  # wait for its first committed append, then a while
        assert len(first) == 8, "the appender did not start"
        time.sleep(rng.uniform(0.005, 0.05))
        child.send_signal(signal.SIGKILL)
        rest = child.stdout.read()
        child.wait()
        assert child.returncode == -signal.SIGKILL
        data = first + rest
        reported = [seq for (seq,) in struct.iter_unpack("<q", data[: len(data) // 8 * 8])]
        check_after_kill(tmp_path, reported)
