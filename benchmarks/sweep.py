"""Sweeps: what the network adds per trial, and how well the samplers and pruners
search, each against a baseline measured in the same run.

    .venv/bin/python -m benchmarks.sweep [--parts overhead quality asha] [--seeds 3]
                                         [--trials 16] [--overhead-trials 8]

The sweep is the issue's example: the digits MLP, 400 steps, searching `optim.lr`
(1e-4..1e-1, log), `model.hidden` ([32], [64], [128, 64]) and `data.batch_size`
(32, 64, 128) for the lowest `val_loss`.

- **overhead**: the same trials through a 3-node network on loopback (an owner that
  takes no work and two workers; `parallel = 1`, so the sampler is asked the same
  questions in the same order) and in this process (`train-local`, the same sampler
  and seed): seconds added per trial, from submit to the job's end against the local
  loop's wall time. Also whether both ran the same params to the same values. Goal:
  <= 1 s per trial.
- **quality**: the best value after `--trials` trials, for `gp`, `tpe` and `random`
  over `--seeds` seeds, in this process (the sampler does not care where a trial ran).
- **asha**: `tpe` with `pruner = "asha"` against no pruner, same seeds: the steps
  trained in all and the best value each reached.

Prints tables and writes benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.harness import Result, run_parts
from node.client import submit_job
from node.demo.localnet import LocalNetwork, wait_for
from training.run.local import train_local
from training.spec.examples import sweep_toml
from training.spec.job import parse_spec

SPACE = (
    '"optim.lr" = { low = 1e-4, high = 1e-1, log = true }\n'
    '"model.hidden" = { choices = [[32], [64], [128, 64]] }\n'
    '"data.batch_size" = { choices = [32, 64, 128] }'
)
STEPS = 400


def _toml(trials: int, sampler: str = "tpe", pruner: str = "none", seed: int = 0) -> str:
    text = sweep_toml(
        "bench-sweep",
        trials=trials,
        parallel=1,
        steps=STEPS,
        sampler=sampler,
        pruner=pruner,
        space=SPACE,
    )
    return text.replace("seed = 0", f"seed = {seed}", 1)


def _local(root: Path, toml: str) -> tuple[dict[str, Any], float]:
    began = time.perf_counter()
    result = train_local(parse_spec(tomllib.loads(toml)), root / "best.safetensors")
    return result, time.perf_counter() - began


def overhead(root: Path, trials: int) -> Result:
    root.mkdir(parents=True)
    toml = _toml(trials)
    local, local_s = _local(root, toml)
    with LocalNetwork(root / "net") as net:
        net.add(["--not-accepting"])
        net.add_many(2)
        net.wait_all_see_each_other(timeout=60)
        owner = net.nodes[0]
        began = time.perf_counter()
        job_id = submit_job(owner.api, toml, None)["id"]
        job = wait_for(
            lambda: (
                (j := owner.get(f"/api/v1/jobs/{job_id}"))["state"]
                in ("completed", "failed", "cancelled")
                and j
            ),
            3600,
            "the sweep to end",
            interval=0.1,
        )
        network_s = time.perf_counter() - began
    assert job["state"] == "completed", job["reason"]
    by_number = {t["number"]: t for t in job["trials"]}
    same = sum(1 for t in local["trials"] if _same(by_number.get(t["number"]), t))
    workers = {t["worker"] for t in job["trials"]}
    added = (network_s - local_s) / trials
    result = Result(
        "sweep: overhead per trial",
        ["trials", "in-process s", "network s", "added s per trial", "same params and value"],
    )
    result.add(trials, local_s, network_s, added, f"{same}/{trials}")
    result.meta.update(
        {
            "trials": trials,
            "steps": STEPS,
            "local_s": local_s,
            "network_s": network_s,
            "added_s_per_trial": added,
            "same_trials": same,
            "workers_used": len(workers),
        }
    )
    return result


def _same(network: dict[str, Any] | None, local: dict[str, Any]) -> bool:
    return network is not None and (network["params"], network["value"]) == (
        local["params"],
        local["value"],
    )


def quality(root: Path, trials: int, seeds: int) -> Result:
    root.mkdir(parents=True)
    result = Result(
        f"sweep: best val_loss after {trials} trials",
        ["sampler", *(f"seed {s}" for s in range(seeds)), "mean", "vs random"],
    )
    best: dict[str, list[float]] = {}
    for sampler in ("random", "tpe", "gp"):
        best[sampler] = [
            _local(root, _toml(trials, sampler, seed=seed))[0]["best"]["value"]
            for seed in range(seeds)
        ]
    baseline = statistics.mean(best["random"])
    for sampler, values in best.items():
        mean = statistics.mean(values)
        result.add(sampler, *values, mean, mean / baseline)
    result.meta.update({"trials": trials, "seeds": seeds, "best": best})
    return result


def asha(root: Path, trials: int, seeds: int) -> Result:
    root.mkdir(parents=True)
    result = Result(
        f"sweep: asha vs no pruner ({trials} trials, tpe)",
        ["pruner", "steps trained", "best val_loss (mean)", "pruned trials", "steps vs none"],
    )
    runs: dict[str, list[dict[str, Any]]] = {}
    for pruner in ("none", "asha"):
        runs[pruner] = [
            _local(root, _toml(trials, "tpe", pruner, seed))[0] for seed in range(seeds)
        ]
    steps = {p: sum(r["steps"] for r in rs) for p, rs in runs.items()}
    for pruner, rs in runs.items():
        pruned = sum(1 for r in rs for t in r["trials"] if t["state"] == "pruned")
        mean = statistics.mean(r["best"]["value"] for r in rs)
        result.add(pruner, steps[pruner], mean, pruned, steps[pruner] / steps["none"])
    result.meta.update(
        {
            "trials": trials,
            "seeds": seeds,
            "steps": steps,
            "best": {p: [r["best"]["value"] for r in rs] for p, rs in runs.items()},
        }
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parts", nargs="+", default=["overhead", "quality", "asha"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--overhead-trials", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="meshminer-sweep-"))
    runs = {
        "overhead": lambda: overhead(root / "overhead", args.overhead_trials),
        "quality": lambda: quality(root / "quality", args.trials, args.seeds),
        "asha": lambda: asha(root / "asha", args.trials, args.seeds),
    }
    run_parts("sweep", args.parts, runs)


if __name__ == "__main__":
    main()
