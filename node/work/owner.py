"""The owner's side of a job: submit, place, offer, watch the lease, verify, receipt.

Every job lives in `node.db`; every decision (offered, declined, vanished, completed)
lands in the job's timeline, and a job that cannot be placed says why in `reason`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio
from safetensors import safe_open

from ledger.errors import LedgerError
from node.work.context import WorkContext
from node.work.executor import UnitFailed, run_training
from node.work.grants import fetch_granted, issue_grant
from node.work.jobs import Job, Unit
from node.work.scheduler import SELF, choose_worker
from protocol import ProtocolError, encode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import BlobGrant
from protocol.crypto import new_job_key, seal_to
from protocol.names import TASK_PROTOCOL
from protocol.receipts import flops_to_credit, issue, open_cosigned, parse_cosigned
from protocol.work import (
    WORK_LIMITS,
    OfferReply,
    Progress,
    Receipt,
    ReceiptReply,
    Result,
    WorkOffer,
    WorkPackage,
    encode_ack,
)

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
MAX_WEIGHTS_BYTES = 4 << 30
RESULT_FETCH_S = 900.0  # the result stream's timeout: the lease holds this long
HISTORY_POINTS = 500


class OwnerRole:
    def __init__(self, ctx: WorkContext, runner_request: Any) -> None:
        self.ctx = ctx
        self._runner_request = runner_request  # builds the training subprocess request
        self._wake = trio.Event()
        self._placing: set[str] = set()
        self._local: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None

    # -- entry points ----------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        self._recover()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._lease_loop)
            while True:
                for job in self.ctx.jobs.in_state("queued"):
                    if job.id not in self._placing:
                        self._placing.add(job.id)
                        nursery.start_soon(self._place, job.id)
                with trio.move_on_after(1.0):
                    await self._wake.wait()
                self._wake = trio.Event()

    def cancel(self, job_id: str) -> Job | None:
        job = self.ctx.jobs.get(job_id)
        if job is None or job.state in ("completed", "failed", "cancelled"):
            return job
        if job_id in self._local:
            self._local[job_id].cancel()
        self._end_unit(job.unit_id, "cancelled", "cancelled by the owner")
        return self.ctx.jobs.update(job, state="cancelled", note="cancelled by the owner")

    # -- placement -------------------------------------------------------------------

    async def _place(self, job_id: str) -> None:
        try:
            while True:
                job = self.ctx.jobs.get(job_id)
                if job is None or job.state != "queued":
                    return
                excluded = set(job.excluded)
                if self.ctx.units_here:
                    excluded.add(SELF)  # this node trains one unit at a time
                choice = choose_worker(
                    job.spec.get("requirements", {}),
                    job.placement,
                    self.ctx.peers.entries(),
                    self.ctx.own_ad(),
                    excluded,
                )
                if choice.worker is None:
                    if job.reason != choice.reason:
                        self.ctx.jobs.update(job, reason=choice.reason)
                    return
                if choice.worker == SELF:
                    await self._train_here(job, choice.reason)
                    return
                if await self._offer(job, choice.worker):
                    return
        finally:
            self._placing.discard(job_id)

    async def _offer(self, job: Job, peer: str) -> bool:
        """Offer `job` to `peer`. True: accepted, or the peer is only busy (try again
        later). False: declined for this job, and the peer is excluded from it."""
        ctx = self.ctx
        hours = float(job.spec.get("requirements", {}).get("max_hours", 1.0))
        unit = ctx.jobs.add_unit(job.id, peer, ctx.lease_s * 3)  # grace for fetching
        key = new_job_key()
        max_bytes = max((ctx.blobs.size(s) for s in job.data_blobs), default=0)
        grant = (
            issue_grant(
                ctx, job.id, unit.unit_id, peer, job.data_blobs, max_bytes, hours * 3600 + 3600
            )
            if job.data_blobs
            else b""  # built-in data sets need no blobs
        )
        package = WorkPackage(
            job.id, unit.unit_id, encode(job.spec), job.data_blobs, grant, key, hours, ctx.lease_s
        )
        sealed = seal_to(
            public_key_from_peer_id(peer),
            ctx.identity.signing_key,
            seal(package, ctx.identity.signing_key),
        )
        offer = seal(
            WorkOffer(job.id, unit.unit_id, peer, sealed, time.time()), ctx.identity.signing_key
        )
        ctx.grant_keys[(job.id, unit.unit_id)] = key
        try:
            raw = await ctx.host.request(peer, TASK_PROTOCOL, offer, WORK_LIMITS.max_bytes)
            reply = open_envelope(raw, OfferReply, expected_signer=peer, limits=WORK_LIMITS).message
            if (reply.job_id, reply.unit_id) != (job.id, unit.unit_id):
                raise ProtocolError("the reply names another job or unit")
        except Exception as exc:  # unreachable for now: not a refusal of this job
            reply = OfferReply(job.id, unit.unit_id, False, f"offer failed: {exc}", True)
        if not reply.accepted:
            self._end_unit(unit.unit_id, "failed", reply.reason)
            log.info("job %s: %s declined: %s", job.id, peer, reply.reason)
            if reply.transient:  # busy or unreachable now: the job waits, asks again
                self.ctx.jobs.update(job, reason=f"{peer}: {reply.reason}; retrying")
                return True
            self.ctx.jobs.update(
                job, excluded=[*job.excluded, peer], note=f"{peer} declined: {reply.reason}"
            )
            return False
        log.info("job %s: unit %s accepted by %s", job.id, unit.unit_id, peer)
        current = ctx.jobs.unit(unit.unit_id)
        if current is None or current.state != "offered":
            return True  # its result already arrived (a fast failure) and was handled
        ctx.jobs.update_unit(current, state="running")
        ctx.jobs.update(
            job,
            state="running",
            worker=peer,
            unit_id=unit.unit_id,
            reason="",
            attempts=job.attempts + 1,
            note=f"accepted by {peer}",
        )
        return True

    async def _train_here(self, job: Job, why: str) -> None:
        """Train the job on this node (no peer fits, or placement = "local")."""
        ctx = self.ctx
        unit = ctx.jobs.add_unit(job.id, ctx.peer_id, 1e12)  # no lease: local
        ctx.jobs.update_unit(unit, state="running")
        job = ctx.jobs.update(
            job,
            state="running",
            worker=ctx.peer_id,
            unit_id=unit.unit_id,
            reason="",
            attempts=job.attempts + 1,
            note=why,
        )
        out = ctx.unit_dir(unit.unit_id) / "weights.safetensors"
        request = self._runner_request(
            job.spec, {s: str(ctx.blobs.path(s)) for s in job.data_blobs}, out
        )
        hours = float(job.spec.get("requirements", {}).get("max_hours", 1.0))

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "progress":
                self._record_progress(job.id, "training", event)

        ctx.claim(unit.unit_id)
        with trio.CancelScope() as scope:
            self._local[job.id] = scope
            try:
                result = await run_training(
                    request, ctx.unit_dir(unit.unit_id), hours * 3600, on_event
                )
            except UnitFailed as exc:
                self._end_unit(unit.unit_id, "failed", str(exc))
                job = ctx.jobs.get(job.id) or job
                ctx.jobs.update(job, state="failed", reason=str(exc), note="training failed")
                return
            finally:
                self._local.pop(job.id, None)
                ctx.release(unit.unit_id)
            sha = await trio.to_thread.run_sync(ctx.blobs.put_file, out)
            self._end_unit(unit.unit_id, "done")
            job = ctx.jobs.get(job.id) or job
            ctx.jobs.update(
                job,
                state="completed",
                weights_sha256=sha,
                metrics=_result_metrics(result),
                note="trained on this node",
            )

    # -- worker -> owner streams -------------------------------------------------------

    def _active_unit(self, peer: str, job_id: str, unit_id: str) -> tuple[Unit | None, str]:
        unit = self.ctx.jobs.unit(unit_id)
        if unit is None or unit.job_id != job_id or unit.worker != peer:
            return None, "unknown unit"
        if unit.state not in ("offered", "running"):
            why = (
                "its lease expired and it was re-offered"
                if unit.state == "expired"
                else (f"the unit is {unit.state}")
            )
            return None, why
        return unit, ""

    async def handle_progress(self, peer: str, data: bytes) -> bytes:
        try:
            progress = open_envelope(
                data, Progress, expected_signer=peer, limits=WORK_LIMITS
            ).message
        except ProtocolError as exc:
            return encode_ack(False, f"bad progress message: {exc}")
        unit, why = self._active_unit(peer, progress.job_id, progress.unit_id)
        if unit is None:
            return encode_ack(False, why)
        self.ctx.jobs.update_unit(unit, lease_expires=time.time() + self.ctx.lease_s)
        self._record_progress(
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
        return encode_ack(True)

    def _record_progress(self, job_id: str, phase: str, event: dict[str, Any]) -> None:
        job = self.ctx.jobs.get(job_id)
        if job is None:
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
        self.ctx.jobs.update(job, progress=progress)

    async def handle_result(self, peer: str, data: bytes) -> bytes:
        """Verify a worker's result, fetch and check the weights, answer with a receipt."""
        try:
            result = open_envelope(data, Result, expected_signer=peer, limits=WORK_LIMITS).message
        except ProtocolError as exc:
            return self._reply(False, f"bad result: {exc}")
        unit, why = self._active_unit(peer, result.job_id, result.unit_id)
        job = self.ctx.jobs.get(result.job_id)
        if unit is None or job is None:
            log.info("result from %s for unit %s rejected: %s", peer, result.unit_id, why)
            if job is not None and why != "unknown unit":  # a unit this peer really had
                self.ctx.jobs.update(job, note=f"late result from {peer} rejected: {why}")
                self._record_rejection(job.id, result.unit_id, peer, f"result rejected: {why}")
            return self._reply(False, f"result rejected: {why}")
        # fetching and checking the weights may take a while: hold the lease meanwhile
        self.ctx.jobs.update_unit(unit, lease_expires=time.time() + RESULT_FETCH_S)
        if not result.ok:
            if result.retryable:  # not the job's fault: offer it elsewhere
                self._unit_failed(job, unit, f"{peer} returned the unit: {result.error}")
            else:  # the spec fails deterministically: retrying elsewhere fails the same way
                self._end_unit(unit.unit_id, "failed", result.error)
                self.ctx.jobs.update(
                    job,
                    state="failed",
                    worker=peer,
                    reason=f"training failed on {peer}: {result.error}",
                    note="training failed",
                )
            return self._reply(True, "failure recorded")
        try:
            await self._fetch_weights(peer, result)
        except Exception as exc:
            self._unit_failed(job, unit, f"weights from {peer} rejected: {exc}")
            self._record_rejection(job.id, unit.unit_id, peer, f"weights rejected: {exc}")
            return self._reply(False, f"weights rejected: {exc}")
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
        # the credit comes from the spec, never from the worker; it countersigns the same
        half_signed = issue(receipt, self._credit(job), self.ctx.identity.signing_key)
        self.ctx.jobs.add_receipt(
            unit.unit_id, job.id, "owner", self.ctx.peer_id, peer, half_signed
        )
        self._end_unit(unit.unit_id, "done")
        job = self.ctx.jobs.get(job.id) or job
        metrics = {
            **dict(result.metrics),
            "steps": result.steps,
            "samples": result.samples,
            "wall_time_s": result.wall_time_s,
            "device": result.device,
        }
        self.ctx.jobs.update(
            job,
            state="completed",
            weights_sha256=result.weights_sha256,
            metrics=metrics,
            note=f"result from {peer} verified; receipt issued",
        )
        log.info("job %s completed by %s", job.id, peer)
        return self._reply(True, "", half_signed)

    async def handle_countersigned(self, peer: str, data: bytes) -> bytes:
        """The worker's countersigned receipt: record it in the ledger and gossip it."""
        try:
            verified = open_cosigned(data)
        except ProtocolError as exc:
            return encode_ack(False, f"bad receipt: {exc}")
        if verified.worker != peer or verified.owner != self.ctx.peer_id:
            return encode_ack(False, "the receipt names other peers")
        issued = self.ctx.jobs.receipt(verified.unit_id)
        job = self.ctx.jobs.get(verified.job_id)
        if (
            issued is None
            or job is None
            or parse_cosigned(issued).receipt != (verified.cosigned.receipt)
        ):
            return encode_ack(False, "this node issued no such receipt")
        try:
            self.ctx.ledger.append_work("work_received", data, verified.credit, self._credit(job))
        except LedgerError as exc:
            log.warning("receipt for unit %s not recorded: %s", verified.unit_id, exc)
            return encode_ack(False, str(exc))
        self.ctx.jobs.add_receipt(verified.unit_id, job.id, "owner", self.ctx.peer_id, peer, data)
        await self.ctx.publish_receipt(data)
        log.info(
            "unit %s: co-signed receipt recorded (%.6f TFLOP)", verified.unit_id, verified.credit
        )
        return encode_ack(True)

    @staticmethod
    def _credit(job: Job) -> float:
        return flops_to_credit(int(job.summary.get("training_flops", 0)))

    def _record_rejection(self, job_id: str, unit_id: str, worker: str, reason: str) -> None:
        try:
            self.ctx.ledger.append_rejected(job_id, unit_id, worker, self.ctx.peer_id, reason)
        except LedgerError as exc:
            log.warning("rejection of unit %s not recorded: %s", unit_id, exc)

    async def _fetch_weights(self, peer: str, result: Result) -> None:
        grant = open_envelope(
            result.weights_grant, BlobGrant, expected_signer=peer, limits=WORK_LIMITS
        ).message
        if (
            grant.grantee != self.ctx.peer_id
            or grant.blobs != [result.weights_sha256]
            or (grant.job_id, grant.unit_id) != (result.job_id, result.unit_id)
        ):
            raise ProtocolError("the weights grant does not match the result")
        key = self.ctx.grant_keys.get((result.job_id, result.unit_id))
        if key is None:
            raise ProtocolError("no job key for this unit (owner restarted?)")
        size = min(result.weights_size, grant.max_bytes, MAX_WEIGHTS_BYTES)
        had = self.ctx.blobs.has(result.weights_sha256)
        await fetch_granted(
            self.ctx, peer, grant, result.weights_grant, key, [result.weights_sha256], size
        )
        path = self.ctx.blobs.path(result.weights_sha256)
        try:  # weights are safetensors or nothing: never unpickled
            with safe_open(str(path), framework="pt") as f:
                f.keys()
        except Exception as exc:
            if not had:  # what was just fetched for this result is not kept
                self.ctx.blobs.remove(result.weights_sha256)
            raise ProtocolError(f"weights are not a safetensors file ({exc})") from exc

    def _reply(self, accepted: bool, reason: str, receipt: bytes = b"") -> bytes:
        return seal(ReceiptReply(accepted, reason, receipt), self.ctx.identity.signing_key)

    # -- leases and failures ----------------------------------------------------------

    def _unit_failed(self, job: Job, unit: Unit, reason: str, state: str = "failed") -> None:
        self._end_unit(unit.unit_id, state, reason)
        job = self.ctx.jobs.get(job.id) or job
        if job.state != "running" or job.unit_id != unit.unit_id:
            return
        if job.attempts >= MAX_ATTEMPTS:
            self.ctx.jobs.update(
                job, state="failed", reason=reason, note=f"giving up after {job.attempts} attempts"
            )
        else:
            self.ctx.jobs.update(
                job,
                state="queued",
                worker="",
                unit_id="",
                reason=reason,
                excluded=[*job.excluded, unit.worker],
                note=reason,
            )
            self.wake()

    def _end_unit(self, unit_id: str, state: str, reason: str = "") -> None:
        unit = self.ctx.jobs.unit(unit_id) if unit_id else None
        if unit is None:
            return
        self.ctx.jobs.update_unit(unit, state=state, ended_at=time.time(), reason=reason)
        self.ctx.grant_keys.pop((unit.job_id, unit.unit_id), None)

    async def _lease_loop(self) -> None:
        while True:
            await trio.sleep(0.5)
            now = time.time()
            for unit in self.ctx.jobs.units_in_state("offered", "running"):
                if unit.worker != self.ctx.peer_id and unit.lease_expires < now:
                    job = self.ctx.jobs.get(unit.job_id)
                    log.info("unit %s: worker %s vanished; re-offering", unit.unit_id, unit.worker)
                    if job is not None:
                        self._unit_failed(
                            job,
                            unit,
                            f"worker {unit.worker} vanished (no "
                            f"heartbeat for {self.ctx.lease_s:g} s)",
                            "expired",
                        )

    def _recover(self) -> None:
        """After a restart, leases cannot be confirmed (keys are gone): re-offer."""
        for unit in self.ctx.jobs.units_in_state("offered", "running"):
            self.ctx.jobs.update_unit(
                unit, state="expired", ended_at=time.time(), reason="owner restarted"
            )
        for job in self.ctx.jobs.in_state("running"):
            self.ctx.jobs.update(
                job, state="queued", worker="", unit_id="", note="owner restarted; re-offering"
            )


def _result_metrics(result: dict[str, Any]) -> dict[str, Any]:
    return {
        **dict(result.get("metrics", {})),
        "steps": result.get("steps", 0),
        "samples": result.get("samples", 0),
        "wall_time_s": result.get("wall_time_s", 0.0),
        "device": result.get("device", ""),
    }
