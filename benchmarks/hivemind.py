"""meshminer's elastic rounds against hivemind 1.1.12's `hivemind.Optimizer` in
local-updates mode: the same task, the same workers, in the same run.

    .venv/bin/python -m benchmarks.hivemind [--deadline 240]

The task: the elastic demo's character transformer (`char_lm_elastic_toml`, cut to 1
layer) on meshminer's own module docstrings, 3 workers, 8 rounds of 20 inner steps of
AdamW (lr 3e-3) on batches of 16, at meshminer's default `[elastic]` and `[trust]`
settings.

- **meshminer**: real nodes (an owner that does not train, and 3 workers) at their
  default settings in a network namespace of their own (`unshare --net`, as
  `benchmarks.elastic`'s wire part), the job submitted to the owner. Wall time: from
  the first node's start to the job's end (its last round evaluated). Rounds
  applied: the rounds that closed; shares replayed: the owner's timeline notes of a
  spot-checked share.
- **hivemind**: a DHT bootstrap and 3 peers (`benchmarks/hivemind_peer.py`, one
  process each), in a namespace of their own too, run by a virtualenv made for them in
  benchmarks/.venvs/hivemind (created here when missing: the CPU torch that the
  Makefile pins, then hivemind, pynacl and safetensors; never by `make test`). Each
  peer builds the same model from the same seed with meshminer's own code, trains on
  its own third of the training windows, and uses `hivemind.Optimizer(use_local_updates
  =True, delay_state_averaging=False)` with a target batch of 3 x 16 x 20 samples, so
  that one hivemind epoch is one meshminer round; it stops at epoch 8 (`--epochs`; or
  at `--deadline` seconds) and computes the validation loss as meshminer's owner does
  after a round. Wall time: from the bootstrap's start to the last peer's validation
  loss (before the peers' goodbyes and shutdown; `exited_s` in the results runs to
  their exit). Rounds applied: each peer's state averagings that formed a group of 2
  or more. hivemind's epochs hold only about the target batch (peers go on training
  while the first to close an epoch waits for its group, and its peers need not train
  alike): the samples column says what the swarm trained in all. So hivemind runs
  twice: *free*, as just said, and *held* to the task's samples, each peer stopping
  after its 8 x 20 steps (`--max-steps`), whatever epoch it has reached.
- **meshminer, longer**: the job again last, with more rounds (twice the task's, or
  1.5 times the free hivemind's samples), read where it reaches each hivemind run's
  loss (the first round at or below its lowest peer's), and at the free hivemind's
  samples exactly (`at_samples`, between the two rounds around them). Each figure is
  taken when that round's loss was known (the round's `evaluated_at`), with the bytes
  the loopback had sent by then (`benchmarks.loopback.LoopbackTrace`). The default
  outer step does not depend on the job's rounds, so those rounds are a shorter
  job's, bit for bit.

Bytes, for all: what the namespace's loopback transmitted (weights, deltas, data,
checks, gossip, DHT traffic). The goal: meshminer at its default settings takes less
wall time and sends fewer bytes than hivemind, at an equal or lower validation loss,
with every round applied and checked (every delta is decoded, bounded and clipped
before it joins its round; shares are replayed at the default `[trust]` chance, the
"replayed" column).

Prints a table and writes benchmarks/results/hivemind.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.elastic import _network, _run_job
from benchmarks.harness import Result, run_parts
from benchmarks.loopback import LoopbackTrace
from node.demo.elastic import write_corpus
from node.demo.localnet import ONE_THREAD, wait_for
from node.web.filters import to_toml
from training.spec.examples import char_lm_elastic_toml

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".venvs" / "hivemind"
TORCH = "2.13.0"  # the Makefile's pin: the CPU build on a machine without a GPU
HIVEMIND = "1.1.12"
WORKERS, ROUNDS, INNER, BATCH = 3, 8, 20, 16
ROUND_SAMPLES = WORKERS * INNER * BATCH  # what one round trains, all slots together


@dataclass(frozen=True)
class Settings:
    """The hivemind side's knobs: flags of this module and of every peer."""

    epochs: int = ROUNDS  # the epoch each peer trains to
    deadline: float = 240.0  # seconds a peer may train before it stops where it is
    matchmaking: float = 1.0  # `matchmaking_time`: at 0.5 s, groups of 2 left peers out
    averaging_timeout: float = 10.0
    max_steps: int = 0  # steps a peer may take in all (0: until its epoch)

    def flags(self) -> list[str]:
        items = dataclasses.asdict(self).items()
        return [a for key, value in items for a in (f"--{key.replace('_', '-')}", str(value))]


