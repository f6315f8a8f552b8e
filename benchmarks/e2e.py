"""A job through the network vs `train-local` of the same spec, in the same run.

Wall time from `submit` to "completed" on the owner (offer, sealing, the worker's
training subprocess, heartbeats, the signed result, fetching and checking the
weights) against `meshminer train-local` of the same spec on the same machine. The
spec's step count is calibrated so the local run takes about `--seconds`.
Goal: ratio <= 1.10.

    .venv/bin/python -m benchmarks.e2e [--seconds 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Result
from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, wait_for

SPEC = """\
name = "bench-digits"
mode = "single"
seed = 0
[model]
arch = "mlp"
hidden = [256, 256]
[data]
source = "builtin:digits"
batch_size = 128
validation = 0.2
[optim]
name = "adamw"
lr = 1e-3
steps = {steps}
[requirements]
gpu = "preferred"
max_hours = 2
"""


def train_local_s(spec: Path, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "node", "train-local", str(spec), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=3600,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="meshminer-e2e-"))

    probe = root / "probe.toml"
    probe.write_text(SPEC.format(steps=2000))
    calib = train_local_s(probe, root / "probe.safetensors")
    steps = max(100, int(2000 * args.seconds / calib))
    spec = root / "job.toml"
    spec.write_text(SPEC.format(steps=steps))

    result = Result("e2e", ["round", "train-local s", "network s", "ratio"])
    result.meta.update({"steps": steps, "target_s": args.seconds})
    # the owner does not train its own job: a peer must
    with LocalNetwork(root / "net", ["--publish-interval", "5"]) as net:
        owner = net.add(["--not-accepting"])
        net.add_many(2)
        net.wait_all_see_each_other(timeout=60)
        for i in range(args.rounds):
            local_s = train_local_s(spec, root / f"local{i}.safetensors")
            started = time.perf_counter()
            job_id = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": spec.read_text()})[
                "id"
            ]
            job = _wait_done(owner, job_id)
            network_s = time.perf_counter() - started
            if job["state"] != "completed":
                raise SystemExit(f"job failed: {job['reason']}")
            weights = (root / f"local{i}.safetensors").read_bytes()
            same = job["weights_sha256"]
            result.meta[f"round{i}_bitwise_equal"] = same == _sha(weights)
            result.add(i + 1, local_s, network_s, network_s / local_s)
    ratios = [row[3] for row in result.rows]
    result.meta["best_ratio"] = min(ratios)
    result.meta["median_ratio"] = sorted(ratios)[len(ratios) // 2]
    result.show()
    print(f"saved {result.save()}")


def _wait_done(owner: LocalNode, job_id: str) -> dict:
    def done() -> dict | None:
        job = owner.get(f"/api/v1/jobs/{job_id}")
        return job if job["state"] in ("completed", "failed", "cancelled") else None

    return wait_for(done, 3600, f"job {job_id} to finish", 0.1)


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    main()
