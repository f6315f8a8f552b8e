"""Run test_ops_triton.py (the kernels against their references) in Triton's
interpreter, in a child process started with TRITON_INTERPRET=1.

Triton reads that variable when it is imported, so it cannot be switched on for a
few tests of a process that has imported Triton already, and switching it on for
this whole process would change how every later test's kernels run. A child
process keeps it to the kernel tests: nothing leaks into the tests beside them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (the test extra has it)")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.process
def test_kernels_match_their_references_in_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::RuntimeWarning",
            str(ROOT / "tests" / "training" / "ops" / "test_ops_triton.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = out.stdout[-6000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    summary = re.search(r"(\d+) passed", out.stdout)
    assert summary and int(summary.group(1)) >= 9, report
    assert "skipped" not in out.stdout.splitlines()[-1], report
