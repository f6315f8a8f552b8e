"""The elastic outer step's settings on a short job and on long ones, each against
the default measured in the same run.

    .venv/bin/python -m benchmarks.outer_step [--jobs short many long]

DiLoCo's outer step (Nesterov, `outer_lr` 0.7, `outer_momentum` 0.9) was tuned for
hundreds of rounds of H = 500 on large models; a default must also suit a job of a
few short rounds. Every job here is the elastic demo's character transformer on
meshminer's module docstrings, trained by `train-local` (the network's arithmetic,
every worker of every round, at the job's default compression), once per setting:

- **short**: the hivemind comparison's task: 1 layer, 3 workers, batch 16, 8 rounds
  of H = 20;
- **many**: the same for 100 rounds;
- **long**: the `benchmarks.elastic` comm part's job: 2 layers, 4 workers, batch 32,
  20 rounds of H = 50.

Prints the final validation loss of each (job, setting) and writes
benchmarks/results/outer_step.json. Goal: the default is within 1 % of the best
setting on every job.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from benchmarks.harness import Result, run_parts
from node.demo.elastic import write_corpus
from training.spec.examples import char_lm_elastic_toml
from training.spec.job import ElasticSpec, parse_spec

SHAPE_KEYS = ("workers", "rounds", "inner_steps", "layers", "batch")
JOBS = {
    "short": (3, 8, 20, 1, 16),
    "many": (3, 100, 20, 1, 16),
    "long": (4, 20, 50, 2, 32),
}
#: (outer_lr, outer_momentum): DiLoCo's, plain averaging, and one between
SETTINGS = [(0.7, 0.9), (1.0, 0.0), (1.0, 0.5)]


def _raw(corpus: Path, workers: int, rounds: int, inner: int, layers: int, batch: int) -> dict:
    raw = tomllib.loads(
        char_lm_elastic_toml(
            str(corpus),
            "outer-step",
            workers=workers,
            min_workers=workers,
            inner_steps=inner,
            rounds=rounds,
        )
    )
    raw["model"]["layers"] = layers
    raw["data"]["batch_size"] = batch
    return raw


def outer_steps(root: Path, job: str) -> Result:
    from training.run.local import train_local

    root.mkdir(parents=True)
    corpus = write_corpus(root / "corpus.txt")
    shape = JOBS[job]
    default = (ElasticSpec.outer_lr, ElasticSpec.outer_momentum)
    settings = [default] + [s for s in SETTINGS if s != default]
    result = Result(
        f"outer step: {job} ({shape[1]} rounds of H = {shape[2]}, {shape[0]} workers)",
        ["outer_lr / outer_momentum", "final val loss", "vs default", "seconds"],
    )
    losses: dict[str, Any] = {}
    for lr, momentum in settings:
        raw = _raw(corpus, *shape)
        raw["elastic"].update(outer_lr=lr, outer_momentum=momentum)
        began = time.perf_counter()
        trained = train_local(parse_spec(raw), root / f"{lr}-{momentum}.safetensors")
        loss = trained["rounds"][-1]["val_loss"]
        name = f"{lr} / {momentum}" + (" (default)" if (lr, momentum) == default else "")
        losses[f"{lr}/{momentum}"] = loss
        first = losses[f"{default[0]}/{default[1]}"]
        result.add(name, loss, f"{loss / first - 1:+.1%}", time.perf_counter() - began)
    best = min(losses.values())
    result.meta.update(
        {
            "job": dict(zip(SHAPE_KEYS, shape, strict=True)),
            "default": list(default),
            "val_loss": losses,
            "default_vs_best": losses[f"{default[0]}/{default[1]}"] / best,
        }
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="meshminer-outer-"))
    runs = {job: (lambda job=job: outer_steps(root / job, job)) for job in args.jobs}
    run_parts("outer_step", args.jobs, runs)


if __name__ == "__main__":
    main()
