"""Leases: a remote unit lives while its worker's heartbeats keep coming, and never
past the job's `max_hours`.

Every `Progress` message renews the lease; a unit whose lease runs out is lost (the
job is offered elsewhere). A unit's deadline (offer time + max_hours + a fetch
allowance) caps every renewal, so a worker cannot hold a unit, and its place in the
job, forever by heartbeating. After an owner restart the units are not given up:
their keys are still in node.db (`unit_keys.py`), so a worker that is still
training re-attaches with its next heartbeat, and one that is gone expires as usual.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import trio

from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.owner.lifecycle import Lifecycle, round_closed_reason
from node.work.trust import CHECKED_REPORTS, Commitments, UnitTerms
from protocol import ProtocolError, open_envelope
from protocol.work import WORK_LIMITS, Progress, encode_ack, encode_progress_ack

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5
RECONNECT_S = 30.0  # after an owner restart, extra time for its workers to reconnect
PAST_MAX_HOURS = "the unit ran past the job's max_hours"
# how long the answer to a "waiting" heartbeat may wait for the round's weights; well
# within the worker's request timeout (node.work.heartbeats: at least 5 s)
TAKE_HOLD_S = 2.0


def unit_deadline(ctx: WorkContext, job: Job, now: float) -> float:
    """When a unit offered at `now` ends whatever its heartbeats say: the job's
    max_hours of training plus time to fetch the data."""
    return now + job.max_hours * 3600 + 4 * ctx.limits.lease_s


class Leases:
    def __init__(
        self,
        ctx: WorkContext,
        lifecycle: Lifecycle,
        commitments: Commitments,
    ) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self.commitments = commitments  # the states a worker commits to as it trains
        self._paused: set[str] = set()  # live units whose worker said "paused"

    def active_unit(self, peer: str, job_id: str, unit_id: str) -> tuple[Unit | None, str]:
        """The live unit `peer` may speak for, or None and why not."""
        unit = self.ctx.jobs.unit(unit_id)
        if unit is None or unit.job_id != job_id or unit.worker != peer:
            return None, "unknown unit"
        if unit.state == "expired":
            # the lease loop may have ended it at its deadline, or its round closed, a
            # moment before this message arrived: say so, rather than blame a lease
            # the worker kept
            if unit.reason == PAST_MAX_HOURS or unit.reason == round_closed_reason(unit.round):
                return None, unit.reason
            return None, "its lease expired and it was re-offered"
        if unit.state not in ("offered", "running", "verifying"):
            return None, f"the unit is {unit.state}"
        if time.time() > unit.deadline:
            return None, PAST_MAX_HOURS
        return unit, ""

    async def handle_progress(self, peer: str, data: bytes) -> bytes:
        try:
            progress = open_envelope(
                data, Progress, expected_signer=peer, limits=WORK_LIMITS
            ).message
        except ProtocolError as exc:
            return encode_ack(False, f"bad progress message: {exc}")
        unit, why = self.active_unit(peer, progress.job_id, progress.unit_id)
        if unit is None:
            return encode_ack(False, why)
        if self.ctx.jobs.renew_lease(unit.unit_id, time.time() + self.ctx.limits.lease_s) is None:
            return encode_ack(False, "the unit ended")
        if unit.state == "offered":  # the owner restarted before it saw the acceptance
            self._lifecycle.start(unit, f"{peer} still training; re-attached")
        self._note_pause(unit, peer, progress.phase)
        job = self.ctx.jobs.get(unit.job_id)
        mode = self._lifecycle.mode_of(job)
        # "" to go on, or why the unit stops (a sweep's pruner stopped its trial)
        stop = mode.progress(unit, progress)
        if stop or job is None:
            return encode_ack(not stop, stop)
        _, metric = mode.spot_check_reports(job, unit)
        terms = UnitTerms(
            mode.unit_spec(job, unit),
            mode.delta_round(unit),
            mode.resumable(job),
            metric in CHECKED_REPORTS,
        )
        ack = await self.commitments.heard(job, unit, terms, progress)
        if ack.ok:  # a runner that waits for its round's weights gets them at once
            hold_s = TAKE_HOLD_S if progress.phase == "waiting" else 0.0
            if taking := await mode.weights_to_take(job, unit, hold_s):
                ack = dataclasses.replace(ack, **taking)
        return encode_progress_ack(ack)

    def _note_pause(self, unit: Unit, peer: str, phase: str) -> None:
        """The job's timeline says when a worker's volunteer pauses its unit, and when
        it goes on; the lease holds meanwhile (its heartbeats go on)."""
        now = phase == "paused"
        if now == (unit.unit_id in self._paused):
            return
        if now:
            self._paused.add(unit.unit_id)
        else:
            self._paused.discard(unit.unit_id)
        what = "paused by its volunteer's preferences" if now else "training again"
        self.ctx.jobs.note(unit.job_id, f"unit {unit.unit_id}: {peer} {what}")

    async def run(self) -> None:
        while True:
            await trio.sleep(CHECK_EVERY_S)
            self.expire(time.time())

    def expire(self, now: float) -> None:
        """End every remote unit whose lease or deadline has passed by `now`."""
        live = self.ctx.jobs.units_in_state("offered", "running", "verifying")
        self._paused &= {unit.unit_id for unit in live}
        for unit in live:
            if unit.worker == self.ctx.peer_id:
                continue  # trained here: the executor's time limit holds it
            if unit.state == "verifying":  # its result handler never finished
                if now > unit.lease_expires:
                    self._lifecycle.lost(unit.unit_id, "the result's check did not finish")
            elif now > unit.deadline:
                self._lifecycle.lost(unit.unit_id, PAST_MAX_HOURS, "expired")
            elif now > unit.lease_expires and unit.state == "offered":
                # offered as the owner stopped, and no heartbeat since: the offer may
                # never have arrived, which is no fault of the worker's
                why = f"the offer to {unit.worker} was never confirmed"
                self._lifecycle.lost(unit.unit_id, why, "expired", at_fault=False)
            elif now > unit.lease_expires:
                log.info("unit %s: worker %s vanished", unit.unit_id, unit.worker)
                silent_s = self.ctx.limits.lease_s
                why = f"worker {unit.worker} vanished (no heartbeat for {silent_s:g} s)"
                self._lifecycle.lost(unit.unit_id, why, "expired")

    def recover(self) -> None:
        """After a restart: keep remote units whose key survived and give their
        workers one more lease to speak up; everything else is lost."""
        ctx = self.ctx
        keys = ctx.unit_keys.load() if ctx.unit_keys is not None else {}
        now = time.time()
        for unit in ctx.jobs.units_in_state("offered", "running", "verifying"):
            key = keys.get((unit.job_id, unit.unit_id))
            if self._lifecycle.mode_of(ctx.jobs.get(unit.job_id)).recover_unit(unit):
                continue
            if unit.worker == ctx.peer_id or key is None:
                why = (
                    "owner restarted while training it here"
                    if unit.worker == ctx.peer_id
                    else "owner restarted and lost the unit's key"
                )
                self._lifecycle.lost(unit.unit_id, why, "expired")
                continue
            ctx.grant_keys[(unit.job_id, unit.unit_id)] = key
            if unit.state == "verifying":  # the worker sends its result again
                ctx.jobs.unit_transition(unit.unit_id, ("verifying",), state="running")
            ctx.jobs.renew_lease(unit.unit_id, now + 3 * ctx.limits.lease_s + RECONNECT_S)
            log.info("unit %s: waiting for %s to re-attach", unit.unit_id, unit.worker)
        for job in ctx.jobs.in_state("running"):  # its mode says whether to queue it again
            note = self._lifecycle.mode_of(job).recover_job(job)
            if note:
                ctx.jobs.transition(job.id, ("running",), note, state="queued")
