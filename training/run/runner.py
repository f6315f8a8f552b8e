"""The sandboxed training subprocess: `python -m training.run.runner`.

The daemon starts one runner per task and writes ONE msgpack request to its stdin:

    {"spec": <spec_to_plain output, with a blob: or builtin: source>,
     "blobs": {sha256: absolute path of that blob's file},
     "out": "/abs/path/weights.safetensors",
     "device": "auto" | "cpu" | "cuda",          (default "auto")
     "gpu_memory_fraction": float in (0, 1],     (default 1.0)
     "gpus": [int, ...],                         (CUDA devices it may use; default all)
     "memory_limit_mb": int >= 0,                (default 0: no limit)
     "isolation": {"cpu_seconds": int >= 0, "disk_quota_bytes": int >= 0,
                   "parent_pid": int},           (optional; see training.run.isolation)
     "task": "train" | "replay" | "elastic_init" | "elastic_inner" | "elastic_outer"
             | "elastic_validate" | "model_shapes",
     "checkpoints": bool,                        (train, elastic_inner: keep the evidence)
     "hold": {"states": int >= 0, "floor_bytes": int >= 0},
                                                 (how many checkpoints on disk at once)
     "resume": {"state": sha256, "step": int}    (train: go on from that checkpoint)
     "final_validation": bool,                   (train: evaluate the weights at the
                                                 end; default true)
     "replay": {...},                            (the replay task's segments)
     "elastic": {...}}                           (the elastic tasks' files; see below)

`train` (the default) trains a whole job; with `checkpoints`, it (and `elastic_inner`,
for a round's share) writes the training state every k steps into `out`'s folder and
lists their sha256 in its result (`training.evidence.checkpoints`). `replay` is the
owner's spot check of such a result, of either kind (`training.evidence.replay`). The
elastic tasks are the steps of `training.elastic.rounds`: `elastic_init` writes round
0's global weights to `out` (its result also holds `delta_numel`, one delta's length);
`elastic_inner` trains one share ({"job_id", "round", "slot", "weights": sha256,
"state_in": path (optional), "state_out": path}) and writes its `RoundDelta` to `out`;
`elastic_outer` ({"job_id", "round", "weights": sha256, "momentum": sha256 (optional),
"deltas": [sha256, ...], "momentum_out": path, "update_out": path (optional),
"validate": bool (default true)}) writes the next global weights to `out`;
`elastic_validate` ({"job_id", "round", "weights": sha256}) only evaluates global
weights (the owner's, off the rounds' path). Every path is in `out`'s folder, every
input a blob. `model_shapes`, for a job of any mode, writes nothing: its result is
the model's shapes the owner checks results against
(`training.evidence.result_check.model_shapes`), counted here so that the owner's
daemon never imports torch to build the model.

It answers with JSON lines on stdout (`isolation`, `note` for each thing the node
should log, such as no CUDA where a GPU is, then `started`, `progress`, `result`; or
`error` and exit code 1) and writes the weights to `out` only on success. Everything in the
request is checked before torch is imported, so a bad request fails in a fraction of
a second. A runner forked by `training.run.forkserver` has torch imported already; it
is otherwise the same: it reads one request, isolates itself, runs it. A runner
never reads a file the request does not name as a blob, and verifies each blob's
sha256 before reading it.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TextIO, get_args

from protocol import Limits, ProtocolError, decode
from protocol.rounds import MAX_SLOT
from training.budget import validate_for_submit
from training.data.info import DataFiles
from training.errors import SpecError, TrainingError
from training.spec.fields import Section
from training.spec.job import JobSpec, parse_spec
from training.spec.shards import shard_shas, shards_of_slot

MAX_REQUEST_BYTES = 1024 * 1024
REQUEST_LIMITS = Limits(
    max_bytes=MAX_REQUEST_BYTES,
    max_depth=12,
    max_container_len=4096,
    max_str_len=64 * 1024,
    max_bin_len=0,
)
_SHA256 = re.compile(r"[0-9a-f]{64}")
Task = Literal[
    "train",
    "replay",
    "elastic_init",
    "elastic_inner",
    "elastic_outer",
    "elastic_validate",
    "model_shapes",
]
TASKS: tuple[str, ...] = get_args(Task)


class RequestError(ValueError):
    """The runner request itself (not the spec in it) is malformed."""


def run_request(request: dict, emit: Callable[[dict], None], *, apply_limits: bool = False) -> dict:
    """Check and run one request; returns the result (also emitted as a `result` event).

    `apply_limits` sets the process-wide memory and GPU limits; only the subprocess
    entry point sets it, since in-process it would bind the caller.
    Raises `RequestError`, `SpecError` or `TrainingError`.
    """
    try:
        section = Section(request, "request")
    except SpecError as exc:
        raise RequestError(str(exc)) from None
    spec_raw = section.get("spec")
    blobs = _blobs(section.get("blobs"))
    out = _out_path(section.get("out"))
    device = section.string("device", "auto", choices=("auto", "cpu", "cuda"))
    fraction = section.number("gpu_memory_fraction", 1.0, lo=0, hi=1, lo_open=True)
    gpus = section.int_list("gpus", None, lo=0, hi=63, max_len=64)
    memory_mb = section.integer("memory_limit_mb", 0, lo=0, hi=2**40)
    task = section.string("task", "train", choices=TASKS)
    elastic = section.table("elastic")
    replay = section.table("replay")
    checkpoints = section.boolean("checkpoints", False)
    held = section.table("hold")
    hold_states = held.integer("states", 0, lo=0, hi=1 << 20)
    hold_floor = held.integer("floor_bytes", 0, lo=0, hi=2**50)
    held.finish()
    resume_table = section.table("resume")
    resume = None
    if section.has("resume"):
        resume = (
            resume_table.string("state", max_len=64),
            resume_table.integer("step", lo=1, hi=2**40),
        )
    resume_table.finish()
    final_validation = section.boolean("final_validation", True)
    isolation = section.table("isolation")
    cpu_seconds = isolation.integer("cpu_seconds", 0, lo=0, hi=2**40)
    disk_quota = isolation.integer("disk_quota_bytes", 0, lo=0, hi=2**50)
    parent_pid = isolation.integer("parent_pid", 0, lo=0, hi=2**31)
    isolation.finish()
    section.finish()
    if apply_limits:
        _settle_in(out.parent)
    if apply_limits and section.has("isolation"):  # before a byte of the spec is read
        from training.run.isolation import isolate

        report = isolate(
            out.parent,
            list(blobs.values()),
            cpu_seconds=cpu_seconds,
            max_file_bytes=disk_quota,
            parent_pid=parent_pid or None,
        )
        emit({"event": "isolation", **report})

    spec = parse_spec(spec_raw)
    data_file: DataFiles = None
    if spec.data.shards:
        data_file = _shard_files(spec, blobs, _slot_of(task, elastic, replay))
    elif (source := spec.data.parsed).origin == "blob":
        assert source.sha256 is not None
        data_file = _blob_file(blobs, source.sha256)
    elif source.origin != "builtin":
        raise SpecError(
            f"data.source {spec.data.source!r}: a runner reads data only from blobs or "
            "built-in data sets"
        )
    validate_for_submit(spec, data_file)  # before torch is imported

    any_mode = ("replay", "model_shapes")
    if task not in any_mode and (task == "train") != (spec.mode != "elastic"):
        raise RequestError(f"request.task {task!r} does not fit a job of mode {spec.mode!r}")
    if not task.startswith("elastic_") and section.has("elastic"):
        raise RequestError("request.elastic is only for the elastic tasks")
    if checkpoints and task not in ("train", "elastic_inner"):
        raise RequestError("request.checkpoints is only for the train and elastic_inner tasks")
    if task != "replay" and section.has("replay"):
        raise RequestError("request.replay is only for the replay task")
    if task != "train" and resume is not None:
        raise RequestError("request.resume is only for the train task")

    blob_file = functools.partial(_blob_file, blobs)  # every input blob, sha256 checked
    if task == "model_shapes":  # on torch's meta device: no limits, no device
        from training.evidence.result_check import model_shapes

        result = model_shapes(spec, data_file, blob_file)
        emit({"event": "result", **result})
        return result

    if apply_limits and gpus is not None:  # read when CUDA starts, which is not yet
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)

    from training.evidence.writer import Hold
    from training.run.execute import resolve_device, run_job
    from training.run.sandbox import limit_gpu_memory, limit_memory

    target = resolve_device(device)
    if spec.requirements.gpu == "required" and target.type != "cuda":
        raise TrainingError("requirements.gpu is required, but this run has no CUDA device")
    notes = []
    if device == "auto" and target.type == "cpu" and Path("/dev/nvidiactl").exists():
        notes.append("an NVIDIA GPU is here, but CUDA did not start: training on the CPU")
    if apply_limits:
        notes += [n for n in (limit_memory(memory_mb, target.type),) if n]
        limit_gpu_memory(fraction, target)
    for note in notes:  # the node logs them, whatever the task
        emit({"event": "note", "message": note})
    if task == "train":
        folder = out.parent / "checkpoints" if checkpoints else None
        return run_job(
            spec,
            data_file,
            out,
            device=target.type,
            emit=emit,
            notes=notes,
            checkpoint_dir=folder,
            hold=Hold(hold_states, hold_floor),
            locate=blob_file,
            resume=(blob_file(resume[0]), resume[1]) if resume else None,
            final_validation=final_validation,
        )
    if task == "replay":
        from training.evidence.replay import run_replay

        return run_replay(replay, spec, data_file, out, blob_file, target.type, emit)
    from training.elastic.tasks import run_elastic_task

    return run_elastic_task(
        task,
        elastic,
        spec,
        data_file,
        out,
        blob_file,
        target.type,
        emit,
        checkpoints,
        Hold(hold_states, hold_floor),
    )


def _slot_of(task: str, elastic: Section, replay: Section) -> int | None:
    """The data slot a share's task trains (or replays), read ahead of the task's own
    checks to pick its shards; None for the owner's tasks, which read every shard."""
    if task == "elastic_inner":
        raw = elastic.raw.get("slot")
    elif task == "replay" and isinstance(replay.raw.get("share"), dict):
        raw = replay.raw["share"].get("slot")
    else:
        return None
    if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw < MAX_SLOT:
        raise RequestError(f"request: a share's slot must be 0..{MAX_SLOT - 1}, got {raw!r}")
    return raw


