"""`JobMode`: what the owner's engine asks of a job's mode, and nothing else.

The engine (placement, leases, results, the lifecycle, the HTTP service) never tests
a unit's round or trial, nor the spec's `mode`: it asks the job's mode. A mode is one
class with the hooks below, built once per owner from the parts it needs
(`OwnerParts`); a new mode is one new module whose class is added to `MODES` in
`node/work/owner/modes/__init__.py`.

`JobMode` holds the behaviour of a job of one unit (the `single` mode's, and the
default for every hook); `ManyUnits` that of a job whose units are run by its own
driver (an elastic job's round shares, a sweep's trials): their ends only tell the
driver, which decides the job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.run import RequestBuilder
from protocol.receipts import flops_to_credit
from protocol.work import Progress

if TYPE_CHECKING:
    from node.work.owner.lifecycle import Lifecycle
    from node.work.owner.placement import Placement

#: runs a started unit on this node: (job, unit, spec, on_event) -> (result, weights
#: sha256), or None when it failed or was cancelled (the unit is ended, saying why)
RunHere = Callable[..., Awaitable[tuple[dict[str, Any], str] | None]]


@dataclass(frozen=True)
class OwnerParts:
    """What a mode is built from: the owner's parts it drives units with."""

    ctx: WorkContext
    lifecycle: Lifecycle
    placement: Placement
    runner_request: RequestBuilder
    run_here: RunHere
    wake: Callable[[], None]  # the engine's loop: a job wants a unit again


def credit_of(job: Job) -> float:
    """The credit a unit of `job` earns, from the spec's summary computed at submit."""
    return flops_to_credit(int(job.summary.get("training_flops", 0)))


