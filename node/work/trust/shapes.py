"""The shapes of a job's model, which the owner checks results and states against,
counted by a runner on this node instead of the daemon.

Building the model, even on torch's meta device, imports torch and torch._dynamo on
the calling thread: 2.5-3.5 s of CPU holding the daemon's GIL, at a unit's first
heartbeat (the size bound of its checkpoints) or its first result. On a busy 2-core
machine that stalled the event loop long enough for a 4 s lease to expire. The
`model_shapes` runner task counts them in a process of its own, forked by the fork
server when one runs, once per spec and daemon: `result_check.remember_shapes` keeps
the answer, which `expected_tensors` and `delta_numel` then give at once.
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import TYPE_CHECKING, Any

import trio

from node.work.context import WorkContext
from node.work.jobs import new_id
from node.work.run import RunnerRequest, UnitFailed
from training.evidence.result_check import (
    Expected,
    delta_numel,
    expected_tensors,
    known_shapes,
    remember_shapes,
)

if TYPE_CHECKING:
    from training.data.info import DataFiles

log = logging.getLogger(__name__)

SHAPES_HOURS = 0.25  # a model is built on the meta device in seconds

# one count at a time per spec: the heartbeats and results that come meanwhile wait
_counting: trio.lowlevel.RunVar[dict[str, trio.Lock]] = trio.lowlevel.RunVar("shapes")


async def model_shapes(
    ctx: WorkContext, spec: dict[str, Any], data_blobs: list[str], data: DataFiles
) -> tuple[Expected, int]:
    """`expected_tensors` and `delta_numel` of `spec` (a job's or a unit's), whose
    blobs (data, program, init) are `data_blobs` and data files `data`. A runner
    counts them the first time; one that fails leaves it to a thread here, which
    raises what the runner met (a spec whose model cannot be built)."""
    found = known_shapes(spec, data)
    if found is not None:
        return found
    try:
        locks = _counting.get()
    except LookupError:
        locks = {}
        _counting.set(locks)
    key = json.dumps([spec, data_blobs], sort_keys=True, default=str)
    lock = locks.setdefault(key, trio.Lock())
    async with lock:
        found = known_shapes(spec, data)
        if found is None:
            await _count(ctx, spec, data_blobs, data)
            found = known_shapes(spec, data)
        if not lock.statistics().tasks_waiting:
            locks.pop(key, None)
    if found is not None:
        return found
    locate = ctx.blobs.path
    tensors = await trio.to_thread.run_sync(expected_tensors, spec, data, locate)
    return tensors, await trio.to_thread.run_sync(delta_numel, spec, data, locate)


async def _count(
    ctx: WorkContext, spec: dict[str, Any], data_blobs: list[str], data: DataFiles
) -> None:
    task_id = new_id()
    folder = ctx.unit_dir(task_id)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    blobs = {sha: str(ctx.blobs.path(sha)) for sha in data_blobs if ctx.blobs.has(sha)}
    request = RunnerRequest(
        spec, blobs, folder / "out.safetensors", device="cpu", task="model_shapes"
    )
    try:
        counted = await ctx.run_owner_task(request, task_id, SHAPES_HOURS, lambda e: None)
        remember_shapes(spec, data, counted)
    except (UnitFailed, ValueError) as exc:
        log.warning("the model's shapes: the runner failed (%s); counting them here", exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # its stderr.log only
