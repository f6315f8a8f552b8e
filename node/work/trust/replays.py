"""The owner's replays: what a unit's chain looks like, the states fetched for them
(`FetchedStates`), and the runner's `replay` task on states already in this node's
blob store.

Both the spot check at a result (`spot_checks.py`) and the replays of segments drawn
while the worker still trains (`commitments.py`) run here, so a segment replayed
early and one replayed at the result are the same computation.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

import trio

from node.work.blobs import BlobStore
from node.work.context import WorkContext
from node.work.jobs import Job, RoundStore, Unit
from node.work.run import RequestBuilder
from node.work.trust.shapes import model_shapes
from training.evidence.bounds import BF16_ACROSS_KINDS, BF16_TOLERANCE, TOLERANCE
from training.evidence.result_check import max_weights_bytes
from training.spec.job import elastic_of_plain


def tolerance_of(spec: dict[str, Any], kinds: bool = False) -> float:
    """How far apart two classes' states of this job may be (relative L2); `kinds`:
    the classes are a CPU and a GPU (`across_kinds`)."""
    if spec.get("optim", {}).get("precision") != "bf16":
        return TOLERANCE
    return BF16_ACROSS_KINDS if kinds else BF16_TOLERANCE


class FetchedStates:
    """Training states this node fetched from workers, held while a check needs them:
    two units of one spec share states (checkpoint 0 at least), so a file goes when
    the last holder lets go, and only if this node fetched it (a blob it had before
    stays)."""

    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs
        self._holders: Counter[str] = Counter()
        self._fetched: set[str] = set()

    def hold(self, shas: Iterable[str]) -> None:
        for sha in shas:
            if not self._holders[sha] and not self._blobs.has(sha):
                self._fetched.add(sha)
            self._holders[sha] += 1

    def release(self, shas: Iterable[str]) -> None:
        for sha in shas:
            self._holders[sha] -= 1
            if self._holders[sha] <= 0:
                del self._holders[sha]
                if sha in self._fetched:
                    self._fetched.discard(sha)
                    self._blobs.remove(sha)


STEPS_CACHED = 256


def across_classes(ctx: WorkContext, peer: str) -> bool:
    """Whether `peer`'s states are compared with this node's replays within a
    tolerance (another determinism class) rather than by hash."""
    return ctx.peers.determinism_of(peer) != ctx.own_ad().determinism


def device_kind(determinism: str) -> str:
    """ "cuda" or "cpu": the first part of a determinism class ("cuda:NVIDIA H100 | ...")."""
    return determinism.partition(":")[0]


def across_kinds(ctx: WorkContext, peer: str) -> bool:
    """Whether `peer` trains on another kind of device than this node replays on (a
    GPU's segments checked on a CPU): its states are then compared within a share of a
    step (`comparisons.agrees`), since no fixed tolerance holds across kinds."""
    theirs = ctx.peers.determinism_of(peer)
    return bool(theirs) and device_kind(theirs) != device_kind(ctx.own_ad().determinism)


class Replays:
    def __init__(self, ctx: WorkContext, runner_request: RequestBuilder) -> None:
        self.ctx = ctx
        self._runner_request = runner_request
        self._state_limits: dict[str, int] = {}  # job id -> the most bytes of a state
        # (job id, spec, share, from step) -> steps and bound: asked at every heartbeat
        self._steps: dict[tuple, tuple[list[int], int]] = {}
        self._computing: dict[tuple, trio.Event] = {}  # keys whose steps are on their way

    async def steps(
        self, job: Job, spec: dict[str, Any], share: bool, from_step: int = 0
    ) -> tuple[list[int], int]:
        """The steps of a unit's checkpoints (a share's: its H inner steps; a resumed
        unit's: those from the state it resumed from), and the most bytes one of its
        checkpoints may have."""
        key = (job.id, json.dumps(spec, sort_keys=True, default=str), share, from_step)
        while key in self._computing:  # heartbeats that come meanwhile wait for it
            await self._computing[key].wait()
        if key not in self._steps:
            self._computing[key] = done = trio.Event()
            try:
                found = await self._compute_steps(job, spec, share, from_step)
            finally:
                del self._computing[key]
                done.set()
            if len(self._steps) >= STEPS_CACHED:
                self._steps.pop(next(iter(self._steps)))
            self._steps[key] = found
        return self._steps[key]

    async def _compute_steps(
        self, job: Job, spec: dict[str, Any], share: bool, from_step: int
    ) -> tuple[list[int], int]:
        from training.evidence.steps import checkpoint_steps, share_checkpoint_steps
        from training.spec.job import parse_spec

        parsed = parse_spec(spec)
        data = job.data_files(self.ctx.blobs.path)
        tensors, _ = await model_shapes(self.ctx, spec, job.data_blobs, data)
        total = await trio.to_thread.run_sync(_total_steps, parsed, data)
        # the weights, at most two optimizer moments of them, and the RNG and headers
        bound = 3 * max_weights_bytes(tensors) + (1 << 20)
        self._state_limits[job.id] = bound
        if share and parsed.elastic is not None:
            inner = parsed.elastic.inner_steps
            return share_checkpoint_steps(inner, parsed.trust.checkpoints), bound
        steps = checkpoint_steps(total, parsed.trust.checkpoints, parsed.optim.validate_every)
        return [step for step in steps if step >= from_step], bound

    async def state_bytes(self, job: Job, spec: dict[str, Any]) -> int:
        """The most bytes one training state of a unit of `job` may have."""
        if job.id not in self._state_limits:
            await self.steps(job, spec, False)
        return self._state_limits[job.id]

    def share_table(self, unit: Unit, spec: dict[str, Any]) -> dict[str, Any]:
        """The replay's `share` table for an elastic `unit` of a job of plain `spec`:
        which round and slot, from which weights (and for an eager start, which
        delta, and which weights it took on its way)."""
        store = RoundStore(self.ctx.jobs.db)
        started = store.share_weights(unit.job_id, unit.round, unit.start_delta)
        if not started:
            raise RuntimeError(f"round {unit.round} of this job is unknown here")
        table = {"job_id": unit.job_id, "round": unit.round, "slot": unit.slot, "weights": started}
        if unit.start_delta:
            table["start_delta"] = unit.start_delta
        if unit.taken and elastic_of_plain(spec).takes_weights:
            table["takes"] = unit.taken
        return table

    async def run(
        self, job: Job, unit: Unit, spec: dict[str, Any], table: dict[str, Any], shas: Iterable[str]
    ) -> dict[str, Any]:
        """The runner's replay task on `table`, reading the job's data and `shas`
        (every one in this node's blob store by now)."""
        ctx = self.ctx
        wanted = {*job.data_blobs, *shas}
        blobs = {s: str(ctx.blobs.path(s)) for s in wanted if ctx.blobs.has(s)}
        folder = ctx.unit_dir(unit.unit_id)
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / "replayed-weights.safetensors"
        request = self._runner_request(spec, blobs, out).replaying(table)
        return await ctx.run_owner_task(request, unit.unit_id, job.max_hours, lambda e: None)


def share_blobs(share: dict[str, Any]) -> set[str]:
    """The blobs of this node's own that a replay's `share` table names: the global
    weights the share started from, an eager start's delta, the weights it took."""
    return {share["weights"], *(share[k] for k in ("start_delta", "takes") if k in share)}


def _total_steps(parsed: Any, data: Any) -> int:
    from training.budget import validate_for_submit

    return validate_for_submit(parsed, data).total_steps
