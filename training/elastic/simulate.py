"""`train-local` of an elastic job: every worker of every round, in one process.

It goes through the files and functions of `training.elastic.rounds` that the
network's runners use (`inner_round` per slot, `outer_step` with its update), so its
weights are the bits a network run with a fixed set of workers ends on, and the bytes
it counts per round are what that run's workers would move.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from protocol.rounds import encode_round_delta
from training.data.info import DataFiles, data_ref
from training.elastic.rounds import (
    SIMULATED_JOB_ID,
    InnerOutcome,
    elastic_of,
    init_weights,
    inner_round,
    outer_step,
)
from training.elastic.starts import eager_start
from training.model.weights import file_sha256
from training.run.execute import Prepared, emit_started, prepare
from training.run.loop import Emit
from training.spec.job import JobSpec
from training.spec.shards import shards_of_slot


def simulate(
    spec: JobSpec,
    out: Path,
    *,
    data_file: DataFiles = None,
    device: str = "cpu",
    emit: Emit | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """`train-local` of an elastic spec: `workers` workers, every round, in this process,
    through the same files and functions a network run uses. Returns the result."""
    elastic = elastic_of(spec)
    emit = emit or (lambda event: None)
    began = time.monotonic()
    run = prepare(spec, data_file, device)  # every shard: the owner's view
    slot_runs = _slot_runs(spec, run, data_file, device)
    emit_started(run, emit)
    rounds: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="meshminer-elastic-") as tmp:
        folder = Path(tmp)
        weights = folder / "global-0.safetensors"
        init_weights(run, weights)
        momentum: Path | None = None
        before: Path | None = None  # the round before's global weights (eager starts)
        kept: list[Path] = []  # the round before's deltas, in slot order
        sizes = [weights.stat().st_size]  # what a worker fetches to hold each round's weights
        eager, takes_weights = elastic.eager, elastic.takes_weights
        for r in range(elastic.rounds):
            round_began = time.monotonic()
            deltas, bases, losses, delta_bytes = [], [], [], 0
            for slot in range(elastic.workers):
                start, base, takes = weights, None, None
                if before is not None and eager:  # from the round before's and a delta
                    start = eager_start(
                        run,
                        before,
                        kept[slot],
                        folder / "start.safetensors",
                        job_id=SIMULATED_JOB_ID,
                        round_=r,
                        slot=slot,
                    )
                    base = file_sha256(before)
                    if takes_weights:  # ... and takes the round's own on its way
                        takes = partial(Path, weights)
                outcome = train_share(slot_runs[slot], folder, start, r, slot, base, takes)
                path = folder / f"delta-{r}-{slot}.bin"
                path.write_bytes(encode_round_delta(outcome.delta))
                deltas.append(path)
                bases.append(outcome.delta.base_sha256)
                losses.append(outcome.train_loss)
                delta_bytes += path.stat().st_size
            new_weights = folder / f"global-{r + 1}.safetensors"
            new_momentum = folder / f"momentum-{r + 1}.safetensors"
            update = folder / f"update-{r + 1}.bin"  # the weights the network's workers rebuild
            metrics = outer_step(
                run,
                job_id=SIMULATED_JOB_ID,
                round_=r,
                weights=weights,
                momentum=momentum,
                deltas=deltas,
                out=new_weights,
                momentum_out=new_momentum,
                update_out=update,
                bases=bases,
            )
            # what each worker fetches: round r's weights (eager, never taking them:
            # round r - 1's, and round 1 nothing, its start built from what it holds)
            if eager and not takes_weights:
                bytes_out = sizes[max(0, r - 1)] * elastic.workers if r != 1 else 0
            else:
                bytes_out = sizes[r] * elastic.workers
            sizes.append(update.stat().st_size if update.exists() else new_weights.stat().st_size)
            for path in [*kept, update, before, momentum]:
                if path is not None:
                    path.unlink(missing_ok=True)
            before, kept = weights, deltas
            weights, momentum = new_weights, new_momentum
            summary = {
                "round": r,
                "workers": elastic.workers,
                "train_loss": sum(losses) / len(losses),
                "bytes_in": delta_bytes,
                "bytes_out": bytes_out,  # the weights (round 0) or their update, to each worker
                "seconds": time.monotonic() - round_began,
                **metrics,
            }
            rounds.append(summary)
            emit(
                {
                    "event": "progress",
                    "step": (r + 1) * elastic.inner_steps,
                    "total_steps": elastic.rounds * elastic.inner_steps,
                    "loss": summary["train_loss"],
                    "samples_per_s": 0.0,
                    "samples": (r + 1) * elastic.inner_steps * run.summary.batch_size,
                }
            )
            if on_round is not None:
                on_round(summary)
        shutil.copyfile(weights, out)
    steps = elastic.rounds * elastic.inner_steps
    result = {
        "steps": steps,
        "samples": steps * run.summary.batch_size * elastic.workers,
        "wall_time_s": time.monotonic() - began,
        "device": run.device.type,
        "metrics": {"train_loss": rounds[-1]["train_loss"], **metrics},
        "weights_sha256": file_sha256(out),
        "rounds": rounds,
    }
    emit({"event": "result", **result})
    return result


def _slot_runs(spec: JobSpec, run: Prepared, data_file: DataFiles, device: str) -> list[Prepared]:
    """What each slot trains on: the whole data set, or of a sharded one the slot's
    shards, as its worker's runner reads them."""
    elastic = elastic_of(spec)
    if not spec.data.shards:
        return [run] * elastic.workers
    files = data_ref(spec, data_file).shards
    picks = [tuple(shards_of_slot(len(files), elastic.workers, s)) for s in range(elastic.workers)]
    views = {p: prepare(spec, tuple(files[k] for k in p), device) for p in dict.fromkeys(picks)}
    return [views[p] for p in picks]


def train_share(
    run: Prepared,
    folder: Path,
    weights: Path,
    round_: int,
    slot: int,
    base: str | None = None,
    takes: Callable[[], Path] | None = None,
) -> InnerOutcome:
    """Slot `slot`'s share of round `round_` from `weights` (an eager start built from
    the global weights `base`, which `takes` the round's on its way), as the slot's
    worker trains it: from the inner optimizer state the slot kept in `folder` (none
    in its first round), which it leaves there for the slot's next round."""
    state = folder / f"inner-{slot}.safetensors"
    kept = folder / f"inner-{slot}-next.safetensors"
    outcome = inner_round(
        run,
        job_id=SIMULATED_JOB_ID,
        weights=weights,
        round_=round_,
        slot=slot,
        state_in=state if state.exists() else None,
        state_out=kept,
        emit=lambda event: None,
        base_sha256=base,
        takes=takes,
    )
    kept.replace(state)
    return outcome
