"""The runner's `replay` task: the owner's side of a spot check, in its own sandbox.

The request's `replay` table:

    {"init": bool,                          build the state before step 1 and hash it
     "init_claimed": sha256 (optional),      the worker's checkpoint 0, to measure against
     "segments": [{"start": int, "end": int, "from": sha256,
                   "claimed": sha256 (optional), "evaluate": bool (optional)}, ...],
     "final": sha256 (optional)}            the worker's last checkpoint

For each segment the state in blob `from` (the worker's checkpoint at `start`) is
trained on to `end` and hashed as a checkpoint; with `claimed` (the worker's
checkpoint at `end`, for a check across determinism classes) the relative distance
to it is measured too; with `evaluate`, the replayed state's validation metrics (a
sweep trial's report at that step is checked against them). `final` is unpacked into
a weights file exactly as the worker's runner writes one, and evaluated on the
validation split: its sha256 must be the result's, and its metrics are the ones the
owner shows as verified.
The comparisons themselves are the owner's (`node.work.spot_checks`): a runner only
computes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from training.checkpoints import (
    advance,
    initial_state,
    load_checkpoint,
    relative_distance,
    save_checkpoint,
)
from training.elastic_task import BlobFile
from training.errors import SpecError
from training.execute import Prepared, deterministic, emit_started, prepare
from training.fields import Section
from training.loop import Emit, evaluate
from training.optim import make_loss
from training.spec import JobSpec
from training.weights import write_weights

MAX_SEGMENTS = 1000


def run_replay(
    section: Section,
    spec: JobSpec,
    data_file: Path | None,
    out: Path,
    blob_file: BlobFile,
    device: str,
    emit: Emit,
) -> dict[str, Any]:
    began = time.monotonic()
    init = section.boolean("init", False)
    init_claimed = section.string("init_claimed", "", max_len=64)
    segments = [_segment(item, i) for i, item in enumerate(_list(section.get("segments", [])))]
    final = section.string("final", "", max_len=64)
    section.finish()
    run = prepare(spec, data_file, device)
    emit_started(run, emit)
    total = run.summary.total_steps
    result: dict[str, Any] = {"ends": [], "distances": [], "evaluations": [], "replayed_steps": 0}
    scratch = out.parent / "replayed.safetensors"
    with deterministic(spec.seed):
        if init:
            state = initial_state(run)
            result["init_sha256"] = save_checkpoint(
                scratch, state.model, state.optimizer, 0, run.device
            )
            if init_claimed:
                theirs = load_checkpoint(run, blob_file(init_claimed))
                result["init_distance"] = relative_distance(state, theirs)
        for start, end, source, claimed, wanted in segments:
            if not 0 <= start < end <= total:
                raise SpecError(f"request.replay: segment {start}..{end} is not within 0..{total}")
            state = load_checkpoint(run, blob_file(source))
            if state.step != start:
                raise SpecError(f"request.replay: checkpoint {source[:12]} is of step {state.step}")
            advance(run, state, end)
            result["ends"].append(
                save_checkpoint(scratch, state.model, state.optimizer, end, run.device)
            )
            if claimed:
                theirs = load_checkpoint(run, blob_file(claimed))
                result["distances"].append(relative_distance(state, theirs))
            result["evaluations"].append(_evaluate(run, state.model) if wanted else {})
            result["replayed_steps"] += end - start
            emit({"event": "progress", "step": result["replayed_steps"], "total_steps": total})
        if final:
            state = load_checkpoint(run, blob_file(final))
            result["weights_sha256"] = write_weights(out, state.model.state_dict(), run.metadata)
            result["metrics"] = _evaluate(run, state.model)
    scratch.unlink(missing_ok=True)
    result["wall_time_s"] = time.monotonic() - began
    result["device"] = device
    emit({"event": "result", **result})
    return result


def _evaluate(run: Prepared, model: torch.nn.Module) -> dict[str, float]:
    """The validation metrics of `model`, as the training loop reports them."""
    if run.data.val is None:
        return {}
    loss_fn = make_loss(run.summary.loss, run.data.info.task)
    task = run.data.info.task
    return evaluate(model, run.data.val, loss_fn, run.summary.batch_size, run.device, task)


def _list(raw: Any) -> list:
    if not isinstance(raw, list) or len(raw) > MAX_SEGMENTS:
        raise SpecError(f"request.replay.segments must be a list of at most {MAX_SEGMENTS}")
    return raw


def _segment(raw: Any, index: int) -> tuple[int, int, str, str, bool]:
    item = Section(raw, f"request.replay.segments[{index}]")
    start = item.integer("start", lo=0, hi=2**40)
    end = item.integer("end", lo=1, hi=2**40)
    source = item.string("from", max_len=64)
    claimed = item.string("claimed", "", max_len=64)
    wanted = item.boolean("evaluate", False)
    item.finish()
    return start, end, source, claimed, wanted
