"""What happens to a job when one of its units starts, ends, fails or is lost.

The rules in one place, so placement, leases, results and cancellation agree: each
step is a compare-and-set on the unit, then on the job (`node/work/jobs/store.py`),
so whichever of two racing events lands first wins and the other finds the row moved
on and does nothing. What a unit's end means for its job is the job's mode's to say
(`node/work/owner/modes/`): a `single` job is queued again or fails; an elastic
round's share or a sweep's trial only tells its driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job, Unit

log = logging.getLogger(__name__)


def round_closed_reason(round_: int) -> str:
    """Why a share still live when its round closed ended: late, not at fault."""
    return f"round {round_} closed before its delta came"


def replicas_of(job: Job) -> int:
    """How many workers train each unit of `job` (the spec's `trust.replicas`)."""
    return int(job.spec.get("trust", {}).get("replicas", 1))


class UnitEnds(Protocol):
    """What the lifecycle asks of a job's mode (`node.work.owner.modes.JobMode`)."""

    many_units: bool

    def unit_ended(self, unit: Unit) -> None: ...

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None: ...

    def unit_fatal(self, unit: Unit, reason: str) -> None: ...


class Lifecycle:
    """Unit and job changes, each a compare-and-set; the job's mode decides what a
    unit's end does to its job."""

    def __init__(
        self,
        ctx: WorkContext,
        mode_of: Callable[[Job | None], Any],
        ended: Callable[[Unit], None] = lambda unit: None,
    ) -> None:
        self.ctx = ctx
        self.mode_of = mode_of  # the mode that runs a job (the owner's)
        self._ended = ended  # told of every unit that ends (its evidence may go)

    def mode(self, job_id: str) -> UnitEnds:
        return self.mode_of(self.ctx.jobs.get(job_id))

    def start(self, unit: Unit, note: str) -> Job | None:
        """The worker took `unit`: unit offered -> running, job queued -> running.
        None (and the unit cancelled) when the job ended meanwhile."""
        jobs = self.ctx.jobs
        if jobs.unit_transition(unit.unit_id, ("offered",), state="running") is None:
            return None  # cancelled, or its lease ran out while the offer was in flight
        job = jobs.get(unit.job_id)
        if job is None:
            return None
        if self.mode_of(job).many_units:
            return jobs.note(job.id, note)
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
            self._ended(unit)
            self.mode(unit.job_id).unit_ended(unit)
        return unit

    def lost(self, unit_id: str, reason: str, state: str = "failed", at_fault: bool = True) -> None:
        """A unit ended without a result that counts (declined, vanished, rejected,
        handed back): its mode offers it again or gives up (`JobMode.unit_lost`);
        not `at_fault` (its result could not be verified), its worker is not excluded."""
        unit = self.end(unit_id, state, reason)
        if unit is None:
            return
        log.info("unit %s of job %s lost: %s", unit_id, unit.job_id, reason)
        self.mode(unit.job_id).unit_lost(unit, reason, state, at_fault)

    def fatal(self, unit_id: str, reason: str) -> None:
        """The unit failed in a way any worker would repeat (the spec itself): no more
        volunteers' time is burnt on it (`JobMode.unit_fatal`)."""
        unit = self.end(unit_id, "failed", reason)
        if unit is not None:
            self.mode(unit.job_id).unit_fatal(unit, reason)

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
        self.ctx.jobs.note(unit.job_id, note)
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
