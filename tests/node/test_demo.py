"""`meshminer demo` (what `make demo` runs) works end to end and cleans up after itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_trains_a_job_across_the_network() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "node", "demo"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "All nodes found each other" in out.stdout
    first = out.stdout.splitlines()[0]  # where to look comes first
    assert first.startswith("Status page: http://127.0.0.1:"), out.stdout[:500]
    assert "completed: trained by node2" in out.stdout or "completed: trained by node3" in (
        out.stdout
    )
    accuracy = float(out.stdout.split("validation accuracy ", 1)[1].split(",", 1)[0])
    assert accuracy > 0.9
    assert "Done: all nodes stopped." in out.stdout


def test_the_elastic_demo_survives_a_worker_leaving_and_one_joining() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "node", "demo", "--mode", "elastic", "--rounds", "3"],
        capture_output=True,
        text=True,
        timeout=900,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "stopping node4" in out.stdout and "node5" in out.stdout
    assert "rounds" in out.stdout  # the rounds table
    loss = float(out.stdout.split("final validation loss ", 1)[1].split(";", 1)[0])
    workers = out.stdout.split("workers: ", 1)[1].split(";", 1)[0]
    assert "node5" in workers and "node4" in workers
    assert loss < 3.0  # a character LM that learned something (uniform over ~90 chars: 4.5)
    assert "Done: all nodes stopped." in out.stdout
