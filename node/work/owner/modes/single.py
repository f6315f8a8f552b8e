"""The `single` mode: one unit trains the whole job, on a peer or on this node.

Placement (`node/work/owner/placement.py`) offers the job's unit until a peer takes
it, or trains it here when no peer fits. A lost unit queues the job again, without
the peer that lost it, until `MAX_ATTEMPTS` (times the replicas) have been made; the
first accepted result completes the job, and a replica still training is dropped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from node.work.jobs import FINAL_STATES, LIVE_UNIT_STATES, Job, Unit
from node.work.owner.lifecycle import replicas_of
from node.work.owner.modes.mode import JobMode, OwnerParts, credit_of
from protocol.receipts import partial_credit
from protocol.work import Progress

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
HISTORY_POINTS = 500


class SingleJob(JobMode):
    name = "single"

    def __init__(self, parts: OwnerParts) -> None:
        super().__init__(parts)
        self._lifecycle = parts.lifecycle
        self._placement = parts.placement

    async def drive(self, job_id: str) -> None:
        await self._placement.place(job_id, self._train_here)

    def resumable(self, job: Job) -> bool:
        return replicas_of(job) == 1

    def credit(self, job: Job, unit: Unit) -> float:
        """A resumed unit's share of the job's credit: the steps after its state."""
        whole = credit_of(job)
        total = int(job.summary.get("total_steps", 0))
        return partial_credit(whole, total - unit.resume_step, total) if unit.resume_step else whole

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None:
        """Queue the job again (without the unit's worker when it was at fault), or
        fail it after MAX_ATTEMPTS; nothing while another replica of it is live."""
        jobs = self.ctx.jobs
        job = jobs.get(unit.job_id)
        if job is None or job.state in FINAL_STATES or jobs.units_of(job.id, *LIVE_UNIT_STATES):
            return
        if job.attempts >= MAX_ATTEMPTS * replicas_of(job):
            jobs.transition(
                job.id,
                ("queued", "running"),
                f"giving up after {job.attempts} attempts",
                state="failed",
                reason=reason,
            )
            return
        blamed = {unit.worker} if at_fault else set()
        jobs.transition(
            job.id,
            ("queued", "running"),
            reason,
            state="queued",
            worker="",
            unit_id="",
            reason=reason,
            excluded=sorted({*job.excluded, *blamed} - {self.ctx.peer_id}),
        )
        self._parts.wake()

    def progress(self, unit: Unit, progress: Progress) -> str:
        self.record_progress(
            progress.job_id,
            progress.phase,
            {
                "step": progress.step,
                "total_steps": progress.total_steps,
                "loss": progress.loss,
                "samples_per_s": progress.samples_per_s,
                "samples": progress.samples,
                "val_loss": progress.val_loss,
            },
        )
        return ""

    def accept(self, job: Job, unit: Unit, peer: str, checked: Any) -> str:
        """Complete the unit and the job; a job cancelled while the weights were
        checked stays cancelled (unless a replica completed it with these weights)."""
        result = checked.result
        completed = self._lifecycle.done(
            unit.unit_id,
            ("verifying",),
            result.weights_sha256,
            {**checked.metrics, "device": result.device},
            checked.status,
            f"result from {peer}{checked.via} checked{checked.found}; receipt issued",
        )
        if completed is None and not self._replica_completed(job.id, unit, result.weights_sha256):
            return "the job ended while it was checked"
        # a replica still training is not needed any more (one being checked settles)
        for other in self.ctx.jobs.units_of(job.id, "offered", "running"):
            self._lifecycle.end(other.unit_id, "cancelled", "the unit settled without it")
        log.info("job %s completed by %s", job.id, peer)
        return ""

    def _replica_completed(self, job_id: str, unit: Unit, weights_sha256: str) -> bool:
        """The partner replica completed the job with these very weights first."""
        now, job = self.ctx.jobs.unit(unit.unit_id), self.ctx.jobs.get(job_id)
        return (
            now is not None
            and now.state == "done"
            and job is not None
            and job.state == "completed"
            and job.weights_sha256 == weights_sha256
        )

    async def _train_here(self, job: Job, why: str) -> None:
        """Train the job's unit on this node (no peer fits, or placement = "local")."""
        ctx = self.ctx
        now = time.time()
        deadline = now + job.max_hours * 3600
        unit = ctx.jobs.add_unit(job.id, ctx.peer_id, deadline - now, deadline=deadline)
        if self._lifecycle.start(unit, why) is None:
            return

        def on_event(event: dict[str, Any], scope: trio.CancelScope) -> None:
            if event.get("event") == "progress":
                self.record_progress(job.id, "training", event)

        trained = await self._parts.run_here(job, unit, job.spec, on_event)
        if trained is not None:
            result, sha = trained
            metrics = result_metrics(result)
            self._lifecycle.done(unit.unit_id, ("running",), sha, metrics, "local", "trained here")

    def record_progress(self, job_id: str, phase: str, event: dict[str, Any]) -> None:
        """The job's progress, from a heartbeat or a local runner's event."""
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
        self.ctx.jobs.set_progress(job_id, progress)


def result_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """A local runner's result as the job's metrics."""
    return {
        **dict(result.get("metrics", {})),
        "steps": result.get("steps", 0),
        "samples": result.get("samples", 0),
        "wall_time_s": result.get("wall_time_s", 0.0),
        "device": result.get("device", ""),
    }
