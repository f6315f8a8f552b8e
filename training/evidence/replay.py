"""The runner's `replay` task: the owner's side of a spot check, in its own sandbox.

The request's `replay` table:

    {"init": bool,                          build the state before step 1 and hash it
     "init_claimed": sha256 (optional),      the worker's checkpoint 0, to measure against
     "segments": [{"start": int, "end": int, "from": sha256,
                   "claimed": sha256 (optional), "evaluate": bool (optional)}, ...],
     "final": sha256 (optional),            the worker's last checkpoint
     "final_replayed": bool (optional),     a share's: its delta from the replayed
                                             segment that ends it, not from `final`
     "share": {"job_id", "round", "slot", "weights": sha256,
               "start_delta": sha256 (optional),
               "takes": sha256 (optional)} (optional)}
                                             an elastic round's share, not a whole run

For each segment the state in blob `from` (the worker's checkpoint at `start`) is
trained on to `end` and hashed as a checkpoint; with `claimed` (the worker's
checkpoint at `end`, for a check across determinism classes) the relative distance
to it is measured too, and how many of the replay's own last steps it is away
(`step_ratios`: what a check across device kinds compares); with `evaluate`, the
replayed state's validation metrics (a sweep trial's report at that step is checked
against them). `final` is unpacked into
a weights file exactly as the worker's runner writes one, and evaluated on the
validation split: its sha256 must be the result's, and its metrics are the ones the
owner shows as verified.

A share's chain is its H inner steps on its data slot (`training.elastic.rounds.share_course`).
Its checkpoint 0 is not built from the seed: it is the share's start (the global
`weights`, or with `start_delta` the eager start built from them and that delta:
`training.elastic.starts`), the inner optimizer state the worker brought (taken from
its checkpoint 0: it is the worker's own) and the slot's seeded RNG, so `init`
rebuilds exactly that and hashes it (another start, or weights not the share's:
another hash). An eager share that `takes` its round's weights on its way moves to
them after `takes_weights_at` steps in the replay where the worker did (a segment
starting there starts from the state before the move). `final` is turned into the
share's `RoundDelta` against its start (or the weights it took), as
the worker's runner builds it; its sha256 must be the delta's. With `final_replayed` the delta is
built from the state the replay of the share's last segment ended on instead: when
that state's hash is the worker's last checkpoint (the owner compares), it is the
worker's own, and nothing more needs fetching.

The comparisons themselves are the owner's (`node.work.trust.spot_checks`): a runner only
computes.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from protocol.ids import is_id
from protocol.rounds import MAX_ROUND, MAX_SLOT, encode_round_delta
from training.data.info import DataFiles
from training.elastic.rounds import round_delta, share_course
from training.elastic.starts import eager_start, take_weights
from training.elastic.tasks import BlobFile
from training.errors import SpecError
from training.evidence.checkpoints import (
    Course,
    TrainState,
    advance,
    course_of,
    initial_state,
    load_checkpoint,
    relative_distance,
    save_checkpoint,
    step_ratio,
)
from training.model.weights import file_sha256, write_weights
from training.run.execute import Prepared, deterministic, emit_started, prepare, validate
from training.run.loop import Emit
from training.spec.fields import Section
from training.spec.job import JobSpec

MAX_SEGMENTS = 1000


def run_replay(
    section: Section,
    spec: JobSpec,
    data_file: DataFiles,
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
    final_replayed = section.boolean("final_replayed", False)
    share = _share(section.table("share"), blob_file) if section.has("share") else None
    section.finish()
    if share is not None and init and not init_claimed:
        raise SpecError("request.replay.init_claimed: a share's checkpoint 0 is rebuilt from it")
    if final_replayed and (share is None or final):
        raise SpecError("request.replay.final_replayed: only for a share, and without final")
    if share is not None and spec.elastic is not None:
        takes = share.start_delta is not None and spec.elastic.takes_weights
        if takes != (share.takes is not None):
            raise SpecError(
                "request.replay.share.takes: exactly an eager share of a job whose "
                "elastic.overlap is between 0 and 1 took its round's weights on its way"
            )
    run = prepare(spec, data_file, device, blob_file)
    emit_started(run, emit)
    course = share_course(run, share.slot, share.round) if share else course_of(run)
    total = course.total_steps
    result: dict[str, Any] = {
        "ends": [],
        "distances": [],
        "step_ratios": [],
        "evaluations": [],
        "replayed_steps": 0,
    }
    ended: TrainState | None = None  # the replayed state at the last step, if any
    scratch = out.parent / "replayed.safetensors"

    def load(sha: str, step: int) -> TrainState:
        state = load_checkpoint(run, blob_file(sha), course)
        if state.step != step:
            raise SpecError(f"request.replay: checkpoint {sha[:12]} is of step {state.step}")
        return state

    begins = share.weights if share is not None else None  # the share's start weights
    if share is not None and share.start_delta is not None:
        begins = eager_start(
            run,
            share.weights,
            share.start_delta,
            out.parent / "start.safetensors",
            job_id=share.job_id,
            round_=share.round,
            slot=share.slot,
        )
    with deterministic(spec.seed):
        if init:
            if share is not None:
                assert begins is not None
                state = _share_start(run, load(init_claimed, 0), begins, course)
            else:
                state = initial_state(run, course)
            result["init_sha256"] = save_checkpoint(
                scratch, state.model, state.optimizer, 0, run.device
            )
            if init_claimed:
                theirs = load_checkpoint(run, blob_file(init_claimed), course)
                result["init_distance"] = relative_distance(state, theirs)
        for start, end, source, claimed, wanted in segments:
            if not 0 <= start < end <= total:
                raise SpecError(f"request.replay: segment {start}..{end} is not within 0..{total}")
            state = load(source, start)
            walk = _Walk(run, state, course, _take(run, share, begins, start, end))
            before_last = {}
            if claimed:  # the last step's own movement: the measure across device kinds
                walk.to(end - 1)
                before_last = {k: v.clone() for k, v in state.model.state_dict().items()}
            walk.to(end)
            result["ends"].append(
                save_checkpoint(scratch, state.model, state.optimizer, end, run.device)
            )
            if claimed:
                theirs = load_checkpoint(run, blob_file(claimed), course)
                result["distances"].append(relative_distance(state, theirs))
                result["step_ratios"].append(step_ratio(state, before_last, theirs))
            result["evaluations"].append(validate(run, state.model) if wanted else {})
            result["replayed_steps"] += end - start
            emit({"event": "progress", "step": result["replayed_steps"], "total_steps": total})
            if end == total:
                ended = state
        if final_replayed and ended is None:
            raise SpecError("request.replay.final_replayed: no segment ends the share")
        if (final or final_replayed) and share is not None:
            state = load(final, total) if final else ended
            assert begins is not None
            delta = round_delta(
                run,
                job_id=share.job_id,
                round_=share.round,
                slot=share.slot,
                weights=share.takes or begins,
                trained=state.model.state_dict(),
                base_sha256=file_sha256(share.takes or share.weights),
            )
            result["weights_sha256"] = hashlib.sha256(encode_round_delta(delta)).hexdigest()
        elif final:
            state = load_checkpoint(run, blob_file(final), course)
            result["weights_sha256"] = write_weights(out, state.model.state_dict(), run.metadata)
            result["metrics"] = validate(run, state.model)
    scratch.unlink(missing_ok=True)
    result["wall_time_s"] = time.monotonic() - began
    result["device"] = device
    emit({"event": "result", **result})
    return result


@dataclass(frozen=True)
class _Share:
    job_id: str
    round: int
    slot: int
    weights: Path  # the global weights it starts from
    start_delta: Path | None  # an eager start's delta (`training.elastic.starts`)
    takes: Path | None  # the round's weights an eager start takes on its way


def _share(section: Section, blob_file: BlobFile) -> _Share:
    job_id = section.string("job_id", max_len=32)
    if not is_id(job_id):
        raise SpecError("request.replay.share.job_id must be 16..32 lowercase hex characters")
    round_ = section.integer("round", lo=0, hi=MAX_ROUND - 1)
    slot = section.integer("slot", lo=0, hi=MAX_SLOT - 1)
    weights = blob_file(section.string("weights", max_len=64))
    start_delta = section.string("start_delta", None, max_len=64)
    takes = section.string("takes", None, max_len=64)
    section.finish()
    if takes is not None and start_delta is None:
        raise SpecError("request.replay.share.takes is for an eager start, with start_delta")
    return _Share(
        job_id,
        round_,
        slot,
        weights,
        blob_file(start_delta) if start_delta else None,
        blob_file(takes) if takes else None,
    )


Take = tuple[int, Callable[[TrainState], None]]


def _take(
    run: Prepared, share: _Share | None, begins: Path | None, start: int, end: int
) -> Take | None:
    """Where in the segment `start`..`end` an eager share takes its round's weights
    (`training.elastic.starts.take_weights`), and the move: after step
    `takes_weights_at`, whose checkpoint holds the state before it."""
    if share is None or share.takes is None or begins is None or run.spec.elastic is None:
        return None
    at, taken = run.spec.elastic.takes_weights_at, share.takes
    if not start <= at < end:
        return None
    return at, lambda state: take_weights(run, state.model, begins, taken)


@dataclass
class _Walk:
    """A segment's replay, step by step to where it is asked to go, taking the
    round's weights on its way where the share did."""

    run: Prepared
    state: TrainState
    course: Course
    take: Take | None

    def to(self, step: int) -> None:
        if self.take is not None and self.take[0] <= step:
            advance(self.run, self.state, self.take[0], self.course)
            self.take[1](self.state)
            self.take = None
        advance(self.run, self.state, step, self.course)


def _share_start(run: Prepared, claimed: TrainState, weights: Path, course: Course) -> TrainState:
    """A share's state before step 1: its start `weights`, the inner optimizer state
    the worker brought (from its checkpoint 0), the slot's seeded RNG."""
    from safetensors.torch import load_file

    try:
        claimed.model.load_state_dict(load_file(str(weights), device=str(run.device)))
    except RuntimeError as exc:
        raise SpecError(f"request.replay.share.weights do not fit the model: {exc}") from None
    torch.manual_seed(course.batch_seed)
    return claimed


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