def _shard_files(spec: JobSpec, blobs: dict[str, Path], slot: int | None) -> tuple[Path, ...]:
    """The shard files this task reads, each checked against its sha256."""
    shas = shard_shas(spec.data.shards)
    assert spec.elastic is not None  # shards are for elastic jobs (parse_spec)
    picked = (
        range(len(shas)) if slot is None else shards_of_slot(len(shas), spec.elastic.workers, slot)
    )
    return tuple(_blob_file(blobs, shas[k]) for k in picked)


def _blobs(raw: Any) -> dict[str, Path]:
    if not isinstance(raw, dict):
        raise RequestError("request.blobs must be a map of sha256 -> absolute path")
    blobs = {}
    for sha, path in raw.items():
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise RequestError(f"request.blobs: key {sha!r} is not a lowercase sha256 hex")
        if not isinstance(path, str) or not Path(path).is_absolute() or "\x00" in path:
            raise RequestError(f"request.blobs[{sha}] must be an absolute path")
        blobs[sha] = Path(path)
    return blobs


def _blob_file(blobs: dict[str, Path], sha256: str) -> Path:
    from training.model.weights import file_sha256

    if sha256 not in blobs:
        raise RequestError(f"the spec names blob {sha256}, which request.blobs lacks")
    path = blobs[sha256]
    if not path.is_file():
        raise RequestError(f"request.blobs[{sha256}]: no file at {path}")
    if file_sha256(path) != sha256:
        raise RequestError(f"request.blobs[{sha256}]: the file's sha256 does not match")
    return path


