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
from typing import Any

from node.work.context import WorkContext
from node.work.jobs import Job, Trial, Unit
from node.work.owner.leases import Leases
from node.work.owner.lifecycle import Lifecycle, round_closed_reason
from node.work.owner.modes import SweepTrials
from node.work.owner.result_files import fetch_and_check, weights_grant
from node.work.trust import Replicas, SpotChecks, Submitted, Verdict
from protocol import MeshminerError, ProtocolError, open_envelope, seal
from protocol.receipts import (
    NO_WEIGHTS_SHA256,
    flops_to_credit,
    issue,
    open_cosigned,
    open_receipt,
    parse_cosigned,
)
from protocol.work import (
    RESULT_BEING_CHECKED,
    WORK_LIMITS,
    Receipt,
    ReceiptReply,
    Result,
    encode_ack,
)

log = logging.getLogger(__name__)

RESULT_FETCH_S = 900.0  # the result stream's timeout: verification holds the unit this long


class Results:
    def __init__(
        self,
        ctx: WorkContext,
        lifecycle: Lifecycle,
        leases: Leases,
        sweeps: SweepTrials,
        spot_checks: SpotChecks,
    ) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._leases = leases
        self._sweeps = sweeps
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
        # a trial the pruner stopped: whatever its worker sends (a stop report, or a
        # result that crossed the stop) earns the share for the steps before it
        pruned = self._sweeps.pruned(peer, result.job_id, result.unit_id)
        if pruned is not None and job is not None:
            return self._accept_pruned(job, *pruned, peer)
        if unit is None or job is None:
            issued = self._issued_for(peer, result)
            if issued is not None:  # the answer to the first copy was lost in transit
                return self._reply(True, "", issued)
            log.info("result from %s for unit %s rejected: %s", peer, result.unit_id, why)
            # a late result for a unit this peer really had; a late failure report
            # (a pruned trial's, say) or a late share is no misconduct
            if job is not None and why != "unknown unit" and result.ok:
                self.ctx.jobs.transition(
                    job.id, (job.state,), f"late result from {peer} rejected: {why}"
                )
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
        try:
            spec = self._spec_of(job, unit)
            fetched = await fetch_and_check(self.ctx, job, unit, spec, peer, result)
        except Exception as exc:
            reason = f"weights from {peer} rejected: {exc}"
            log.info("unit %s: %s", unit.unit_id, reason)
            self._lifecycle.lost(unit.unit_id, reason)
            self._record_rejection(job.id, unit.unit_id, peer, f"weights rejected: {exc}")
            return self._reply(False, f"weights rejected: {exc}")
        verdict = None
        if self._spot_checks.wanted(job):
            verdict = await self._spot_check(job, unit, peer, result, data)
            if not verdict.ok:
                if not fetched.had:  # weights that failed are not kept
                    self.ctx.blobs.remove(result.weights_sha256)
                return await self._invalidate(job, unit, peer, verdict)
            self._spot_checks.reputation.valid(peer, self._credit(job, unit))
        try:
            if unit.round >= 0:
                return self._accept_share(job, unit, peer, result, fetched.via)
            if unit.trial >= 0:
                return self._accept_trial(job, unit, peer, result, verdict, fetched.via)
            return self._accept(job, unit, peer, result, verdict, fetched.via)
        except Exception as exc:  # a bug here loses this unit, never the node
            log.exception("unit %s: accepting the result failed", unit.unit_id)
            self._lifecycle.lost(unit.unit_id, f"internal error on the owner: {exc}")
            return self._reply(False, "the owner could not record the result; it retries")

    def _issued_for(self, peer: str, result: Result) -> bytes | None:
        """The receipt this node issued for this very result (the worker asks again
        when the answer to its first copy was lost), else None."""
        issued = self.ctx.jobs.receipt(result.unit_id)
        if issued is None or not result.ok:
            return None
        try:
            receipt = open_receipt(parse_cosigned(issued).receipt)
        except ProtocolError:
            return None
        same = (receipt.worker, receipt.job_id, receipt.weights_sha256)
        return issued if same == (peer, result.job_id, result.weights_sha256) else None

    def _late_share(self, unit_id: str, why: str) -> bool:
        unit = self.ctx.jobs.unit(unit_id)
        return unit is not None and why == round_closed_reason(unit.round)

    def _accept_share(self, job: Job, unit: Unit, peer: str, result: Result, via: str) -> bytes:
        """An elastic round's delta, checked: the half-signed receipt for its H inner
        steps; the round applies the delta when it closes."""
        half_signed = self._half_signed(job, unit, peer, result)
        if not self._lifecycle.share_done(
            unit.unit_id,
            result.weights_sha256,
            self.ctx.blobs.size(result.weights_sha256),  # as fetched, not as claimed
            f"round {unit.round}: delta from {peer}{via} checked; receipt issued",
        ):
            return self._reply(False, "result rejected: the round closed while it was checked")
        self.ctx.jobs.add_receipt(
            unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, half_signed
        )
        return self._reply(True, "", half_signed)

    def _accept_trial(
        self, job: Job, unit: Unit, peer: str, result: Result, verdict: Verdict | None, via: str
    ) -> bytes:
        """A sweep trial's weights, checked: the receipt for its run, and the trial
        complete with the metric the worker reported."""
        half_signed = self._half_signed(job, unit, peer, result)
        if not self._lifecycle.share_done(
            unit.unit_id,
            result.weights_sha256,
            self.ctx.blobs.size(result.weights_sha256),
            f"trial {unit.trial}: weights from {peer}{via} checked; receipt issued",
        ):
            return self._reply(False, "result rejected: the sweep ended while it was checked")
        self.ctx.jobs.add_receipt(
            unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, half_signed
        )
        metrics, _ = self._metrics(result, verdict)
        self._sweeps.trial_done(job, unit, result.weights_sha256, metrics)
        return self._reply(True, "", half_signed)

    def _accept_pruned(self, job: Job, unit: Unit, trial: Trial, peer: str) -> bytes:
        """A pruned trial's worker reports its stop: the receipt for the steps before
        the report that pruned it (no weights), issued once."""
        issued = self.ctx.jobs.receipt(unit.unit_id)
        if issued is None:
            receipt = seal(
                Receipt(
                    job.id,
                    unit.unit_id,
                    self.ctx.peer_id,
                    peer,
                    NO_WEIGHTS_SHA256,
                    trial.steps,
                    0,
                    {"pruned_at_step": float(trial.steps)},
                    time.time(),
                ),
                self.ctx.identity.signing_key,
            )
            issued = issue(receipt, self._credit(job, unit), self.ctx.identity.signing_key)
            self.ctx.jobs.add_receipt(unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, issued)
        return self._reply(True, "", issued)

    def _half_signed(self, job: Job, unit: Unit, peer: str, result: Result) -> bytes:
        receipt = seal(
            Receipt(
                job.id,
                unit.unit_id,
                self.ctx.peer_id,
                peer,
                result.weights_sha256,
                result.steps,
                result.samples,
                dict(result.metrics),
                time.time(),
            ),
            self.ctx.identity.signing_key,
        )
        return issue(receipt, self._credit(job, unit), self.ctx.identity.signing_key)

    def _credit(self, job: Job, unit: Unit) -> float:
        """A unit's credit, from the spec it trained (a trial's own), never the worker."""
        if unit.trial >= 0:
            return self._sweeps.credit(job.id, unit)
        return credit_of(job)

    def _accept(
        self, job: Job, unit: Unit, peer: str, result: Result, verdict: Verdict | None, via: str
    ) -> bytes:
        """Issue the half-signed receipt, then complete the unit and the job; a job
        cancelled while the weights were checked stays cancelled and gives no receipt."""
        half_signed = self._half_signed(job, unit, peer, result)
        metrics, status = self._metrics(result, verdict)
        found = f"; {verdict.note}" if verdict is not None and verdict.note else ""
        completed = self._lifecycle.done(
            unit.unit_id,
            ("verifying",),
            result.weights_sha256,
            {**metrics, "device": result.device},
            status,
            f"result from {peer}{via} checked{found}; receipt issued",
        )
        if completed is None and not self._replica_of_completed(job.id, unit, result):
            return self._reply(False, "result rejected: the job ended while it was checked")
        # a replica still training is not needed any more (one being checked settles)
        for other in self.ctx.jobs.units_of(job.id, "offered", "running"):
            self._lifecycle.end(other.unit_id, "cancelled", "the unit settled without it")
        self.ctx.jobs.add_receipt(
            unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, half_signed
        )
        log.info("job %s completed by %s", job.id, peer)
        return self._reply(True, "", half_signed)

    def _replica_of_completed(self, job_id: str, unit: Unit, result: Result) -> bool:
        """The partner replica completed the job with these very weights first."""
        now, job = self.ctx.jobs.unit(unit.unit_id), self.ctx.jobs.get(job_id)
        return (
            now is not None
            and now.state == "done"
            and job is not None
            and job.state == "completed"
            and job.weights_sha256 == result.weights_sha256
        )

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
            "replayed_steps": verdict.replayed_steps,
            "check": "bitwise" if verdict.strict else f"tolerance {verdict.tolerance:g}",
        }
        claimed = {f"claimed_{k}": v for k, v in result.metrics.items()}  # the worker's word
        shown = {**dict(result.metrics), **verdict.metrics, **counts, **checked, **claimed}
        return shown, "verified"

    async def _spot_check(
        self, job: Job, unit: Unit, peer: str, result: Result, envelope: bytes
    ) -> Verdict:
        """Replay a few segments of the result (`node.work.trust.spot_checks`) and, for a job
        with replicas, compare it with its partner's (`node.work.trust.replicas`). A check
        that cannot run (the worker serves no checkpoint) fails the result."""
        spec = self._spec_of(job, unit)
        key = self.ctx.grant_keys.get((result.job_id, result.unit_id), b"")
        self.ctx.jobs.transition(job.id, (job.state,), f"spot-checking the result of {peer}")
        try:
            grant = weights_grant(self.ctx, peer, result)
            reports, metric = (
                self._sweeps.reports_of(job, unit.trial) if unit.trial >= 0 else ({}, "")
            )
            sub = Submitted(job, unit, spec, peer, result, envelope, grant, key, reports, metric)
            verdict = await self._spot_checks.check(sub)
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
        """The worker's countersigned receipt: record it in the ledger and gossip it.
        Idempotent: a worker retrying after a lost answer gets the same yes."""
        try:
            verified = open_cosigned(data)
        except ProtocolError as exc:
            return encode_ack(False, f"bad receipt: {exc}")
        if verified.worker != peer or verified.owner != self.ctx.peer_id:
            return encode_ack(False, "the receipt names other peers")
        issued = self.ctx.jobs.receipt(verified.unit_id)
        job = self.ctx.jobs.get(verified.job_id)
        unit = self.ctx.jobs.unit(verified.unit_id)
        if (
            issued is None
            or job is None
            or unit is None
            or parse_cosigned(issued).receipt != verified.cosigned.receipt
        ):
            return encode_ack(False, "this node issued no such receipt")
        if issued == data:
            return encode_ack(True)  # recorded already
        expected = self._credit(job, unit)
        try:
            self.ctx.ledger.append_work("work_received", data, verified.credit, expected)
        except MeshminerError as exc:  # the ledger's refusals, credit disagreements too
            log.warning("receipt for unit %s not recorded: %s", verified.unit_id, exc)
            return encode_ack(False, str(exc))
        self.ctx.jobs.add_receipt(verified.unit_id, job.id, "owner", self.ctx.peer_id, peer, data)
        await self.ctx.publish_receipt(data)
        log.info(
            "unit %s: co-signed receipt recorded (%.6f TFLOP)", verified.unit_id, verified.credit
        )
        return encode_ack(True)

    def _record_rejection(self, job_id: str, unit_id: str, worker: str, reason: str) -> None:
        try:
            self.ctx.ledger.append_rejected(job_id, unit_id, worker, self.ctx.peer_id, reason)
        except MeshminerError as exc:
            log.warning("rejection of unit %s not recorded: %s", unit_id, exc)

    def _spec_of(self, job: Job, unit: Unit) -> dict[str, Any]:
        """The plain spec `unit` trained: a sweep trial's own, else the job's."""
        return self._sweeps.trial_spec(job, unit.trial) if unit.trial >= 0 else job.spec

    def _reply(self, accepted: bool, reason: str, receipt: bytes = b"") -> bytes:
        return seal(ReceiptReply(accepted, reason, receipt), self.ctx.identity.signing_key)


def credit_of(job: Job) -> float:
    """The credit a unit of `job` earns, from the spec's summary computed at submit."""
    return flops_to_credit(int(job.summary.get("training_flops", 0)))