class JobMode:
    """A job of one unit at a time (a replica is one more unit of the same work)."""

    name: ClassVar[str] = "single"
    #: units are a round's shares or a sweep's trials, whose ends only tell the driver
    many_units: ClassVar[bool] = False

    def __init__(self, parts: OwnerParts) -> None:
        self.ctx = parts.ctx
        self._parts = parts

    # -- driving the job ---------------------------------------------------------------

    async def drive(self, job_id: str) -> None:
        """Run a queued job until it no longer wants a unit (the engine calls it)."""
        raise NotImplementedError

    def unit_ended(self, unit: Unit) -> None:
        """`unit` reached a final state (the lifecycle calls it after the change)."""

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None:
        """`unit` ended (`state`) without a result that counts; `at_fault`: by its
        worker's doing (its worker may be excluded from the job)."""
        raise NotImplementedError

    def unit_fatal(self, unit: Unit, reason: str) -> None:
        """`unit` failed as any worker would (the spec itself): the job fails."""
        self.ctx.jobs.transition(
            unit.job_id, ("queued", "running"), "training failed", state="failed", reason=reason
        )

    def progress(self, unit: Unit, progress: Progress) -> str:
        """A worker's heartbeat for `unit`: "" to go on, or why the unit stops now."""
        return ""

    # -- what a unit is ----------------------------------------------------------------

    def where(self, unit: Unit) -> str:
        """How the timeline names `unit`'s place in the job."""
        return f"unit {unit.unit_id}"

    def unit_spec(self, job: Job, unit: Unit) -> dict[str, Any]:
        """The plain spec `unit` trains."""
        return job.spec

    def credit(self, job: Job, unit: Unit) -> float:
        """What `unit`'s receipt credits: from the spec, never from the worker."""
        return credit_of(job)

    def resumable(self, job: Job) -> bool:
        """Whether a lost unit of `job` goes on from a recent state of it
        (`node.work.trust.resume`) instead of starting over."""
        return False

    def delta_round(self, unit: Unit) -> int | None:
        """The round whose weights `unit`'s result is a delta from; None: its result is
        whole weights."""
        return None

    def served(self, unit: Unit, sha: str, size: int) -> str | None:
        """A blob of `unit` that is not the job's data went to its worker: what it is,
        for the timeline (the mode may count it)."""
        return None

    async def weights_to_take(self, job: Job, unit: Unit, hold_s: float = 0.0) -> dict[str, Any]:
        """What the answer to `unit`'s heartbeat adds (`ProgressAck`'s weights fields):
        the weights a unit takes on its way, once they exist (waiting up to `hold_s`
        for them)."""
        return {}

    # -- results -----------------------------------------------------------------------

    def stopped_steps(self, peer: str, job: Job, unit_id: str) -> int | None:
        """The steps `peer` trained on `unit_id` before the job stopped it early (its
        report earns a receipt without weights), or None when it was not stopped."""
        return None

    def spot_check_reports(self, job: Job, unit: Unit) -> tuple[dict[int, float], str]:
        """The values the worker reported during training ({step: value}, metric
        name), which a spot check compares with its replay."""
        return {}, ""

    def delta_fetched(self, unit: Unit, sha: str, size: int) -> None:
        """`unit`'s delta is fetched and sound in form; its spot check is still to
        come (a mode may start what follows from it meanwhile)."""

    def accept(self, job: Job, unit: Unit, peer: str, checked: Any) -> str:
        """Record `unit`'s checked result (`CheckedResult`: weights sha256, figures shown
        with their status): "" when accepted, else why not (the job or round moved on)."""
        raise NotImplementedError

    # -- restart and the API -----------------------------------------------------------

    def recover_unit(self, unit: Unit) -> bool:
        """After an owner restart: True when the mode ended `unit` itself; False to
        keep it for its worker to re-attach (when its key survived), so that no
        volunteer trains a unit twice because its owner restarted. Every mode keeps
        its units today; a mode whose units cannot outlive their driver says so here."""
        return False

    def recover_job(self, job: Job) -> str:
        """After an owner restart, for a running job: why it is queued again, or ""
        to leave it running (a unit of it is still out on a worker)."""
        if self.ctx.jobs.units_of(job.id, "offered", "running"):
            return ""
        return "owner restarted; re-offering"

    def describe(self, job: Job) -> dict[str, Any]:
        """What the job's API answer adds to the job's own fields."""
        return {}

    def study_path(self, job: Job) -> Path | None:
        """The file of a study the job's driver keeps, if it keeps one."""
        return None


class ManyUnits(JobMode):
    """A job whose units its driver runs: every end of a unit wakes the driver, and a
    lost unit's slot or trial is offered again by it."""

    many_units = True
    units_are: ClassVar[str] = "units"  # what its units are, for the timeline

    def __init__(self, parts: OwnerParts) -> None:
        super().__init__(parts)
        self._lifecycle = parts.lifecycle
        self._placement = parts.placement
        self._changed: dict[str, trio.Event] = {}

    def recover_job(self, job: Job) -> str:
        """Its driver must run again, whether or not a unit of it is still out."""
        return f"owner restarted; resuming its {self.units_are}"

    def unit_changed(self, job_id: str) -> None:
        """A unit of `job_id` moved: its driver looks again (a round may close, a trial
        may be offered)."""
        event = self._changed.get(job_id)
        if event is not None:
            event.set()

    def unit_ended(self, unit: Unit) -> None:
        self.unit_changed(unit.job_id)

    async def _offer_unit(self, job: Job, unit: Unit, note: str, **what: Any) -> None:
        """Offer one of the job's units (`Placement.offer`), then wake the driver."""
        await self._placement.offer(job, unit, note, **what)
        self.unit_changed(job.id)

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None:
        job = self.ctx.jobs.get(unit.job_id)
        if job is None or job.state != "running":
            return
        excluded = job.excluded
        if state == "failed" and at_fault:  # a bad result or a failed unit: not this peer
            excluded = sorted({*excluded, unit.worker} - {self.ctx.peer_id})
        self.ctx.jobs.amend(
            job.id, ("running",), f"{self.where(unit)}: {reason}", excluded=excluded
        )
