"""The owner's side of its jobs: the loop that places units, and the parts it is made of.

- `placement.py`: which peer gets a unit, and what a decline means;
- `offers.py`: the sealed work package and its answer;
- `leases.py`: heartbeats, expiry, the `max_hours` deadline, re-attaching after a restart;
- `results.py`: a result checked, its weights fetched and checked, the receipt;
- `lifecycle.py`: how a unit's end moves its job (compare-and-set, in one place);
- `rounds.py`: an elastic job's rounds (shares offered per data slot, the outer step);
- `sweeps.py`: a sweep job's trials (an Optuna study asked and told, `study.py`).

This module ties them together, trains units on this node when no peer fits (a
single job's, or a sweep's trial while every peer that fits is busy), and records
progress. Every task it starts for a job runs under `_guarded`: whatever goes
wrong in one job fails that job's unit with the reason in its timeline and the log,
and the node keeps running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job, Unit
from node.work.owner.leases import Leases
from node.work.owner.lifecycle import Lifecycle, has_driver
from node.work.owner.modes import ElasticRounds, SweepTrials
from node.work.owner.placement import Placement
from node.work.owner.results import Results
from node.work.run import UnitFailed
from node.work.trust import Reputation, SpotChecks
from protocol.work import Progress

log = logging.getLogger(__name__)

HISTORY_POINTS = 500


class OwnerRole:
    def __init__(self, ctx: WorkContext, runner_request: Any) -> None:
        self.ctx = ctx
        self._runner_request = runner_request  # builds the training subprocess request
        self._wake = trio.Event()
        self._placing: set[str] = set()
        self._local: dict[str, trio.CancelScope] = {}
        self.lifecycle = Lifecycle(ctx, self.wake)
        self.leases = Leases(ctx, self.lifecycle, self.record_progress)
        self.sweeps = SweepTrials(ctx, self.lifecycle, self._train_trial_here)
        self.reputation = Reputation(ctx.jobs.db)
        spot_checks = SpotChecks(ctx, runner_request, self.reputation)
        self.results = Results(ctx, self.lifecycle, self.leases, self.sweeps, spot_checks)
        self.placement = Placement(ctx, self.lifecycle, self._train_here, self.reputation)
        self.rounds = ElasticRounds(ctx, self.lifecycle, runner_request)
        self.lifecycle.unit_changed = self._unit_changed
        self.lifecycle.trial_lost = self.sweeps.trial_lost
        self.leases.report_trial = self.sweeps.report
        # the streams the worker opens to this owner
        self.handle_progress = self.leases.handle_progress
        self.handle_result = self.results.handle_result
        self.handle_countersigned = self.results.handle_countersigned

    def wake(self) -> None:
        self._wake.set()

    def _unit_changed(self, job_id: str) -> None:
        self.rounds.unit_changed(job_id)
        self.sweeps.unit_changed(job_id)

    async def run(self) -> None:
        self.leases.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.leases.run)
            while True:
                for job in self.ctx.jobs.in_state("queued"):
                    if job.id not in self._placing:
                        self._placing.add(job.id)
                        task = {"elastic": self.rounds.drive, "sweep": self.sweeps.drive}.get(
                            job.spec.get("mode", "single"), self.placement.place
                        )
                        nursery.start_soon(self._guarded, job.id, task)
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
            ending = {"state": "failed"} if has_driver(self.ctx.jobs.get(job_id)) else {}
            self.ctx.jobs.transition(job_id, ("queued", "running"), reason, reason=reason, **ending)
        finally:
            self._placing.discard(job_id)

    async def _train_here(self, job: Job, why: str) -> None:
        """Train a unit of the job on this node (no peer fits, or placement = "local")."""
        ctx = self.ctx
        now = time.time()
        deadline = now + job.max_hours * 3600
        unit = ctx.jobs.add_unit(job.id, ctx.peer_id, deadline - now, deadline=deadline)
        if self.lifecycle.start(unit, why) is None:
            return

        def on_event(event: dict[str, Any], scope: trio.CancelScope) -> None:
            if event.get("event") == "progress":
                self.record_progress(job.id, "training", event)

        trained = await self._run_here(job, unit, job.spec, on_event)
        if trained is not None:
            result, sha = trained
            metrics = result_metrics(result)
            self.lifecycle.done(unit.unit_id, ("running",), sha, metrics, "local", "trained here")

    async def _train_trial_here(self, job: Job, unit: Unit, spec: dict[str, Any]) -> None:
        """Train one of a sweep's trials on this node (every peer that fits is busy):
        its validations go to the study as a worker's heartbeats would, and a pruned
        trial stops at once. The owner's own work earns no receipt."""
        if self.lifecycle.start(unit, f"trial {unit.trial}: training on this node") is None:
            return

        def on_event(event: dict[str, Any], scope: trio.CancelScope) -> None:
            if event.get("event") != "progress" or "val_step" not in event:
                return
            if self.sweeps.report(unit, _progress_of(unit, event)):
                scope.cancel()  # pruned: the trial and its unit are ended already

        trained = await self._run_here(job, unit, spec, on_event)
        if trained is None:
            return
        result, sha = trained
        note = f"trial {unit.trial}: trained on this node"
        size = self.ctx.blobs.size(sha)
        if self.lifecycle.share_done(unit.unit_id, sha, size, note, from_states=("running",)):
            self.sweeps.trial_done(job, unit, sha, result_metrics(result))

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
                    result = await ctx.train(
                        request,
                        unit.unit_id,
                        job.max_hours,
                        lambda e: on_event(e, scope),
                        unit=True,
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

    def record_progress(self, job_id: str, phase: str, event: dict[str, Any]) -> None:
        job = self.ctx.jobs.get(job_id)
        if job is None or job.state != "running":
            return
        history = list(job.progress.get("history", []))
        if event.get("loss") is not None and event.get("step") is not None:
            history.append([event["step"], event["loss"], event.get("val_loss")])
            history = history[-HISTORY_POINTS:]
        total = event.get("total_steps") or job.progress.get("total_steps") or 0
        step = event.get("step", job.progress.get("step", 0)) or 0
        progress = {
            "phase": phase,
            "step": step,
            "total_steps": total,
            "fraction": round(step / total, 4) if total else 0.0,
            "loss": event.get("loss"),
            "samples_per_s": event.get("samples_per_s", 0.0),
            "samples": event.get("samples", 0),
            "updated_at": time.time(),
            "history": history,
        }
        self.ctx.jobs.transition(job_id, ("running",), progress=progress)


def result_metrics(result: dict[str, Any]) -> dict[str, Any]:
    return {
        **dict(result.get("metrics", {})),
        "steps": result.get("steps", 0),
        "samples": result.get("samples", 0),
        "wall_time_s": result.get("wall_time_s", 0.0),
        "device": result.get("device", ""),
    }


def _progress_of(unit: Unit, event: dict[str, Any]) -> Progress:
    """A local runner's progress event as the heartbeat a worker would send."""
    return Progress(
        unit.job_id,
        unit.unit_id,
        "training",
        int(event.get("step", 0)),
        int(event.get("total_steps", 0)),
        event.get("loss"),
        float(event.get("samples_per_s", 0.0)),
        int(event.get("samples", 0)),
        time.time(),
        val_loss=event.get("val_loss"),
        val_step=int(event.get("val_step", -1)),
        val_accuracy=event.get("val_accuracy"),
    )