def task(corpus: Path) -> dict[str, Any]:
    """The job, as a parsed spec table."""
    toml = char_lm_elastic_toml(
        str(corpus),
        "hivemind-task",
        workers=WORKERS,
        min_workers=WORKERS,
        inner_steps=INNER,
        rounds=ROUNDS,
    )
    raw = tomllib.loads(toml)
    raw["model"]["layers"] = 1
    raw["data"]["batch_size"] = BATCH
    raw["elastic"].pop("compression", None)  # meshminer's default
    return raw


def ensure_venv() -> Path:
    """The hivemind virtualenv's Python, installed first if missing. torch goes in
    before hivemind, so that hivemind's `torch>=1.9` finds it and pip pulls no other."""
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import hivemind, nacl, safetensors"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, f"torch=={TORCH}"], check=True)
    version = [*probe[:2], "import torch; print(torch.__version__)"]
    before = subprocess.run(version, text=True, capture_output=True, check=True).stdout
    ours = [f"{name}=={importlib.metadata.version(name)}" for name in ("pynacl", "safetensors")]
    subprocess.run([*pip, f"hivemind=={HIVEMIND}", *ours], check=True)
    after = subprocess.run(version, text=True, capture_output=True, check=True).stdout
    if after != before:
        raise RuntimeError(f"installing hivemind replaced torch {before.strip()} by {after}")
    return python


def _in_namespace(flag: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """Run this module with `flag OUT` in a fresh network namespace; its report."""
    child = [sys.executable, "-m", "benchmarks.hivemind", flag, str(out), *extra]
    script = "ip link set lo up && exec " + " ".join(shlex.quote(a) for a in child)
    subprocess.run(["unshare", "--net", "sh", "-c", script], check=True, cwd=ROOT)
    return json.loads(out.read_text())


def meshminer_run(out: Path) -> None:
    """Inside the namespace: the job on real nodes, as `benchmarks.elastic.wire_run`.
    Its time and bytes run to the job's end (the last round evaluated), and to each
    round's evaluation (`evaluated_s`, `bytes_by_round`): when its loss was known."""
    root = out.parent
    raw = json.loads((root / "spec.json").read_text())
    corpus = Path(raw["data"]["source"].removeprefix("builtin:text:"))
    with LoopbackTrace() as trace, _network(root / "net", WORKERS, defaults=True) as net:
        # its end is read from its timeline: asking once a second costs the owner less
        job = _run_job(net, net.nodes[0], to_toml(raw), corpus, churn=False, poll_s=1.0)
    assert job["state"] == "completed", job["reason"]
    notes = [entry["note"] for entry in job["timeline"]]
    ended_at = next(e["t"] for e in job["timeline"] if e.get("state") == "completed")
    evaluated = [r["evaluated_at"] for r in job["rounds"]]
    began_at = trace.began_at
    report = {
        "bytes": trace.sent_by(ended_at),
        "wall_s": ended_at - began_at,
        "val_loss": job["rounds"][-1]["val_loss"],
        "val_losses": [r.get("val_loss") for r in job["rounds"]],
        "evaluated_s": [t - began_at for t in evaluated],
        "bytes_by_round": [trace.sent_by(t) for t in evaluated],
        "rounds": sum(1 for r in job["rounds"] if r["state"] == "closed"),
        "until_round_0_s": job["rounds"][0]["opened_at"] - began_at,
        "round_s": [r["closed_at"] - r["opened_at"] for r in job["rounds"]],
        "shares": sum(1 for note in notes if "; receipt issued" in note),
        "checked": sum(1 for note in notes if " checked; receipt issued" in note),
        "checked_by_round": [
            sum(1 for n in notes if n.startswith(f"round {r['round']}: ") and " checked;" in n)
            for r in job["rounds"]
        ],
    }
    out.write_text(json.dumps(report))


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL whatever is left of the process's session (hivemind's helper processes
    outlive a peer that failed); its exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


