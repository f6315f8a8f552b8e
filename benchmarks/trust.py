"""Spot checks: how fast a worker that skips steps is caught, at what cost, and
whether an honest one is ever flagged.

    .venv/bin/python -m benchmarks.trust [--parts detect network robust]
                                         [--units 100] [--steps 200]

The unit is the digits MLP ([16] hidden) for `--steps` steps with the default trust
settings (100 checkpoints, a budget of 10% of the segments). A cheating worker skips
a fraction f of its steps (0.5, 0.1, 0.01), spread at random or all in one run of
consecutive steps at a random place, and claims the checkpoint chain that gives
(`tests/adversary/cheats.py`). Each of `--units` units is checked as an owner checks
a worker on probation: each segment drawn on its own (`node.work.trust.commitments`),
replayed by the runner's `replay` task (in this process, without the sandbox) and
compared by `compare_replay`. Reported per case:

- the share of units caught, and the chance to be caught within the first 5 units
  (1 - (1 - p)^5, p the measured per-unit rate);
- the mean number of units a cheat completes unchecked before it is caught;
- verification cost: replayed steps over trained steps, and the replay's wall time
  over the training's (the replay also rebuilds the initial state and evaluates the
  final weights).

Honest units are checked the same way for the false positive rate. Goal: f = 0.1
caught within 5 units with probability >= 99% however the steps are placed, at
<= 10% verification overhead, with zero false positives.

**network**: what the checks cost through two real nodes (an owner that does not
train, one volunteer at one thread), a `char_transformer` job of about 3M and 10M
parameters trained once with `[trust]` off and once at the defaults: the wall time
from submit to "completed" and the most training states the worker held at once
(its runner counts them as it writes each). Goal: <= 3 states, wall <= 1.1x.

**robust**: an elastic job (the digits MLP, 4 workers, 10 rounds of 20 inner steps)
trained through `training.elastic.rounds`'s own inner rounds and outer step, with every
worker honest and with worker 0 sending -10x its delta every round (gradient
ascent), each with `elastic.delta_clip` at its default (2) and off (0): the final
validation loss. What clipping costs when all are honest, and what it saves when
one is not.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path

from benchmarks.harness import Result, run_parts
from node.work.trust import compare_replay, drawn, replay_chance, replay_table
from protocol.rounds import CODE_BITS, encode_round_delta
from protocol.tensors import decode_tensor
from training.elastic.rounds import SIMULATED_JOB_ID, init_weights, outer_step
from training.elastic.simulate import train_share
from training.evidence.steps import checkpoint_steps
from training.model.weights import file_sha256
from training.ops import dequantize_blockwise, encode_delta, from_wire
from training.run.execute import prepare
from training.run.runner import run_request
from training.spec.examples import digits_toml, elastic_toml
from training.spec.job import JobSpec, parse_spec, spec_to_plain

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "adversary"))
from cheats import Claim, honest, skipping  # noqa: E402  (the cheats live with the tests)

FRACTIONS = (0.5, 0.1, 0.01)


def check(
    spec_plain: dict, claim: Claim, rng: random.Random, folder: Path
) -> tuple[bool, float, int]:
    """One owner's spot check of `claim`: (passed, replay wall time, replayed steps)."""
    spec = parse_spec(spec_plain)
    cps = [file_sha256(p) for p in claim.checkpoints]
    blobs = {sha: str(path) for sha, path in zip(cps, claim.checkpoints, strict=True)}
    steps = checkpoint_steps(spec.optim.steps or 0, spec.trust.checkpoints)
    chance = replay_chance(spec_plain, 0)  # each segment drawn as the worker commits to it
    chosen = [i for i in range(len(steps) - 1) if drawn(chance, rng)]
    request = {
        "spec": spec_plain,
        "blobs": blobs,
        "out": str(folder / "replayed.safetensors"),
        "device": "cpu",
        "task": "replay",
        "replay": replay_table(steps, chosen, cps, False),
    }
    began = time.perf_counter()
    replay = run_request(request, lambda event: None)
    elapsed = time.perf_counter() - began
    failure = compare_replay(replay, steps, chosen, cps, False, file_sha256(claim.weights))
    return failure is None, elapsed, int(replay["replayed_steps"])


def units_before_caught(caught: list[bool]) -> float:
    """Mean units completed unchecked before each catch (a caught cheat starts over)."""
    runs, run = [], 0
    for hit in caught:
        if hit:
            runs.append(run)
            run = 0
        else:
            run += 1
    return sum(runs) / len(runs) if runs else float("inf")


