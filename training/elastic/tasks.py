"""The runner's elastic tasks: one step of `training.elastic.rounds` per runner request.

The request's `elastic` table names the step's inputs (blobs, by sha256, each read
only after its hash is checked) and its outputs (files in the runner's own folder,
beside `out`). See `training.run.runner` for the request as a whole.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from protocol.errors import DecodeError, TooLarge
from protocol.ids import is_id
from protocol.rounds import MAX_ROUND, MAX_SLOT, encode_round_delta
from training.data.info import DataFiles
from training.elastic import rounds as elastic
from training.elastic.starts import eager_start
from training.elastic.updates import rebuild_weights
from training.errors import SpecError, TrainingError
from training.evidence.result_check import model_shapes, remember_written
from training.evidence.writer import NO_BOUND, Hold
from training.model.weights import file_sha256, write_atomic
from training.run.execute import Prepared, emit_started, prepare
from training.run.loop import Emit
from training.spec.fields import Section
from training.spec.job import JobSpec, spec_to_plain

BlobFile = Callable[[str], Path]  # sha256 -> its checked file
NOTICE_POLL_S = 0.005  # how often a share that takes its round's weights looks for them


def run_elastic_task(
    task: str,
    section: Section,
    spec: JobSpec,
    data_file: DataFiles,
    out: Path,
    blob_file: BlobFile,
    device: str,
    emit: Emit,
    checkpoints: bool = False,
    hold: Hold = NO_BOUND,
) -> dict[str, Any]:
    """Run `task` ("elastic_init", "elastic_inner", "elastic_outer" or
    "elastic_validate"); emits and returns its `result`. With `checkpoints`, a share
    keeps its evidence (the training state at every checkpoint step,
    `training.evidence.checkpoints`; never more states at once than `hold` allows)."""
    began = time.monotonic()
    if task == "elastic_init":
        section.finish()
        run = prepare(spec, data_file, device, blob_file)
        emit_started(run, emit)
        result: dict[str, Any] = {"weights_sha256": elastic.init_weights(run, out)}
        remember_written(spec_to_plain(spec), data_file, out)
        result |= model_shapes(spec, data_file, blob_file)
    else:
        job_id = section.string("job_id", max_len=32)
        if not is_id(job_id):
            raise SpecError("request.elastic.job_id must be 16..32 lowercase hex characters")
        round_ = section.integer("round", lo=0, hi=MAX_ROUND - 1)
        weights = section.string("weights", max_len=64)
        if task == "elastic_validate":
            section.finish()
            run = prepare(spec, data_file, device, blob_file)
            state = load_file(str(blob_file(weights)), device="cpu")
            result = {"metrics": elastic.evaluate_weights(run, state)}
        elif task == "elastic_inner":
            folder = out.parent / "checkpoints" if checkpoints else None
            result = _inner(
                section,
                spec,
                data_file,
                out,
                blob_file,
                device,
                emit,
                job_id,
                round_,
                weights,
                folder,
                hold,
            )
        else:
            result = _outer(
                section, spec, data_file, out, blob_file, device, job_id, round_, blob_file(weights)
            )
    result["wall_time_s"] = time.monotonic() - began
    result["device"] = device
    emit({"event": "result", **result})
    return result


def _inner(
    section: Section,
    spec: JobSpec,
    data_file: DataFiles,
    out: Path,
    blob_file: BlobFile,
    device: str,
    emit: Emit,
    job_id: str,
    round_: int,
    weights_sha: str,
    checkpoint_dir: Path | None,
    hold: Hold,
) -> dict[str, Any]:
    slot = section.integer("slot", lo=0, hi=MAX_SLOT - 1)
    state_in = _beside(out, section.string("state_in", None, max_len=4096), "state_in")
    state_out = _beside(out, section.string("state_out", max_len=4096), "state_out")
    rebuild = _rebuild_request(section, out, blob_file) if section.has("update") else None
    start_delta = section.string("start_delta", None, max_len=64)
    notice = _beside(out, section.string("takes", None, max_len=4096), "takes")
    taken = _beside(out, section.string("takes_out", None, max_len=4096), "takes_out")
    section.finish()
    assert state_out is not None
    if (notice is None) != (taken is None):
        raise SpecError("request.elastic.takes and takes_out come together")
    if spec.elastic is not None and (notice is not None) != (
        start_delta is not None and spec.elastic.takes_weights
    ):
        raise SpecError(
            "request.elastic.takes: exactly an eager share (start_delta) of a job whose "
            "elastic.overlap is between 0 and 1 takes its round's weights on its way"
        )
    run = prepare(spec, data_file, device, blob_file)
    emit_started(run, emit)
    if rebuild is None:
        weights = blob_file(weights_sha)
    else:
        base, update, weights = rebuild
        try:
            rebuild_weights(  # an eager share's weights are the round before's
                run,
                base,
                update,
                weights,
                job_id=job_id,
                round_=round_ - 1 if start_delta is not None else round_,
                weights=weights_sha,
            )
        except (DecodeError, TooLarge) as exc:
            raise SpecError(f"request.elastic.update: {exc}") from None
    base, takes = None, None
    if start_delta is not None:  # eager: from the round before's weights and own delta
        base = weights_sha
        if notice is not None and taken is not None:
            takes = partial(_awaited_weights, run, notice, weights, taken, job_id, round_, emit)
        weights = eager_start(
            run,
            weights,
            blob_file(start_delta),
            out.parent / "start.safetensors",
            job_id=job_id,
            round_=round_,
            slot=slot,
        )
    outcome = elastic.inner_round(
        run,
        job_id=job_id,
        weights=weights,
        round_=round_,
        slot=slot,
        state_in=state_in if state_in is not None and state_in.is_file() else None,
        state_out=state_out,
        emit=emit,
        checkpoint_dir=checkpoint_dir,
        hold=hold,
        base_sha256=base,
        takes=takes,
    )
    write_atomic(out, encode_round_delta(outcome.delta))
    result = {
        "steps": outcome.steps,
        "samples": outcome.samples,
        "metrics": {
            "train_loss": outcome.train_loss,
            "train_seconds": outcome.train_seconds,
            "wait_seconds": outcome.wait_seconds,
        },
        "weights_sha256": file_sha256(out),
        **outcome.evidence,
    }
    return result


def _outer(
    section: Section,
    spec: JobSpec,
    data_file: DataFiles,
    out: Path,
    blob_file: BlobFile,
    device: str,
    job_id: str,
    round_: int,
    weights: Path,
) -> dict[str, Any]:
    momentum_sha = section.string("momentum", None, max_len=64)
    deltas = section.get("deltas")
    if not isinstance(deltas, list) or not deltas or len(deltas) > MAX_SLOT:
        raise SpecError(f"request.elastic.deltas must be a list of 1..{MAX_SLOT} blob hashes")
    momentum_out = _beside(out, section.string("momentum_out", max_len=4096), "momentum_out")
    update_out = _beside(out, section.string("update_out", None, max_len=4096), "update_out")
    validate = section.boolean("validate", True)
    bases = section.get("bases", None)
    if bases is not None and (
        not isinstance(bases, list)
        or len(bases) != len(deltas)
        or not all(isinstance(b, str) and len(b) == 64 for b in bases)
    ):
        raise SpecError("request.elastic.bases must name one sha256 for each delta")
    section.finish()
    assert momentum_out is not None
    run = prepare(spec, data_file, device, blob_file)
    metrics = elastic.outer_step(
        run,
        job_id=job_id,
        round_=round_,
        weights=weights,
        momentum=blob_file(momentum_sha) if momentum_sha else None,
        deltas=[blob_file(str(sha)) for sha in deltas],
        out=out,
        momentum_out=momentum_out,
        update_out=update_out,
        validate_weights=validate,
        bases=bases,
    )
    result = {
        "metrics": metrics,
        "weights_sha256": file_sha256(out),
        "momentum_sha256": file_sha256(momentum_out),
    }
    if update_out is not None and update_out.is_file():  # an int8 job's way down
        result["update_sha256"] = file_sha256(update_out)
    return result


def _awaited_weights(
    run: Prepared, notice: Path, base: Path, out: Path, job_id: str, round_: int, emit: Emit
) -> Path:
    """The round's global weights, once the worker's `notice` (JSON: their
    `weights_sha256`, and the file of the owner's `update` from `base`, or of the
    `weights` whole) is there; written to `out`, their hash checked. A `waiting`
    event first when they are not there yet: the worker then asks for them more often."""
    deadline = time.monotonic() + run.spec.requirements.max_hours * 3600
    if not notice.is_file():
        emit({"event": "waiting", "for": "the round's weights"})
    while not notice.is_file():
        if time.monotonic() > deadline:
            raise TrainingError("the round's weights never came (requirements.max_hours)")
        time.sleep(NOTICE_POLL_S)
    try:
        told = json.loads(notice.read_text())
        sha, update, whole = told["weights_sha256"], told.get("update"), told.get("weights")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainingError(f"the notice of the round's weights is unreadable: {exc}") from None
    if update:
        try:
            rebuild_weights(run, base, Path(update), out, job_id=job_id, round_=round_, weights=sha)
        except (DecodeError, TooLarge) as exc:
            raise TrainingError(f"the round's weights update: {exc}") from None
        return out
    if not whole or file_sha256(Path(whole)) != sha:
        raise TrainingError("the round's weights are not those the owner named")
    shutil.copyfile(whole, out)
    return out


def _rebuild_request(section: Section, out: Path, blob_file: BlobFile) -> tuple[Path, Path, Path]:
    """A share whose weights are the round before's (`base`) plus the owner's
    `update`: both blobs, and where the rebuilt weights go (`weights_out`, which the
    worker keeps as the next round's base)."""
    base = blob_file(section.string("base", max_len=64))
    update = blob_file(section.string("update", max_len=64))
    rebuilt = _beside(out, section.string("weights_out", max_len=4096), "weights_out")
    assert rebuilt is not None
    return base, update, rebuilt


def _beside(out: Path, raw: str | None, name: str) -> Path | None:
    """A file the request names in the runner's own folder (None when not named)."""
    if raw is None:
        return None
    path = Path(raw)
    if not path.is_absolute() or "\x00" in raw or path.parent != out.parent or path == out:
        raise SpecError(f"request.elastic.{name} must be a file in {out.parent}, beside out")
    return path
