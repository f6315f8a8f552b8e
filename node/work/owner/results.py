"""A worker's result: verified, its weights fetched and checked, answered with a receipt.

Checked before anything is accepted: the signature (the worker's own), that the unit
is this worker's and live, the weights against the job's model plan
(`node.work.owner.result_files`), then a spot check by replay and, for a job with
replicas, the partner's result (`node.work.trust.spot_checks`, `node.work.trust.replicas`). The
unit moves running -> verifying before the fetch, so a second result for it is
refused at once and at most one receipt is ever issued. Credit comes from the spec,
never from the worker; the metrics shown are the owner's own evaluation of the
weights when the result was spot-checked, else labelled as the worker's claim.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from node.work import receipts
from node.work.blobs import TransferError
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.owner.leases import Leases
from node.work.owner.lifecycle import Lifecycle, round_closed_reason
from node.work.owner.modes import JobMode
from node.work.owner.result_files import fetch_and_check, weights_grant
from node.work.trust import Replicas, SpotChecks, Submitted, Verdict
from protocol import MeshminerError, ProtocolError, open_envelope, seal
from protocol.work import (
    RESULT_BEING_CHECKED,
    WORK_LIMITS,
    ReceiptReply,
    Result,
)

log = logging.getLogger(__name__)

RESULT_FETCH_S = 900.0  # the result stream's timeout: verification holds the unit this long


@dataclass(frozen=True)
class CheckedResult:
    """A result that passed every check, as its job's mode accepts it."""

    result: Result
    metrics: dict[str, Any]  # the figures the job shows
    status: str  # "verified" (evaluated here by a spot check) or "claimed"
    via: str  # for the timeline: how the weights came, when not the usual way
    found: str  # for the timeline: what the check found ("" or "; ...")


