"""The owner's side of its jobs: the engine that drives them, and the parts it is made of.

The engine starts each queued job's mode (`modes/`: `drive`), runs the lease loop,
and answers the streams workers open to this owner (heartbeats to `leases.py`,
results and co-signed receipts to `results.py`). Every task it starts for a job runs
under `_guarded`: whatever goes wrong in one job fails that job's unit with the
reason in its timeline and the log, and the node keeps running. The modes are given
at construction (`MODES` by default), each built from the same `OwnerParts`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job, Unit
from node.work.owner.leases import Leases
from node.work.owner.lifecycle import Lifecycle
from node.work.owner.modes import MODES, JobMode, OwnerParts
from node.work.owner.placement import Placement
from node.work.owner.results import Results
from node.work.run import RequestBuilder, UnitFailed
from node.work.trust import Reputation, SpotChecks

log = logging.getLogger(__name__)


class OwnerRole:
    def __init__(
        self,
        ctx: WorkContext,
        runner_request: RequestBuilder,
        modes: Sequence[Callable[[OwnerParts], JobMode]] = MODES,
    ) -> None:
        self.ctx = ctx
        self._runner_request = runner_request
        self._wake = trio.Event()
        self._placing: set[str] = set()
        self._local: dict[str, trio.CancelScope] = {}
        self.reputation = Reputation(ctx.jobs.db)
        spot_checks = SpotChecks(ctx, runner_request, self.reputation)
        self._commitments = spot_checks.commitments
        self.lifecycle = Lifecycle(ctx, self.mode_of, self._unit_ended)
        self.leases = Leases(ctx, self.lifecycle, self._commitments)
        self.placement = Placement(ctx, self.lifecycle, self.reputation)
        parts = OwnerParts(
            ctx, self.lifecycle, self.placement, runner_request, self._run_here, self.wake
        )
        self.modes: dict[str, JobMode] = {}
        for make in modes:
            mode = make(parts)
            self.modes[mode.name] = mode
        self.results = Results(ctx, self.lifecycle, self.leases, spot_checks)
        # the streams the worker opens to this owner
        self.handle_progress = self.leases.handle_progress
        self.handle_result = self.results.handle_result
        self.handle_countersigned = self.results.handle_countersigned

    def mode_of(self, job: Job | None) -> JobMode:
        """The mode that runs `job` (a job gone from node.db: `single`'s, which only
        acts on a job it finds)."""
        return self.modes[job.mode if job is not None else "single"]

    def _unit_ended(self, unit: Unit) -> None:
        """Its evidence may go, and its worker has room for another offer."""
        self._commitments.unit_ended(unit.unit_id)
        self.placement.backoff.freed(unit.worker)

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        self.leases.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.leases.run)
            nursery.start_soon(self._commitments.run)
            while True:
                for job in self.ctx.jobs.in_state("queued"):
                    if job.id not in self._placing:
                        self._placing.add(job.id)
                        nursery.start_soon(self._guarded, job.id, self.mode_of(job).drive)
                with trio.move_on_after(1.0):
                    await self._wake.wait()
                self._wake = trio.Event()

    def cancel(self, job_id: str) -> Job | None:
        if job_id in self._local:
            self._local[job_id].cancel()
        return self.lifecycle.cancel(job_id)

    async def _guarded(self, job_id: str, task: Callable[[str], Awaitable[None]]) -> None:
        """Run one job's task; a failure ends the job's live units, never the node."""
        try:
            await task(job_id)
        except Exception as exc:
            log.exception("job %s: internal error", job_id)
            reason = f"internal error on the owner: {type(exc).__name__}: {exc}"[:2000]
            for unit in self.ctx.jobs.units_of(job_id, *LIVE_UNIT_STATES):
                self.lifecycle.lost(unit.unit_id, reason)
            # a single job is offered again; an elastic job's rounds or a sweep's trials
            # cannot go on without their driver, so it fails (saying why) rather than hang
            job = self.ctx.jobs.get(job_id)
            ending = {"state": "failed"} if self.mode_of(job).many_units else {}
            write = self.ctx.jobs.transition if ending else self.ctx.jobs.amend
            write(job_id, ("queued", "running"), reason, reason=reason, **ending)
        finally:
            self._placing.discard(job_id)

    async def _run_here(
        self,
        job: Job,
        unit: Unit,
        spec: dict[str, Any],
        on_event: Callable[[dict[str, Any], trio.CancelScope], None],
    ) -> tuple[dict[str, Any], str] | None:
        """Run `unit` (started) in a runner on this node; its result and weights hash,
        or None when it failed or was cancelled (the unit is ended, saying why)."""
        ctx = self.ctx
        out = ctx.unit_dir(unit.unit_id) / "weights.safetensors"
        blobs = {s: str(ctx.blobs.path(s)) for s in job.data_blobs}
        request = self._runner_request(spec, blobs, out)
        ctx.claim(unit.unit_id)
        try:
            with trio.CancelScope() as scope:
                self._local[job.id] = scope
                try:
                    result = await ctx.train_unit(
                        request, unit.unit_id, job.max_hours, lambda e: on_event(e, scope)
                    )
                except UnitFailed as exc:
                    self.lifecycle.fatal(unit.unit_id, str(exc))
                    return None
                sha = await trio.to_thread.run_sync(ctx.blobs.put_file, out)
        finally:
            self._local.pop(job.id, None)
            ctx.release(unit.unit_id)
        if scope.cancelled_caught:
            self.lifecycle.end(unit.unit_id, "cancelled", "cancelled by the owner")
            return None
        return result, sha