def detection(units: int, steps: int, seed: int) -> Result:
    toml = digits_toml("trust", steps=steps, hidden=(16,), lr=3e-3, gpu="none")
    spec = parse_spec(tomllib.loads(toml))
    plain = spec_to_plain(spec)
    rng = random.Random(seed)
    result = Result(
        "trust: detection",
        [
            "worker",
            "units",
            "caught",
            "P(caught in 5)",
            "units before caught",
            "replayed/trained steps",
            "replay/train time",
        ],
    )
    with tempfile.TemporaryDirectory(prefix="meshminer-trust-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        reference = honest(spec, root / "honest")
        train_s = time.perf_counter() - began
        cases = [("honest", None, False)] + [
            (f"skips {f:g} {'together' if t else 'spread'}", f, t)
            for f in FRACTIONS
            for t in (False, True)
        ]
        for name, fraction, together in cases:
            caught, times, replayed = [], [], 0
            for unit in range(units):
                folder = root / f"{name}-{unit}"
                claim = (
                    reference
                    if fraction is None
                    else skipping(spec, folder, fraction, together, rng)
                )
                folder.mkdir(exist_ok=True)
                passed, elapsed, replayed_steps = check(plain, claim, rng, folder)
                caught.append(not passed)
                times.append(elapsed)
                replayed += replayed_steps
            p = sum(caught) / len(caught)
            result.add(
                name,
                units,
                p,
                1 - (1 - p) ** 5,
                units_before_caught(caught),
                replayed / (units * steps),
                sum(times) / len(times) / train_s,
            )
            result.meta[name] = {"caught": caught, "replay_s": times}
            print(f"{name}: caught {sum(caught)}/{len(caught)}", flush=True)
        result.meta |= {"train_s": train_s, "steps": steps, "units": units}
    return result


SIZES = {"3M": (4, 256), "10M": (6, 384)}  # layers, width
NETWORK_SPEC = """\
name = "trust-{size}"
seed = 0
[model]
arch = "char_transformer"
layers = {layers}
heads = 4
width = {width}
context = 64
[data]
source = "corpus.txt"
batch_size = 8
validation = 0.02
[optim]
steps = {steps}
lr = 3e-4
{trust}
"""
TRUST_OFF = "[trust]\ncheckpoints = 0\nspot_check_budget = 0"


def network(steps: int) -> Result:
    from benchmarks.program_network import HELD, network_s
    from node.demo.localnet import ONE_THREAD, LocalNetwork

    result = Result(
        "trust: through the network",
        ["model", "[trust]", "wall s", "vs off", "checkpoints", "states held", "MiB held"],
    )
    folder = Path(tempfile.mkdtemp(prefix="meshminer-trust-net-"))
    corpus = folder / "corpus.txt"
    words = random.Random(0).choices(["the", "a", "mesh", "node", "trains", "weights"], k=400_000)
    corpus.write_text(" ".join(words))
    with LocalNetwork(folder / "net") as net:
        owner = net.add(["--not-accepting"], env=ONE_THREAD)
        worker = net.add(env=ONE_THREAD)
        net.wait_all_see_each_other(timeout=60)
        for size, (layers, width) in SIZES.items():
            off = 0.0
            for label, trust in (("off", TRUST_OFF), ("default", "")):
                spec = folder / f"{size}-{label}.toml"
                spec.write_text(
                    NETWORK_SPEC.format(
                        size=size, layers=layers, width=width, steps=steps, trust=trust
                    )
                )
                wall, failed = network_s(owner.api, spec)
                if failed:
                    raise RuntimeError(f"{size}, trust {label}: {failed}")
                off = off or wall
                held = HELD.findall(worker.log_tail(200)) if label == "default" else []
                count, states, mib = map(int, held[-1]) if held else (0, 0, 0)
                result.add(size, label, wall, wall / off, count, states, mib)
                print(f"{size}, trust {label}: {wall:.1f} s, held {states} ({mib} MiB)", flush=True)
    return result


def elastic_loss(spec: JobSpec, ascent: float) -> float:
    """The final validation loss of `spec` trained round by round in this process,
    worker 0's delta multiplied by `ascent` (1: honest)."""
    elastic = spec.elastic
    assert elastic is not None
    run = prepare(spec, None, "cpu")
    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="meshminer-robust-") as tmp:
        folder = Path(tmp)
        weights, momentum = folder / "global-0.safetensors", None
        init_weights(run, weights)
        for r in range(elastic.rounds):
            deltas = []
            for slot in range(elastic.workers):
                delta = train_share(run, folder, weights, r, slot).delta
                if slot == 0 and ascent != 1:
                    values = dequantize_blockwise(from_wire(decode_tensor(delta.tensor)))
                    bits = CODE_BITS[elastic.compression]
                    delta = replace(delta, tensor=encode_delta(values * ascent, bits=bits))
                path = folder / f"delta-{r}-{slot}.bin"
                path.write_bytes(encode_round_delta(delta))
                deltas.append(path)
            new_weights, new_momentum = folder / f"global-{r + 1}", folder / f"momentum-{r + 1}"
            metrics = outer_step(
                run,
                job_id=SIMULATED_JOB_ID,
                round_=r,
                weights=weights,
                momentum=momentum,
                deltas=deltas,
                out=new_weights,
                momentum_out=new_momentum,
            )
            weights, momentum = new_weights, new_momentum
    return metrics["val_loss"]


def robustness() -> Result:
    result = Result("trust: robust aggregation", ["workers", "delta_clip", "final val_loss"])
    for clip in (2.0, 0.0):
        extra = f"delta_clip = {clip}"
        toml = elastic_toml("robust", workers=4, inner_steps=20, rounds=10, extra=extra)
        spec = parse_spec(tomllib.loads(toml))
        for name, ascent in (("all honest", 1.0), ("worker 0 sends -10x", -10.0)):
            loss = elastic_loss(spec, ascent)
            result.add(name, clip, loss)
            print(f"{name}, delta_clip {clip:g}: val_loss {loss:.4f}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["detect", "robust"])
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--network-steps", type=int, default=200)
    args = parser.parse_args()
    runs = {
        "detect": lambda: detection(args.units, args.steps, args.seed),
        "network": lambda: network(args.network_steps),
        "robust": robustness,
    }
    run_parts("trust", args.parts, runs)


if __name__ == "__main__":
    main()
