"""A GPT program (about 12M parameters) trained through the network against the same
eager PyTorch loop in one process, in the same run: tokens per second, end to end.

    .venv/bin/python -m benchmarks.program_network [--seconds 60] [--width 384] ...

The eager side trains the module itself through meshminer's loop (same batches, same
optimizer, one thread, as a volunteer's runner). The network side submits the exported
module from an owner that does not train to a volunteer, once with `[trust]` off and
once at the defaults (checkpoints kept, a tenth of the segments replayed by the owner),
and counts from the submit to "completed": export excluded, conversion, transfers,
the runner's start, training, the result, the check and the receipt included. The step
count is calibrated so the eager run takes about `--seconds`. Goal: network / eager
tokens per second >= 0.9 with `[trust]` off.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import Result
from node.demo.localnet import ONE_THREAD, LocalNetwork, wait_for
from tests.programs.eager import train_eager
from tests.programs.export import export_pair
from tests.programs.models import GPT
from training.program.job import bind_local
from training.spec.job import load_spec

SPEC = """\
name = "bench-gpt"
placement = "auto"
[model]
arch = "program"
program = "model.pt2"
eval_program = "model.eval.pt2"
[data]
source = "tokens.bin"
format = "tokens16"
batch_size = {batch}
validation = 0.02
[optim]
steps = {steps}
lr = 3e-4
{trust}
"""
TRUST_OFF = "[trust]\ncheckpoints = 0\nspot_check_budget = 0"
#: the worker's log line for a unit's evidence (`node/work/worker.py`)
HELD = re.compile(r"(\d+) checkpoints, at most (\d+) of them held at once \((\d+) MiB\)")


def eager_s(spec: Path, model: torch.nn.Module) -> float:
    """Seconds the eager module takes through the same loop, in this process."""
    began = time.perf_counter()
    train_eager(bind_local(load_spec(spec)), model)
    return time.perf_counter() - began


def network_s(owner_api: str, spec: Path) -> tuple[float, str]:
    """Seconds from the submit to the job's end, and why it failed ("" if it completed)."""
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "node", "submit", str(spec), "--api", owner_api],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", **ONE_THREAD},
    )
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    from node.client import request_json

    def done() -> dict | None:
        job = request_json(owner_api, "GET", f"/api/v1/jobs/{job_id}")
        return job if job["state"] in ("completed", "failed", "cancelled") else None

    job = wait_for(done, 3600, "the job to end", 0.1)
    failed = "" if job["state"] == "completed" else f"{job['state']}: {job.get('reason')}"
    return time.perf_counter() - began, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a volunteer's runner
    folder = Path(tempfile.mkdtemp(prefix="meshminer-program-net-"))
    ids = np.random.default_rng(0).integers(0, args.vocab, 400_000).astype(np.uint16)
    ids.tofile(folder / "tokens.bin")

    def fresh() -> torch.nn.Module:
        torch.manual_seed(0)
        return GPT(args.vocab, args.context, args.width, args.layers, args.width // 64, 0.0)

    export_pair(fresh(), (torch.randint(0, args.vocab, (2, args.context)),), folder)
    parameters = sum(p.numel() for p in fresh().parameters())
    probe = folder / "probe.toml"
    probe.write_text(SPEC.format(batch=args.batch, steps=5, trust=TRUST_OFF))
    per_step = eager_s(probe, fresh()) / 5
    steps = max(20, int(args.seconds / per_step))
    tokens = steps * args.batch * args.context
    specs = {}
    for label, trust in (("trust off", TRUST_OFF), ("default trust", "")):
        specs[label] = folder / f"{label.replace(' ', '-')}.toml"
        specs[label].write_text(SPEC.format(batch=args.batch, steps=steps, trust=trust))

    result = Result(
        "program_network", ["run", "seconds", "tokens/s", "vs eager", "states held", "MiB held"]
    )
    result.meta.update(
        {"parameters": parameters, "steps": steps, "batch": args.batch, "context": args.context}
    )
    eager = eager_s(specs["trust off"], fresh())
    result.add("eager loop, one process", eager, tokens / eager, 1.0, 0, 0)
    with LocalNetwork(folder / "net") as net:
        owner = net.add(["--not-accepting"])
        (worker,) = net.add_many(1)
        net.wait_all_see_each_other(timeout=60)
        for label, spec in specs.items():
            wall, failed = network_s(owner.api, spec)
            held = HELD.findall(worker.log_tail(200)) if label == "default trust" else []
            _, states, mib = map(int, held[-1]) if held else (0, 0, 0)
            if failed:
                result.meta[f"{label} failed"] = failed
                result.add(f"network, {label}: FAILED", wall, 0.0, 0.0, states, mib)
            else:
                result.add(f"network, {label}", wall, tokens / wall, eager / wall, states, mib)
    result.show()
    print(f"saved {result.save()}")


if __name__ == "__main__":
    main()
