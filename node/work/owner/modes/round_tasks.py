"""An elastic job's runner tasks on its owner: round 0's weights, each round's outer
step, the evaluation of each round's new weights, and the length of a delta.

Each task runs in a runner subprocess of its own (`node.work.run`), in a folder of
its own, reading blobs by sha256: the daemon never parses a weights or delta tensor.
`ElasticRounds` (`elastic.py`) decides when each runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio

from node.work.context import WorkContext
from node.work.jobs import Job, Round, Unit, new_id
from node.work.run import RequestBuilder, UnitFailed
from node.work.trust import model_shapes
from training.evidence.result_check import remember_shapes

log = logging.getLogger(__name__)


class RoundTasks:
    def __init__(self, ctx: WorkContext, runner_request: RequestBuilder) -> None:
        self.ctx = ctx
        self._runner_request = runner_request

    async def delta_numel(self, job: Job) -> int:
        """Values in one delta: the model's floating-point state, buffers included."""
        data = job.data_files(self.ctx.blobs.path)
        return (await model_shapes(self.ctx, job.spec, job.data_blobs, data))[1]

    async def init_weights(self, job: Job) -> str:
        """Round 0's global weights, built from the job's seed; their sha256. The
        runner also reports the model's shapes, kept for the checks of the job's
        deltas and spot checks (`remember_shapes`): building the model on the meta
        device in the daemon imports torch._dynamo there (2.7 s of CPU on the
        daemon's thread, the first time a result came in)."""
        result, folder = await self._run_here(job, "elastic_init", {})
        try:
            remember_shapes(job.spec, job.data_files(self.ctx.blobs.path), result)
        except ValueError as exc:  # a bug: the daemon builds the model when it must
            log.warning("job %s: %s", job.id, exc)
        return await trio.to_thread.run_sync(self.ctx.blobs.put_file, folder / "out.safetensors")

    async def outer_step(
        self, job: Job, current: Round, done: list[Unit], bases: list[str]
    ) -> tuple[str, str, str]:
        """Apply the `done` shares' deltas (in slot order, each from the global weights
        in `bases`) to `current`'s weights: the next weights, momentum and update
        ("" for an unquantized job), as blobs."""
        elastic: dict[str, Any] = {
            "job_id": job.id,
            "round": current.round,
            "weights": current.weights_sha256,
            "deltas": [u.output_sha256 for u in done],
            "bases": bases,
            "validate": False,  # `validate` evaluates while the next round trains
        }
        if current.momentum_sha256:
            elastic["momentum"] = current.momentum_sha256
        elastic["update_out"] = "update.bin"  # written for a quantized job only
        result, folder = await self._run_here(job, "elastic_outer", elastic, "momentum")
        put = self.ctx.blobs.put_file
        weights = await trio.to_thread.run_sync(put, folder / "out.safetensors")
        momentum = await trio.to_thread.run_sync(put, folder / "momentum.safetensors")
        update = ""
        if result.get("update_sha256"):
            update = await trio.to_thread.run_sync(put, folder / "update.bin")
        return weights, momentum, update

    async def validate(self, job: Job, closed: Round) -> dict[str, float]:
        """The validation metrics of the weights `closed`'s outer step made."""
        request = {"job_id": job.id, "round": closed.round, "weights": closed.next_weights_sha256}
        result, _ = await self._run_here(job, "elastic_validate", request)
        return {k: float(v) for k, v in result.get("metrics", {}).items()}

    async def _run_here(
        self, job: Job, task: str, elastic: dict[str, Any], extra_out: str = ""
    ) -> tuple[dict[str, Any], Path]:
        """One runner task on this node, in a folder of its own; raises on failure."""
        ctx = self.ctx
        task_id = new_id()
        folder = ctx.unit_dir(task_id)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        blobs = [*job.data_blobs]
        for key in ("weights", "momentum"):
            if key in elastic:
                blobs.append(elastic[key])
        blobs += elastic.get("deltas", [])
        request = self._runner_request(
            job.spec, {s: str(ctx.blobs.path(s)) for s in blobs}, folder / "out.safetensors"
        )
        if extra_out:
            elastic = {**elastic, f"{extra_out}_out": str(folder / f"{extra_out}.safetensors")}
        if "update_out" in elastic:
            elastic = {**elastic, "update_out": str(folder / elastic["update_out"])}
        request = request.elastic_task(task, elastic)
        try:
            result = await ctx.run_owner_task(request, task_id, job.max_hours, lambda e: None)
        except UnitFailed as exc:
            raise RuntimeError(f"{task} failed on the owner: {exc}") from None
        return result, folder
