"""A volunteer's transfer caps hold between two real nodes: a worker's download cap
and an owner's upload cap each bound the rate of a unit's 4 MiB of data, measured by
the worker as it fetches (within 10% of the cap)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from node.client import request_json
from node.demo.localnet import ONE_THREAD, LocalNetwork, LocalNode

pytestmark = pytest.mark.slow

CAP_MBIT_S = 8.0
DATA_BYTES = 4 << 20  # 4.2 s at the cap; the quarter second's burst adds about 6%
FETCHED = re.compile(r"fetched blob (\w+) from \S+: (\d+) bytes in ([\d.]+) s")


def _spec(data: Path, name: str) -> str:
    return f"""\
name = "{name}"
mode = "single"
[model]
arch = "char_transformer"
layers = 1
heads = 1
width = 8
context = 8
[data]
source = "{data}"
format = "tokens16"
vocab_size = 16
batch_size = 4
validation = 0.1
[optim]
steps = 2
[trust]
spot_check_budget = 0
[requirements]
gpu = "none"
"""


def _rates(worker: LocalNode) -> list[float]:
    """Mbit/s of each of the worker's fetches of a job's data, in order, from its log."""
    found = FETCHED.finditer(worker.log_path.read_text())
    return [DATA_BYTES * 8 / float(m[3]) / 1e6 for m in found if int(m[2]) == DATA_BYTES]


def _train(owner: LocalNode, tmp_path: Path, name: str, seed: int) -> None:
    """A job on 4 MiB of fresh token ids, submitted as a user does, to its end."""
    data = tmp_path / f"{name}.bin"
    np.random.default_rng(seed).integers(0, 16, DATA_BYTES // 2).astype("<u2").tofile(data)
    spec = tmp_path / f"{name}.toml"
    spec.write_text(_spec(data, name))
    out = subprocess.run(
        [sys.executable, "-m", "node", "submit", str(spec), "--api", owner.api],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **ONE_THREAD},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = owner.wait_job_end(job_id, timeout=120)
    assert job["state"] == "completed", job


def test_the_download_and_upload_caps_bound_a_real_transfer(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    worker = localnet.add(["--max-download", str(CAP_MBIT_S)])
    localnet.wait_all_see_each_other(timeout=20)

    _train(owner, tmp_path, "download-capped", seed=1)
    # the worker lifts its cap (at once: the caps are read per transfer); the owner
    # caps what it sends instead
    lifted = request_json(worker.api, "PUT", "/api/v1/policy", {"max_download_mbit_s": 0})
    capped = request_json(owner.api, "PUT", "/api/v1/policy", {"max_upload_mbit_s": CAP_MBIT_S})
    assert lifted["max_download_mbit_s"] == 0 and capped["max_upload_mbit_s"] == CAP_MBIT_S
    _train(owner, tmp_path, "upload-capped", seed=2)

    rates = _rates(worker)
    print(f"cap {CAP_MBIT_S} Mbit/s: by the worker's download cap {rates[0]:.2f}, "
          f"by the owner's upload cap {rates[-1]:.2f}")  # fmt: skip
    assert len(rates) == 2, rates
    assert all(0.9 * CAP_MBIT_S <= rate <= 1.1 * CAP_MBIT_S for rate in rates), rates