class Results:
    def __init__(
        self,
        ctx: WorkContext,
        lifecycle: Lifecycle,
        leases: Leases,
        spot_checks: SpotChecks,
    ) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._leases = leases
        self._mode_of = lifecycle.mode_of
        self._spot_checks = spot_checks
        self._replicas = Replicas(spot_checks)

    async def handle_result(self, peer: str, data: bytes) -> bytes:
        """Verify a worker's result, fetch and check the weights, answer with a receipt."""
        try:
            result = open_envelope(data, Result, expected_signer=peer, limits=WORK_LIMITS).message
        except ProtocolError as exc:
            return self._reply(False, f"bad result: {exc}")
        unit, why = self._leases.active_unit(peer, result.job_id, result.unit_id)
        job = self.ctx.jobs.get(result.job_id)
        # a unit its job stopped early (a trial the pruner stopped): whatever its worker
        # sends (a stop report, or a result that crossed the stop) earns the share for
        # the steps before the stop
        stopped = self._mode_of(job).stopped_steps(peer, job, result.unit_id) if job else None
        if stopped is not None and job is not None:
            return self._accept_stopped(job, result.unit_id, stopped, peer)
        if unit is None or job is None:
            issued = receipts.issued_for(self.ctx, peer, result)
            if issued is not None:  # the answer to the first copy was lost in transit
                return self._reply(True, "", issued)
            log.info("result from %s for unit %s rejected: %s", peer, result.unit_id, why)
            # a late result for a unit this peer really had; a late failure report
            # (a pruned trial's, say) or a late share is no misconduct
            if job is not None and why != "unknown unit" and result.ok:
                self.ctx.jobs.note(job.id, f"late result from {peer} rejected: {why}", (job.state,))
                if not self._late_share(result.unit_id, why):
                    self._record_rejection(job.id, result.unit_id, peer, f"result rejected: {why}")
            return self._reply(False, f"result rejected: {why}")
        if not result.ok:
            if result.retryable:  # not the job's fault: offer it elsewhere
                self._lifecycle.lost(unit.unit_id, f"{peer} returned the unit: {result.error}")
            else:  # the spec fails deterministically: retrying elsewhere fails the same way
                self._lifecycle.fatal(unit.unit_id, f"training failed on {peer}: {result.error}")
            return self._reply(True, "failure recorded")
        verifying = self.ctx.jobs.unit_transition(
            unit.unit_id,
            ("offered", "running"),
            state="verifying",
            lease_expires=time.time() + RESULT_FETCH_S,
        )
        if verifying is None:  # a copy sent again: the first is being checked
            return self._reply(False, RESULT_BEING_CHECKED)
        mode = self._mode_of(job)
        try:
            spec = mode.unit_spec(job, unit)
            delta_round = mode.delta_round(unit)
            fetched = await fetch_and_check(
                self.ctx, job, spec, peer, result, delta_round, unit.start_delta, verifying.taken
            )
            if delta_round is not None:
                mode.delta_fetched(unit, result.weights_sha256, result.weights_size)
        except Exception as exc:
            if isinstance(exc, TransferError) and exc.peer_gone:
                return self._unverified(unit.unit_id, peer, f"its weights: {exc}")
            reason = f"weights from {peer} rejected: {exc}"
            log.info("unit %s: %s", unit.unit_id, reason)
            self._lifecycle.lost(unit.unit_id, reason)
            self._record_rejection(job.id, unit.unit_id, peer, f"weights rejected: {exc}")
            return self._reply(False, f"weights rejected: {exc}")
        verdict = None
        if self._spot_checks.wanted(job):
            verdict = await self._spot_check(job, unit, peer, result, data)
            if verdict.unverified:
                return self._unverified(unit.unit_id, peer, verdict.reason)
            if not verdict.ok:
                if not fetched.had:  # weights that failed are not kept
                    self.ctx.blobs.remove(result.weights_sha256)
                return await self._invalidate(job, unit, peer, verdict)
            checked = bool(verdict.segments)  # probation counts what was replayed
            self._spot_checks.reputation.valid(peer, mode.credit(job, unit), checked=checked)
        try:
            return self._accept(mode, job, unit, peer, result, verdict, fetched.via)
        except Exception as exc:  # a bug here loses this unit, never the node
            log.exception("unit %s: accepting the result failed", unit.unit_id)
            self._lifecycle.lost(unit.unit_id, f"internal error on the owner: {exc}")
            return self._reply(False, "the owner could not record the result; it retries")

    def _unverified(self, unit_id: str, peer: str, what: str) -> bytes:
        """The worker vanished after delivering, before its result could be checked: a
        fair end, at no one's fault (no rejection entry, no exclusion: the unit ends
        `expired` and is offered again) and without credit."""
        reason = f"could not verify the result of {peer}: it stopped serving {what}"
        log.info("unit %s: %s", unit_id, reason)
        self._lifecycle.lost(unit_id, reason, "expired", at_fault=False)
        return self._reply(False, reason)

    def _late_share(self, unit_id: str, why: str) -> bool:
        unit = self.ctx.jobs.unit(unit_id)
        return unit is not None and why == round_closed_reason(unit.round)

    def _accept_stopped(self, job: Job, unit_id: str, steps: int, peer: str) -> bytes:
        """The worker of a unit its job stopped early reports the stop: the receipt for
        the steps before it (no weights), issued once."""
        unit = self.ctx.jobs.unit(unit_id)
        assert unit is not None  # the mode found it to say it was stopped
        credit = self._mode_of(job).credit(job, unit)
        return self._reply(True, "", receipts.for_stopped(self.ctx, job, unit, steps, credit))

    def _accept(
        self,
        mode: JobMode,
        job: Job,
        unit: Unit,
        peer: str,
        result: Result,
        verdict: Verdict | None,
        via: str,
    ) -> bytes:
        """Issue the half-signed receipt; the job's mode records the result (a job or
        round that ended while the weights were checked gives no receipt)."""
        half_signed = receipts.for_result(self.ctx, peer, result, mode.credit(job, unit))
        metrics, status = self._metrics(result, verdict)
        found = f"; {verdict.note}" if verdict is not None and verdict.note else ""
        why = mode.accept(job, unit, peer, CheckedResult(result, metrics, status, via, found))
        if why:
            return self._reply(False, f"result rejected: {why}")
        self.ctx.jobs.add_receipt(
            unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, half_signed
        )
        return self._reply(True, "", half_signed)

    def _metrics(self, result: Result, verdict: Verdict | None) -> tuple[dict[str, Any], str]:
        """The figures the job shows: evaluated here when the result was spot-checked
        (the worker's own are kept as `claimed_<name>`), else the worker's claim."""
        counts = {
            "steps": result.steps,
            "samples": result.samples,
            "wall_time_s": result.wall_time_s,
        }
        if verdict is None:
            return {**dict(result.metrics), **counts}, "claimed"
        checked = {
            "checked_segments": len(verdict.segments),
            "checked_while_training": verdict.early,
            "replayed_steps": verdict.replayed_steps,
            "check": "bitwise" if verdict.strict else f"tolerance {verdict.tolerance:g}",
        }
        claimed = {f"claimed_{k}": v for k, v in result.metrics.items()}  # the worker's word
        shown = {**dict(result.metrics), **verdict.metrics, **counts, **checked, **claimed}
        # a share none of whose segments was drawn is taken on its worker's word
        return shown, "verified" if verdict.segments or verdict.metrics else "claimed"

    async def _spot_check(
        self, job: Job, unit: Unit, peer: str, result: Result, envelope: bytes
    ) -> Verdict:
        """Replay a few segments of the result (`node.work.trust.spot_checks`) and, for a job
        with replicas, compare it with its partner's (`node.work.trust.replicas`). A check
        that cannot run (the worker serves no checkpoint) fails the result."""
        mode = self._mode_of(job)
        spec = mode.unit_spec(job, unit)
        key = self.ctx.grant_keys.get((result.job_id, result.unit_id), b"")
        self.ctx.jobs.note(job.id, f"spot-checking the result of {peer}", (job.state,))
        try:
            grant = weights_grant(self.ctx, peer, result)
            reports, metric = mode.spot_check_reports(job, unit)
            sub = Submitted(
                job,
                unit,
                spec,
                peer,
                result,
                envelope,
                grant,
                key,
                reports,
                metric,
                delta_round=mode.delta_round(unit),
            )
            verdict = await self._spot_checks.check(sub)
        except TransferError as exc:
            if exc.peer_gone:
                return Verdict(False, f"its evidence: {exc}", unverified=True)
            log.info("unit %s: spot check could not run: %s", unit.unit_id, exc)
            return Verdict(False, f"the spot check could not run: {exc}")
        except Exception as exc:
            log.info("unit %s: spot check could not run: %s", unit.unit_id, exc)
            return Verdict(False, f"the spot check could not run: {exc}")
        if verdict.ok and int(job.spec.get("trust", {}).get("replicas", 1)) > 1:
            settled = await self._replicas.settle(sub)
            verdict.ok, verdict.reason, verdict.evidence = (
                settled.ok,
                settled.reason,
                settled.evidence,
            )
            verdict.note, verdict.caught = settled.note, not settled.ok
        return verdict

    async def _invalidate(self, job: Job, unit: Unit, peer: str, verdict: Verdict) -> bytes:
        """No credit, the evidence in the ledger and on gossip, the worker caught, and
        the unit offered to someone else."""
        reason = f"{peer} failed a spot check: {verdict.reason}"
        log.warning("unit %s: %s", unit.unit_id, reason)
        if verdict.caught:
            self._spot_checks.reputation.caught(peer, verdict.reason)
        if verdict.evidence:
            try:
                self.ctx.ledger.append_invalidated(
                    job.id, unit.unit_id, peer, self.ctx.peer_id, verdict.reason, verdict.evidence
                )
            except MeshminerError as exc:
                log.warning("invalidation of unit %s not recorded: %s", unit.unit_id, exc)
            await self.ctx.publish_evidence(verdict.evidence)
        else:  # a check that could not run, or a false report (signed only in heartbeats)
            self._record_rejection(job.id, unit.unit_id, peer, reason)
        self._lifecycle.lost(unit.unit_id, reason)
        return self._reply(False, f"spot check failed: {verdict.reason}")

    async def handle_countersigned(self, peer: str, data: bytes) -> bytes:
        """The worker's co-signed receipt (`node.work.receipts.take_cosigned`)."""
        return await receipts.take_cosigned(
            self.ctx, peer, data, lambda job, unit: self._mode_of(job).credit(job, unit)
        )

    def _record_rejection(self, job_id: str, unit_id: str, worker: str, reason: str) -> None:
        try:
            self.ctx.ledger.append_rejected(job_id, unit_id, worker, self.ctx.peer_id, reason)
        except MeshminerError as exc:
            log.warning("rejection of unit %s not recorded: %s", unit_id, exc)

    def _reply(self, accepted: bool, reason: str, receipt: bytes = b"") -> bytes:
        return seal(ReceiptReply(accepted, reason, receipt), self.ctx.identity.signing_key)