def _out_path(raw: Any) -> Path:
    if not isinstance(raw, str) or not raw or "\x00" in raw or not Path(raw).is_absolute():
        raise RequestError("request.out must be an absolute file path")
    out = Path(raw)
    if not out.parent.is_dir():
        raise RequestError(f"request.out: folder {out.parent} does not exist")
    if out.is_dir():
        raise RequestError(f"request.out: {out} is a folder")
    return out


def _emitter(stream: TextIO) -> Callable[[dict], None]:
    lock = threading.Lock()  # checkpoints are written, and told of, by a thread of their own

    def emit(event: dict) -> None:
        line = json.dumps(event, allow_nan=False) + "\n"
        with lock:
            stream.write(line)
            stream.flush()

    return emit


def _settle_in(folder: Path) -> None:
    """Make the unit's folder this process's working directory, home and tmp."""
    os.chdir(folder)
    os.environ["HOME"] = os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None


def main() -> int:
    """Read one request from stdin, run it, report on stdout; 0 on success, else 1."""
    events = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the event stream
    emit = _emitter(events)
    try:
        raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        if len(raw) > MAX_REQUEST_BYTES:
            raise RequestError(f"the request is over {MAX_REQUEST_BYTES} bytes")
        request = decode(raw, REQUEST_LIMITS)
        if not isinstance(request, dict):
            raise RequestError("the request must be a msgpack map")
        run_request(request, emit, apply_limits=True)
    except ProtocolError as exc:
        emit({"event": "error", "message": f"request: {exc}"})
        return 1
    except (RequestError, SpecError, TrainingError) as exc:
        emit({"event": "error", "message": str(exc)})
        return 1
    except MemoryError:
        emit({"event": "error", "message": "ran out of memory (request.memory_limit_mb)"})
        return 1
    except Exception as exc:  # a bug or an unforeseen library error: report, never hang
        traceback.print_exc()
        text = str(exc).lower()
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # RLIMIT_FSIZE
            emit({"event": "error", "message": "the unit wrote a file over its disk quota"})
        elif isinstance(exc, RuntimeError) and (
            "out of memory" in text or "allocate memory" in text
        ):
            emit({"event": "error", "message": f"ran out of memory: {str(exc)[:500]}"})
        else:
            emit({"event": "error", "message": f"internal error: {type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