def hivemind_run(out: Path, settings: Settings) -> None:
    """Inside the namespace: the bootstrap, then the peers at once; bytes and time from
    the bootstrap's start to the last peer's validation loss (`exited_s`: to the last
    peer's exit, after its goodbye to the others and its shutdown)."""
    root = out.parent
    python = str(VENV / "bin" / "python")
    env = {**ONE_THREAD, **os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    module = [python, "-m", "benchmarks.hivemind_peer"]  # -m: no benchmarks/ on sys.path

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with open(root / f"{name}.log", "wb") as log:
            return subprocess.Popen(
                [*module, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                start_new_session=True,  # its DHT process and p2pd go with it (`_reap`)
            )

    addrs = root / "bootstrap.addrs"
    with LoopbackTrace() as trace:
        boot, peers = start("bootstrap", ["bootstrap", str(addrs)]), []
        try:
            codes = _peers_run(addrs, settings, root, start, peers)
        finally:
            boot.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                boot.wait(timeout=15)
            for proc in [boot, *peers]:
                _reap(proc)
        exited = time.time() - trace.began_at
    found = [root / f"peer{i}.json" for i in range(WORKERS)]
    reports = [json.loads(p.read_text()) if p.exists() else None for p in found]
    # its end: the last peer's validation loss known (the peers then say goodbye)
    ended_at = max((p["done_at"] for p in reports if p is not None), default=time.time())
    report = {
        "bytes": trace.sent_by(ended_at),
        "wall_s": ended_at - trace.began_at,
        "exited_s": exited,
        "exit_codes": codes,
        "peers": reports,
    }
    out.write_text(json.dumps(report))


def _peers_run(
    addrs: Path,
    settings: Settings,
    root: Path,
    start: Callable[[str, list[str]], subprocess.Popen[bytes]],
    peers: list[subprocess.Popen[bytes]],
) -> list[int]:
    """The peers, started once the bootstrap wrote its addresses (into `peers`); their
    exit codes."""
    began = time.monotonic()
    wait_for(lambda: addrs.exists() and addrs.read_text().split(), 120, "the DHT bootstrap")
    common = [f"--peers={WORKERS}", f"--inner-steps={INNER}", *settings.flags()]
    common += [f"--initial-peer={addr}" for addr in addrs.read_text().split()]
    spec = str(root / "spec.json")
    for i in range(WORKERS):
        peers.append(
            start(f"peer{i}", ["peer", spec, str(root / f"peer{i}.json"), f"--index={i}", *common])
        )
    codes = []
    for proc in peers:  # a peer past its deadline only evaluates and says goodbye
        try:
            codes.append(proc.wait(max(1.0, began + settings.deadline + 180 - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(_reap(proc))
    return codes


def _side(folder: Path, raw: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """One system's run of the spec `raw` in a namespace of its own; its report."""
    folder.mkdir()
    (folder / "spec.json").write_text(json.dumps(raw))
    flag = "--meshminer-run" if folder.name.startswith("meshminer") else "--hivemind-run"
    return _in_namespace(flag, folder / "report.json", settings.flags())


def at_samples(values: list[float], samples: float) -> float:
    """A run's figure after `samples` of training (its validation loss, or when that
    was known, or the bytes sent by then), between the rounds' figures (`values[i]`
    after round i, that is after (i + 1) x ROUND_SAMPLES), linearly."""
    at = samples / ROUND_SAMPLES - 1  # in rounds, from the first round's end
    if at <= 0:
        return values[0]
    if at >= len(values) - 1:
        return values[-1]
    low = math.floor(at)
    return values[low] + (at - low) * (values[low + 1] - values[low])


def first_round_at(losses: list[float], target: float) -> int | None:
    """The first round whose validation loss is `target` or lower (None: none)."""
    return next((i for i, loss in enumerate(losses) if loss <= target), None)


def compare(root: Path, settings: Settings) -> Result:
    """Both systems on the task, one after the other, each in its own namespace:
    hivemind twice, free (each peer trains until its last epoch, however many samples
    that takes) and held to the task's samples (each peer stops after its 8 x 20 steps,
    as each meshminer slot does)."""
    ensure_venv()
    root.mkdir(parents=True)
    raw = task(write_corpus(root / "corpus.txt"))
    held = dataclasses.replace(settings, max_steps=ROUNDS * INNER)
    sides = {"meshminer": settings, "hivemind": settings, "hivemind-held": held}
    runs = {}
    for side, knobs in sides.items():
        runs[side] = _side(root / side, raw, knobs)
    # meshminer again, longer: where it reaches each hivemind run's loss, and its loss
    # at the free hivemind's samples (the default outer step does not depend on the
    # job's rounds, so its first rounds are those of a shorter job, bit for bit)
    free = sum(p["samples"] for p in _peers(runs["hivemind"]))
    longer_rounds = max(2 * ROUNDS, math.ceil(1.5 * free / ROUND_SAMPLES))
    longer = {**raw, "elastic": {**raw["elastic"], "rounds": longer_rounds}}
    runs["meshminer-longer"] = long = _side(root / "meshminer-longer", longer, settings)
    mesh = runs["meshminer"]
    result = Result(
        "hivemind: elastic rounds against hivemind.Optimizer(use_local_updates=True)",
        ["system", "wall s", "bytes", "samples", "val loss", "rounds applied", "replayed"],
    )
    result.add(
        "meshminer",
        mesh["wall_s"],
        mesh["bytes"],
        mesh["shares"] * INNER * BATCH,
        mesh["val_loss"],
        f"{mesh['rounds']} of {ROUNDS}",
        f"{mesh['checked']} of {mesh['shares']} shares",
    )
    meta: dict[str, Any] = {
        "workers": WORKERS,
        "rounds": ROUNDS,
        "inner_steps": INNER,
        "batch_size": BATCH,
        "hivemind_settings": dataclasses.asdict(settings),
        "meshminer": mesh,
        "meshminer_longer": long,
    }
    for side, name in (("hivemind", "free"), ("hivemind-held", "held")):
        hive, key = runs[side], side.replace("-", "_")
        peers = _peers(hive)
        late = sum(1 for p in peers if p["hit_deadline"])
        result.add(
            f"hivemind {HIVEMIND}, {name}",
            hive["wall_s"],
            hive["bytes"],
            sum(p["samples"] for p in peers),
            " / ".join(f"{loss:.4f}" for loss in sorted({round(p["val_loss"], 4) for p in peers}))
            or f"none of {WORKERS} peers",
            " / ".join(str(p["averaged"]) for p in peers)
            + f" (epochs {' / '.join(str(p['epoch']) for p in peers)})",
            f"none; {late} of {WORKERS} peers at the deadline",
        )
        meta[key] = hive
        meta[f"{key}_to_loss"] = _to_loss(result, long, hive, name)
        if side == "hivemind":
            series = ("val_losses", "evaluated_s", "bytes_by_round")
            at = {k: at_samples(long[k], free) for k in series}
            result.add(
                "meshminer, at the free hivemind's samples",
                at["evaluated_s"], at["bytes_by_round"], free, f"{at['val_losses']:.4f}", "", "",
            )  # fmt: skip
            meta["at_free_samples"] = at
    result.meta.update(meta)
    return result


def _peers(hive: dict[str, Any]) -> list[dict[str, Any]]:
    """The peers of a hivemind run that wrote their report."""
    return [p for p in hive["peers"] if p is not None]


def _to_loss(result: Result, long: dict[str, Any], hive: dict[str, Any], name: str) -> dict:
    """The row of the longer meshminer run at the first round whose validation loss is
    the hivemind run's (its lowest peer's) or lower; its ratios to that run."""
    target = min((p["val_loss"] for p in _peers(hive)), default=float("nan"))
    row = f"meshminer, to the {name} hivemind's loss"
    reached = first_round_at(long["val_losses"], target)
    if reached is None:
        last = f"not reached in {len(long['val_losses'])} rounds ({long['val_loss']:.4f})"
        result.add(row, float("nan"), float("nan"), long["shares"] * INNER * BATCH, last, "", "")
        return {"target": target, "reached": False}
    wall, sent = long["evaluated_s"][reached], long["bytes_by_round"][reached]
    result.add(
        row,
        wall,
        sent,
        (reached + 1) * ROUND_SAMPLES,
        f"{long['val_losses'][reached]:.4f} (round {reached})",
        f"{reached + 1} of {reached + 1}",
        f"{sum(long['checked_by_round'][: reached + 1])} of {(reached + 1) * WORKERS} shares",
    )
    return {
        "target": target,
        "reached": True,
        "rounds": reached + 1,
        "wall_s": wall,
        "bytes": sent,
        "wall_ratio": wall / hive["wall_s"],
        "bytes_ratio": sent / hive["bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = Settings()
    parser.add_argument("--epochs", type=int, default=default.epochs, help="hivemind's last epoch")
    parser.add_argument(
        "--deadline", type=float, default=default.deadline, help="seconds a peer may train"
    )
    parser.add_argument(
        "--matchmaking", type=float, default=default.matchmaking, help="hivemind's matchmaking_time"
    )
    parser.add_argument("--averaging-timeout", type=float, default=default.averaging_timeout)
    parser.add_argument("--max-steps", type=int, default=default.max_steps, help=argparse.SUPPRESS)
    parser.add_argument("--meshminer-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--hivemind-run", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings = Settings(
        args.epochs, args.deadline, args.matchmaking, args.averaging_timeout, args.max_steps
    )
    if args.meshminer_run:
        meshminer_run(args.meshminer_run)
    elif args.hivemind_run:
        hivemind_run(args.hivemind_run, settings)
    else:
        root = Path(tempfile.mkdtemp(prefix="meshminer-hivemind-"))
        run_parts("hivemind", ["compare"], {"compare": lambda: compare(root / "run", settings)})


if __name__ == "__main__":
    main()
