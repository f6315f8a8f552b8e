"""Elastic rounds: communication, churn and utilisation, each against a baseline
measured in the same run.

    .venv/bin/python -m benchmarks.elastic [--parts comm churn util util-gpt wire] [--workers 4]
                                           [--rounds 20] [--inner-steps 50]

The job is the elastic demo's: a small character transformer on meshminer's own
module docstrings (`training.spec.examples.char_lm_elastic_toml`).

- **comm**: elastic rounds (H = `--inner-steps`) against synchronous data parallel
  that averages fp32 gradients every step, with the same workers, per-worker batch
  and total samples. All run in this process (`train-local`): the elastic ones
  simulate every worker of every round with the network's arithmetic; the baseline
  trains one model on the workers' batches together (the mean of W gradients over W
  batches is the gradient of their union). Bytes: what a ring all-reduce of the fp32
  gradients sends per step, 2 (W - 1) x 4 n over all workers, against what elastic
  rounds move: every worker's delta up, and down the fp32 global weights in round 0
  and each later round's update (`training.elastic.updates`), once with each
  `elastic.compression` (fp32, int8 and int4 both ways). Goals, for the default
  compression: >= 200x fewer bytes than the baseline; final validation loss within
  2 % of the fp32 elastic run's.
- **churn**: real nodes on loopback, the same job with fixed membership and with
  churn (one worker SIGKILLed in round 1, a new node started two rounds later); the
  final validation loss of each and their ratio.
- **util**: real nodes on loopback, one worker per core: each worker's time in inner
  steps (`train_seconds` in its co-signed receipts) over the job's wall time from
  round 0's opening to the last round's close, at H = 50 and H = 200, with every
  share spot-checked (the default) and with spot checks off; and the same for
  rounds 1 and on, from the offer of the first of their shares (the steady state,
  without round 0's cold start, each worker's runner importing torch). Goal: >= 0.9
  at H = 200.
- **util-gpt**: the same at H = 200 (`--gpt-inner-steps`) for the program GPT (10.7M
  parameters, exported as a user would) on the corpus's bytes sharded one shard per
  worker (`--gpt-rounds`). On a GPU the workers share it; `--util-runs default` runs
  the defaults alone.
- **wire**: real nodes (an owner that does not train, 3 workers) in a network
  namespace of their own, 8 rounds of 20 inner steps, trained once at the default
  `[trust]` and once with checks off: every byte the nodes send one another (the
  namespace's loopback counter: weights, deltas, data, checks, heartbeats, gossip)
  and the final validation loss. Goal: checks add at most half the bytes (<= 1.5x).

Prints tables and writes benchmarks/results/elastic.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.harness import Result, run_parts
from benchmarks.loopback import loopback_bytes
from node.client import submit_job
from node.demo.elastic import write_corpus
from node.demo.localnet import LocalNetwork, LocalNode, wait_for
from protocol.receipts import open_receipt, parse_cosigned
from training.spec.examples import char_lm_elastic_toml
from training.spec.job import parse_spec


def _spec(corpus: Path, workers: int, rounds: int, inner: int, min_workers: int, width: int) -> str:
    return char_lm_elastic_toml(
        str(corpus),
        "bench-elastic",
        workers=workers,
        min_workers=min_workers,
        inner_steps=inner,
        rounds=rounds,
        width=width,
    )


COMPRESSIONS = ("none", "int8", "int4")


def communication(root: Path, workers: int, rounds: int, inner: int, width: int) -> Result:
    from safetensors import safe_open

    from training.run.local import train_local

    root.mkdir(parents=True)
    corpus = write_corpus(root / "corpus.txt")
    raw = tomllib.loads(_spec(corpus, workers, rounds, inner, workers, width))
    default = parse_spec(raw).elastic.compression
    baseline_raw = {k: v for k, v in raw.items() if k != "elastic"}
    baseline_raw["mode"] = "single"
    baseline_raw["data"] = {**raw["data"], "batch_size": raw["data"]["batch_size"] * workers}
    baseline_raw["optim"] = {**raw["optim"], "steps": rounds * inner}
    began = time.perf_counter()
    baseline = train_local(parse_spec(baseline_raw), root / "sync.safetensors")
    baseline_s = time.perf_counter() - began
    runs: dict[str, dict[str, Any]] = {}
    for compression in COMPRESSIONS:
        weights = root / f"{compression}.safetensors"
        began = time.perf_counter()
        spec = parse_spec({**raw, "elastic": {**raw["elastic"], "compression": compression}})
        trained = train_local(spec, weights)
        runs[compression] = {
            "seconds": time.perf_counter() - began,
            "val_loss": trained["rounds"][-1]["val_loss"],
            "up": sum(r["bytes_in"] for r in trained["rounds"]),  # every worker's delta
            "down": sum(r["bytes_out"] for r in trained["rounds"]),  # weights, then updates
        }
    with safe_open(str(weights), "pt") as f:
        numel = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    sync_bytes = rounds * inner * 2 * (workers - 1) * 4 * numel
    exact_loss = runs["none"]["val_loss"]
    result = Result(
        "elastic: communication at equal quality",
        ["run", "final val loss", "vs fp32 elastic", "bytes", "fewer than sync DP"],
    )
    s_loss = baseline["metrics"]["val_loss"]
    result.add(f"sync DP, fp32 gradients every step ({workers} workers)", s_loss, "", sync_bytes, 1)
    for compression, run in runs.items():
        total = run["up"] + run["down"]
        run["bytes"], run["bytes_ratio"] = total, sync_bytes / total
        run["val_loss_vs_uncompressed"] = run["val_loss"] / exact_loss
        name = "fp32" if compression == "none" else compression
        mark = " (default)" if compression == default else ""
        result.add(
            f"elastic H={inner}, {name} both ways{mark}",
            run["val_loss"],
            f"{run['val_loss_vs_uncompressed']:.4f}",
            total,
            f"{run['bytes_ratio']:.1f}x",
        )
    chosen = runs[default]
    result.meta.update(
        {
            "workers": workers,
            "rounds": rounds,
            "inner_steps": inner,
            "numel": numel,
            "compression": default,
            "sync_bytes": sync_bytes,
            "sync_seconds": baseline_s,
            "val_loss_sync": s_loss,
            "runs": runs,
            "bytes_ratio": chosen["bytes_ratio"],
            "val_loss_vs_uncompressed": chosen["val_loss_vs_uncompressed"],
        }
    )
    return result


def _run_job(
    net: LocalNetwork,
    owner: LocalNode,
    spec: str | Path,
    corpus: Path,
    churn: bool,
    poll_s: float = 0.2,
) -> dict[str, Any]:
    """Submit `spec` (TOML text on `corpus`, or a spec file that `meshminer submit`
    uploads with the files it names) and wait for the job's end, asking the owner
    every `poll_s` (each answer is the whole job, its timeline and rounds: JSON the
    owner's CPU makes while the job trains)."""
    if isinstance(spec, Path):
        out = subprocess.run(
            [sys.executable, "-m", "node", "submit", str(spec), "--api", owner.api],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    else:
        job_id = submit_job(owner.api, spec, corpus)["id"]

    def rounds() -> list[dict[str, Any]]:
        return owner.get(f"/api/v1/jobs/{job_id}")["rounds"]

    if churn:
        wait_for(lambda: (r := rounds()) and r[-1]["round"] >= 1, 600, "round 1 to open")
        victim = net.nodes[-1]
        victim.stop(signal.SIGKILL)
        killed_in = rounds()[-1]["round"]
        wait_for(
            lambda: len([r for r in rounds() if r["state"] == "closed"]) >= killed_in + 2,
            900,
            "two more rounds",
        )
        net.add()
    return wait_for(
        lambda: (
            (j := owner.get(f"/api/v1/jobs/{job_id}"))["state"]
            in ("completed", "failed", "cancelled")
            and j
        ),
        3600,
        "the job to end",
        poll_s,
    )


def _network(root: Path, workers: int, defaults: bool = False) -> LocalNetwork:
    """An owner that does not train and `workers` workers, all seeing each other. The
    nodes notice a worker that left within seconds (ads every second, a 5 s peer TTL,
    a 3 s lease), as the churn part needs, unless `defaults`: every node setting at its
    default, and ready once the owner sees the workers (as a user submits a job once
    their node lists its peers; the workers learn of each other later)."""
    net = LocalNetwork(root, [] if defaults else ["--publish-interval", "1", "--peer-ttl", "5"])
    owner = net.add(["--not-accepting", *([] if defaults else ["--lease", "3"])])
    net.add_many(workers)
    if defaults:
        others = {node.peer_id for node in net.nodes[1:]}
        wait_for(lambda: others <= owner.peer_ids(), 60, "the owner to see the workers", 0.1)
    else:
        net.wait_all_see_each_other(timeout=60)
    return net


def churn(root: Path, workers: int, rounds: int, inner: int, width: int) -> Result:
    root.mkdir(parents=True)
    corpus = write_corpus(root / "corpus.txt")
    spec = _spec(corpus, workers, rounds, inner, max(1, workers - 1), width)
    losses = {}
    for scenario in ("fixed", "churn"):
        with _network(root / scenario, workers) as net:
            job = _run_job(net, net.nodes[0], spec, corpus, scenario == "churn")
        assert job["state"] == "completed", job["reason"]
        losses[scenario] = (job["rounds"][-1]["val_loss"], job["rounds"])
    result = Result("elastic: churn cost", ["membership", "final val loss", "ratio"])
    result.add("fixed", losses["fixed"][0], 1.0)
    result.add("churn", losses["churn"][0], losses["churn"][0] / losses["fixed"][0])
    result.meta.update(
        {
            "workers": workers,
            "rounds": rounds,
            "inner_steps": inner,
            "val_loss_fixed": losses["fixed"][0],
            "val_loss_churn": losses["churn"][0],
            "workers_per_round_churn": [len(r["workers"]) for r in losses["churn"][1]],
        }
    )
    return result


def _train_seconds(node: LocalNode, job_id: str, units: set[str] | None = None) -> float:
    """The inner steps' seconds in `node`'s co-signed receipts for `job_id` (of `units`
    only, when given)."""
    total = 0.0
    for entry in node.get("/api/v1/ledger?limit=1000")["entries"]:
        if entry["kind"] == "work_done" and entry["job_id"] == job_id:
            receipt = open_receipt(parse_cosigned(bytes.fromhex(entry["payload"])).receipt)
            if units is None or receipt.unit_id in units:
                total += float(receipt.metrics.get("train_seconds", 0.0))
    return total


def _later_units(owner: LocalNode, job_id: str) -> tuple[set[str], float]:
    """The job's units of rounds 1 and on, and when the first of them was offered (an
    eager share starts before its round opens), from the owner's node.db (read-only)."""
    uri = f"file:{owner.data_dir / 'node.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(
            "SELECT unit_id, started_at FROM units WHERE job_id = ? AND round >= 1", (job_id,)
        ).fetchall()
    return {row[0] for row in rows}, min(row[1] for row in rows)


UNCHECKED = "\n[trust]\ncheckpoints = 0\nspot_check_budget = 0\n"


GPT_SPEC = """name = "bench-elastic-gpt"
mode = "elastic"
[model]
arch = "program"
program = "model.pt2"
eval_program = "model.eval.pt2"
[data]
shards = [{shards}]
format = "tokens16"
vocab_size = 256
batch_size = 4
validation = 0.05
[optim]
lr = 3e-4
[elastic]
workers = {workers}
min_workers = {workers}
inner_steps = {inner}
rounds = {rounds}
"""


def _gpt_job(folder: Path, corpus: Path, workers: int, rounds: int, inner: int) -> Path:
    """The program GPT (10.7M parameters: width 384, 6 layers, context 64) on the
    corpus's bytes as token ids, one shard per worker; returns its spec file."""
    import numpy as np
    import torch

    from tests.programs.export import export_pair
    from tests.programs.models import GPT

    folder.mkdir(parents=True)
    ids = np.frombuffer(corpus.read_bytes(), dtype=np.uint8).astype(np.uint16)
    for k, part in enumerate(np.array_split(ids, workers)):
        part.tofile(folder / f"part-{k}.bin")
    torch.manual_seed(0)
    export_pair(GPT(256, 64, 384, 6, 6, 0.0), (torch.randint(0, 256, (2, 64)),), folder)
    shards = ", ".join(f'"part-{k}.bin"' for k in range(workers))
    spec = folder / "job.toml"
    spec.write_text(GPT_SPEC.format(shards=shards, workers=workers, inner=inner, rounds=rounds))
    return spec


# name -> (elastic.overlap, spot checks): the defaults, no overlap, eager starts never
# taking the round's weights, the defaults without checks
UTILISATION_RUNS = {
    "default": (None, True),
    "no-overlap": (0.0, True),
    "never-take": (1.0, True),
    "unchecked": (None, False),
}


def utilisation(
    root: Path,
    workers: int,
    rounds: int,
    inners: list[int],
    width: int,
    model: str = "char",
    runs: list[str] | None = None,
) -> Result:
    """Each H with each of `runs` (default: all of `UTILISATION_RUNS`): at the
    defaults, without overlapping rounds (`elastic.overlap = 0`), with eager starts
    that never take the round's weights (`overlap = 1`), and with no spot checks; the
    demo's character model, or (`model = "gpt"`) the program GPT on sharded data. A
    worker's utilisation is its shares' `train_seconds`, which leave out any wait for
    the round's weights. Each run's row is printed as it ends (a run cut short by a
    time limit keeps those before it)."""
    root.mkdir(parents=True)
    corpus = write_corpus(root / "corpus.txt")
    result = Result(
        f"elastic: worker utilisation ({model})",
        ["H", "overlap", "spot checks", "round s", "utilisation per worker", "from round 1"],
    )
    for inner in inners:
        for overlap, checked in (UTILISATION_RUNS[run] for run in runs or UTILISATION_RUNS):
            starts = "default" if overlap is None else f"{overlap:g}"
            name = f"h{inner}-{starts}-{'checked' if checked else 'unchecked'}"
            with _network(root / name, workers) as net:
                job_file = None  # the GPT's spec names its files relative to its folder
                if model == "gpt":
                    job_file = _gpt_job(root / f"{name}-job", corpus, workers, rounds, inner)
                text = (
                    job_file.read_text()
                    if job_file
                    else _spec(corpus, workers, rounds, inner, workers, width)
                )
                if overlap is not None:
                    text = text.replace("[elastic]\n", f"[elastic]\noverlap = {overlap}\n", 1)
                spec: str | Path = text + ("" if checked else UNCHECKED)
                if job_file:
                    job_file.write_text(str(spec))
                    spec = job_file
                job = _run_job(net, net.nodes[0], spec, corpus, churn=False)
                assert job["state"] == "completed", job["reason"]
                rounds_ = job["rounds"]
                wall = rounds_[-1]["closed_at"] - rounds_[0]["opened_at"]
                units, first = _later_units(net.nodes[0], job["id"])
                later = rounds_[-1]["closed_at"] - first
                shares = [_train_seconds(n, job["id"]) / wall for n in net.nodes[1:]]
                steady = [_train_seconds(n, job["id"], units) / later for n in net.nodes[1:]]
            result.add(
                inner,
                starts,
                "default" if checked else "off",
                wall / rounds,
                ", ".join(f"{s:.2f}" for s in shares),
                ", ".join(f"{s:.2f}" for s in steady),
            )
            result.meta[name] = {"wall_s": wall, "utilisation": shares, "from_round_1": steady}
            print(f"util {name}: {json.dumps(result.meta[name])}", flush=True)
    return result


def wire(root: Path, width: int) -> Result:
    """Each run in a child process in a fresh network namespace (`unshare --net`), so
    that its loopback counts the job's bytes and nothing else's."""
    root.mkdir(parents=True)
    result = Result(
        "elastic: bytes on the wire, checks on and off",
        ["[trust]", "bytes", "final val loss", "shares checked", "seconds"],
    )
    runs = {}
    for checked in (False, True):
        out = root / f"{'checked' if checked else 'unchecked'}.json"
        child = [sys.executable, "-m", "benchmarks.elastic", "--wire-run", str(out)]
        child += ["--width", str(width)] + ([] if checked else ["--unchecked"])
        script = "ip link set lo up && exec " + " ".join(shlex.quote(a) for a in child)
        subprocess.run(["unshare", "--net", "sh", "-c", script], check=True)
        runs[checked] = run = json.loads(out.read_text())
        name = "default" if checked else "off"
        result.add(name, run["bytes"], run["val_loss"], run["checked"], run["wall_s"])
    result.meta.update(
        {
            "workers": WIRE_WORKERS,
            "rounds": WIRE_ROUNDS,
            "inner_steps": WIRE_INNER,
            "bytes_checked": runs[True]["bytes"],
            "bytes_unchecked": runs[False]["bytes"],
            "bytes_ratio": runs[True]["bytes"] / runs[False]["bytes"],
            "shares_checked": runs[True]["checked"],
            "shares": runs[True]["shares"],
        }
    )
    return result


WIRE_WORKERS, WIRE_ROUNDS, WIRE_INNER = 3, 8, 20


def wire_run(out: Path, width: int, checked: bool) -> None:
    """One `wire` job, inside its namespace: from the first node's start to the job's
    end, what crossed the loopback."""
    root = out.parent / out.stem
    root.mkdir(parents=True)
    corpus = write_corpus(root / "corpus.txt")
    spec = _spec(corpus, WIRE_WORKERS, WIRE_ROUNDS, WIRE_INNER, WIRE_WORKERS, width)
    spec += "" if checked else UNCHECKED
    before = loopback_bytes()
    began = time.monotonic()
    with _network(root / "net", WIRE_WORKERS) as net:
        job = _run_job(net, net.nodes[0], spec, corpus, churn=False)
        sent = loopback_bytes() - before
    assert job["state"] == "completed", job["reason"]
    notes = [entry["note"] for entry in job["timeline"]]
    report = {
        "bytes": sent,
        "wall_s": time.monotonic() - began,
        "val_loss": job["rounds"][-1]["val_loss"],
        "shares": sum(1 for note in notes if "; receipt issued" in note),
        "checked": sum(1 for note in notes if " checked; receipt issued" in note),
    }
    out.write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parts", nargs="+", default=["comm", "churn", "util", "wire"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner-steps", type=int, default=50)
    parser.add_argument(
        "--net-workers",
        type=int,
        default=os.cpu_count() or 2,
        help="workers in the network runs (default: one per core)",
    )
    parser.add_argument("--net-rounds", type=int, default=6)
    parser.add_argument(
        "--width",
        type=int,
        default=64,
        help="the model's width (wider: longer steps, more bytes per round)",
    )
    parser.add_argument("--gpt-rounds", type=int, default=3, help="util-gpt: rounds")
    parser.add_argument(
        "--gpt-inner-steps", type=int, nargs="+", default=[200], help="util-gpt: each H"
    )
    parser.add_argument(
        "--util-runs",
        nargs="+",
        choices=list(UTILISATION_RUNS),
        help="util, util-gpt: these runs only (default: all)",
    )
    parser.add_argument("--wire-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--unchecked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.wire_run:
        wire_run(args.wire_run, args.width, not args.unchecked)
        return
    root = Path(tempfile.mkdtemp(prefix="meshminer-elastic-"))
    runs = {
        "comm": lambda: communication(
            root / "comm", args.workers, args.rounds, args.inner_steps, args.width
        ),
        "churn": lambda: churn(
            root / "churn", max(3, args.net_workers), args.net_rounds, 50, args.width
        ),
        "util": lambda: utilisation(
            root / "util",
            args.net_workers,
            args.net_rounds,
            [50, 200],
            args.width,
            runs=args.util_runs,
        ),
        "util-gpt": lambda: utilisation(
            root / "util-gpt",
            args.net_workers,
            args.gpt_rounds,
            args.gpt_inner_steps,
            args.width,
            "gpt",
            args.util_runs,
        ),
        "wire": lambda: wire(root / "wire", args.width),
    }
    run_parts("elastic", args.parts, runs)


if __name__ == "__main__":
    main()
