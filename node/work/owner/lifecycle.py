"""What happens to a job when one of its units starts, ends, fails or is lost.

The rules in one place, so placement, leases, results and cancellation agree: each
step is a compare-and-set on the unit, then on the job (`jobs.py`), so whichever of
two racing events lands first wins and the other finds the row moved on and does
nothing. A `single` job has one live unit at a time; an `elastic` job one per slot
of its open round (`rounds.py` decides how many), ended through the same calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from node.work.context import WorkContext
from node.work.jobs import FINAL_STATES, LIVE_UNIT_STATES, Job, Unit

log = logging.getLogger(__name__)


def round_closed_reason(round_: int) -> str:
    """Why a share still live when its round closed ended: late, not at fault."""
    return f"round {round_} closed before its delta came"


MAX_ATTEMPTS = 3


def has_driver(job: Job | None) -> bool:
    """A job of many units (elastic rounds, a sweep's trials) run by its own driver."""
    return job is not None and job.spec.get("mode") in ("elastic", "sweep")


def replicas_of(job: Job) -> int:
    """How many workers train each unit of `job` (the spec's `trust.replicas`)."""
    return int(job.spec.get("trust", {}).get("replicas", 1))


class Lifecycle:
    """A single job follows its one unit. An elastic job's units are shares of rounds,
    a sweep's are trials: their ends only tell the job's driver (`rounds.py`,
    `sweeps.py`), which decides the job."""

    def __init__(self, ctx: WorkContext, wake: Callable[[], None]) -> None:
        self.ctx = ctx
        self._wake = wake  # the placement loop: a job wants a unit again
        self.unit_changed: Callable[[str], None] = lambda job_id: None  # the drivers
        # a trial's unit ended without a result: (unit, reason, whether to offer again)
        self.trial_lost: Callable[[Unit, str, bool], None] = lambda unit, why, retry: None

    def start(self, unit: Unit, note: str) -> Job | None:
        """The worker took `unit`: unit offered -> running, job queued -> running.
        None (and the unit cancelled) when the job ended meanwhile."""
        jobs = self.ctx.jobs
        if jobs.unit_transition(unit.unit_id, ("offered",), state="running") is None:
            return None  # cancelled, or its lease ran out while the offer was in flight
        job = jobs.get(unit.job_id)
        if job is None:
            return None
        if unit.in_many:
            return jobs.transition(job.id, ("running",), note)
        started = jobs.transition(
            job.id,
            ("queued", "running"),
            note,
            state="running",
            worker=unit.worker,
            unit_id=unit.unit_id,
            reason="",
            attempts=job.attempts + 1,
        )
        if started is None:
            self.end(unit.unit_id, "cancelled", f"the job is {job.state}")
        return started

    def end(
        self,
        unit_id: str,
        state: str,
        reason: str = "",
        from_states: tuple[str, ...] = LIVE_UNIT_STATES,
        **changes: Any,
    ) -> Unit | None:
        """Unit `from_states` -> `state` (a final one), and drop its key."""
        unit = self.ctx.jobs.unit_transition(
            unit_id, from_states, state=state, ended_at=time.time(), reason=reason[:2000], **changes
        )
        if unit is not None:
            self.ctx.forget_unit_key(unit.job_id, unit.unit_id)
            if unit.in_many:
                self.unit_changed(unit.job_id)
        return unit

    def lost(self, unit_id: str, reason: str, state: str = "failed") -> None:
        """A unit ended without a result that counts (declined, vanished, rejected,
        handed back): the job is offered again elsewhere, or fails after
        MAX_ATTEMPTS."""
        unit = self.end(unit_id, state, reason)
        if unit is None:
            return
        log.info("unit %s of job %s lost: %s", unit_id, unit.job_id, reason)
        job = self.ctx.jobs.get(unit.job_id)
        if unit.in_many:  # its slot or trial is offered again (the driver decides)
            if job is not None and job.state == "running":
                excluded = job.excluded
                if state == "failed":  # a bad result or a failed unit: not this peer again
                    excluded = sorted({*excluded, unit.worker} - {self.ctx.peer_id})
                where = f"round {unit.round}" if unit.round >= 0 else f"trial {unit.trial}"
                self.ctx.jobs.transition(
                    job.id, ("running",), f"{where}: {reason}", excluded=excluded
                )
            if unit.trial >= 0:
                self.trial_lost(unit, reason, True)
            return
        if (
            job is None
            or job.state in FINAL_STATES
            or self.ctx.jobs.units_of(job.id, *LIVE_UNIT_STATES)
        ):
            return
        excluded = sorted({*job.excluded, unit.worker} - {self.ctx.peer_id})
        if job.attempts >= MAX_ATTEMPTS * replicas_of(job):
            self.ctx.jobs.transition(
                job.id,
                ("queued", "running"),
                f"giving up after {job.attempts} attempts",
                state="failed",
                reason=reason,
            )
            return
        self.ctx.jobs.transition(
            job.id,
            ("queued", "running"),
            reason,
            state="queued",
            worker="",
            unit_id="",
            reason=reason,
            excluded=excluded,
        )
        self._wake()

    def fatal(self, unit_id: str, reason: str) -> None:
        """The unit failed in a way any worker would repeat (the spec itself): the job
        fails now instead of burning more volunteers' time."""
        unit = self.end(unit_id, "failed", reason)
        if unit is None:
            return
        if unit.trial >= 0:  # the trial's sampled values fail, not the sweep
            self.trial_lost(unit, reason, False)
            return
        self.ctx.jobs.transition(
            unit.job_id,
            ("queued", "running"),
            "training failed",
            state="failed",
            reason=reason,
        )

    def share_done(
        self,
        unit_id: str,
        output_sha256: str,
        output_bytes: int,
        note: str,
        from_states: tuple[str, ...] = ("verifying",),
    ) -> bool:
        """An elastic unit's delta (or a trial's weights) is accepted: unit verifying
        (running, when trained here) -> done; the job's driver takes it from there."""
        unit = self.end(
            unit_id,
            "done",
            from_states=from_states,
            output_sha256=output_sha256,
            output_bytes=output_bytes,
        )
        if unit is None:
            return False
        self.ctx.jobs.transition(unit.job_id, ("running",), note)
        return True

    def done(
        self,
        unit_id: str,
        from_states: tuple[str, ...],
        weights_sha256: str,
        metrics: dict[str, Any],
        metrics_status: str,
        note: str,
    ) -> Job | None:
        """The unit's weights are accepted: unit -> done, job -> completed.
        None when the unit or job moved on first (cancelled during verification)."""
        if self.end(unit_id, "done", from_states=from_states) is None:
            return None
        unit = self.ctx.jobs.unit(unit_id)
        assert unit is not None
        return self.ctx.jobs.transition(
            unit.job_id,
            ("running",),
            note,
            state="completed",
            weights_sha256=weights_sha256,
            metrics=metrics,
            metrics_status=metrics_status,
            reason="",
        )

    def cancel(self, job_id: str, why: str = "cancelled by the owner") -> Job | None:
        """Job -> cancelled and every live unit with it; a final job stays as it is."""
        job = self.ctx.jobs.transition(job_id, ("queued", "running"), why, state="cancelled")
        for unit in self.ctx.jobs.units_of(job_id, *LIVE_UNIT_STATES):
            self.end(unit.unit_id, "cancelled", why)
        return job or self.ctx.jobs.get(job_id)
