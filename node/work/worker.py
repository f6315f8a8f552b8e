"""The worker's side: check an offer against the owner's policy, then fetch, train,
report progress, and return a signed result.

One unit runs at a time (the node's load is then 100%). A unit whose owner answers a
heartbeat with "stop" (lease expired, job cancelled) is cancelled here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ledger.errors import LedgerError
from node.work.context import WorkContext
from node.work.executor import UnitFailed, run_training
from node.work.grants import fetch_granted, issue_grant
from protocol import ProtocolError, decode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import BlobGrant
from protocol.crypto import open_from
from protocol.names import PROGRESS_PROTOCOL, RECEIPT_PROTOCOL, RESULT_PROTOCOL
from protocol.receipts import countersign, open_receipt, parse_cosigned
from protocol.work import (
    WORK_LIMITS,
    OfferReply,
    Progress,
    ReceiptReply,
    Result,
    WorkOffer,
    WorkPackage,
    decode_ack,
)

log = logging.getLogger(__name__)

SPEC_LIMITS = WORK_LIMITS
HEARTBEAT_S = 1.0
RESULT_TIMEOUT_S = 900.0


class Declined(Exception):
    """An offer this node will not take; the message is sent back as the reason."""

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.transient = transient


@dataclass
class RunningUnit:
    owner: str
    package: WorkPackage
    grant: BlobGrant | None  # None when the unit needs no blobs
    spec: dict[str, Any]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    phase: str = "fetching"
    progress: dict[str, Any] = field(default_factory=dict)
    hand_back: bool = False


class WorkerRole:
    def __init__(
        self,
        ctx: WorkContext,
        runner_request: Callable[..., dict[str, Any]],
        validate_spec: Callable[[dict[str, Any]], dict[str, Any]],
        nursery: trio.Nursery,
    ) -> None:
        self.ctx = ctx
        self._runner_request = runner_request
        self._validate_spec = validate_spec  # raises ValueError with the field path
        self._nursery = nursery
        self.current: RunningUnit | None = None

    # -- offers ----------------------------------------------------------------------

    async def handle_offer(self, peer: str, data: bytes) -> bytes:
        job_id = unit_id = "unknown"
        try:
            offer = open_envelope(data, WorkOffer, expected_signer=peer, limits=WORK_LIMITS)
            job_id, unit_id = offer.message.job_id, offer.message.unit_id
            unit = self._check_offer(peer, offer.message)
        except (ProtocolError, Declined) as exc:
            reason = str(exc) if isinstance(exc, Declined) else f"bad offer: {exc}"
            log.info("declined offer %s/%s from %s: %s", job_id, unit_id, peer, reason)
            return self._reply(job_id, unit_id, False, reason, getattr(exc, "transient", False))
        self.current = unit
        self.ctx.claim(unit.package.unit_id)
        self._nursery.start_soon(self._run, unit)
        log.info("accepted unit %s of job %s from %s", unit_id, job_id, peer)
        return self._reply(job_id, unit_id, True, "")

    def _check_offer(self, peer: str, offer: WorkOffer) -> RunningUnit:
        ctx = self.ctx
        if offer.worker != ctx.peer_id:
            raise Declined("the offer is addressed to another node")
        try:
            inner = open_from(public_key_from_peer_id(peer), ctx.identity.signing_key, offer.sealed)
        except ProtocolError as exc:
            raise Declined(f"cannot open the package: not sealed to this node ({exc})") from exc
        package = open_envelope(
            inner, WorkPackage, expected_signer=peer, limits=WORK_LIMITS
        ).message
        if (package.job_id, package.unit_id) != (offer.job_id, offer.unit_id):
            raise Declined("the package does not match the offer")
        self._check_policy(peer, package)
        try:
            spec = self._validate_spec(decode(package.spec, SPEC_LIMITS))
        except ValueError as exc:
            raise Declined(f"invalid job spec: {exc}") from exc
        self._check_requirements(spec)
        grant = None
        if package.blobs:
            grant = open_envelope(
                package.blob_grant, BlobGrant, expected_signer=peer, limits=WORK_LIMITS
            ).message
            if grant.grantee != ctx.peer_id or sorted(grant.blobs) != sorted(package.blobs):
                raise Declined("the blob grant does not match the package")
        return RunningUnit(peer, package, grant, spec)

    def _check_policy(self, owner: str, package: WorkPackage) -> None:
        policy = self.ctx.policy()
        if not policy.accepting:
            raise Declined("this node is paused (not accepting work)")
        if owner in self.ctx.deny_owners:
            raise Declined("this node does not take work from you (deny list)")
        if self.ctx.allow_owners and owner not in self.ctx.allow_owners:
            raise Declined("this node only takes work from its allow list")
        if self.ctx.units_here:
            raise Declined("busy with another unit (load 100%)", transient=True)
        if package.max_hours > policy.max_job_hours:
            raise Declined(
                f"job may run {package.max_hours:g} h; this node takes up to "
                f"{policy.max_job_hours:g} h"
            )

    def _check_requirements(self, spec: dict[str, Any]) -> None:
        req = spec.get("requirements", {})
        gpus = [g for g in self.ctx.own_ad().gpus if g.kind == "cuda"]
        if req.get("gpu") == "required" and not gpus:
            raise Declined("the job requires a GPU; this node has none")
        need_mb = float(req.get("min_gpu_memory_gb", 0)) * 1024
        share = self.ctx.policy().max_gpu_memory_share
        if gpus and need_mb and not any(g.memory_total_mb * share >= need_mb for g in gpus):
            raise Declined(
                f"the job needs {need_mb / 1024:g} GB of GPU memory; this node "
                f"offers {share:.0%} of its GPU memory"
            )

    def _reply(
        self, job_id: str, unit_id: str, accepted: bool, reason: str, transient: bool = False
    ) -> bytes:
        return seal(
            OfferReply(
                job_id[:128] or "unknown",
                unit_id[:128] or "unknown",
                accepted,
                reason[:1000],
                transient,
            ),
            self.ctx.identity.signing_key,
        )

    # -- running a unit --------------------------------------------------------------

    def stop_current(self, hand_back: bool) -> None:
        """Pause with hand-back: cancel the running unit and tell its owner."""
        if self.current is not None and hand_back:
            self.current.hand_back = True
            self.current.scope.cancel()

    async def _run(self, unit: RunningUnit) -> None:
        pkg = unit.package
        ctx = self.ctx
        ctx.grant_keys[(pkg.job_id, pkg.unit_id)] = pkg.job_key
        outcome: Result | None = None
        try:
            async with trio.open_nursery() as heartbeat:
                heartbeat.start_soon(self._heartbeat, unit)
                with unit.scope:
                    outcome = await self._train(unit)
                heartbeat.cancel_scope.cancel()
            if outcome is None:
                why = (
                    "handed back by the volunteer (node paused)"
                    if unit.hand_back
                    else ("stopped: the owner no longer wants this unit")
                )
                outcome = self._failure(pkg, why, retryable=True)
            await self._send_result(unit, outcome)
        finally:
            ctx.grant_keys.pop((pkg.job_id, pkg.unit_id), None)
            self.current = None
            ctx.release(pkg.unit_id)

    async def _train(self, unit: RunningUnit) -> Result:
        pkg = unit.package
        ctx = self.ctx
        if unit.grant is not None:
            try:
                await fetch_granted(
                    ctx,
                    unit.owner,
                    unit.grant,
                    pkg.blob_grant,
                    pkg.job_key,
                    pkg.blobs,
                    unit.grant.max_bytes,
                )
            except Exception as exc:
                return self._failure(pkg, f"could not fetch the data: {exc}", retryable=True)
        unit.phase = "training"
        out = ctx.unit_dir(pkg.unit_id) / "weights.safetensors"
        request = self._runner_request(
            unit.spec, {s: str(ctx.blobs.path(s)) for s in pkg.blobs}, out
        )

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") in ("progress", "started"):
                unit.progress.update({k: v for k, v in event.items() if k != "event"})

        try:
            result = await run_training(
                request, ctx.unit_dir(pkg.unit_id), pkg.max_hours * 3600, on_event
            )
        except UnitFailed as exc:
            return self._failure(pkg, str(exc))
        unit.phase = "uploading"
        sha = await trio.to_thread.run_sync(ctx.blobs.put_file, out)
        size = ctx.blobs.size(sha)
        grant = issue_grant(ctx, pkg.job_id, pkg.unit_id, unit.owner, [sha], size, 24 * 3600)
        return Result(
            job_id=pkg.job_id,
            unit_id=pkg.unit_id,
            ok=True,
            error="",
            weights_sha256=sha,
            weights_size=size,
            weights_grant=grant,
            metrics={
                k: float(v)
                for k, v in result.get("metrics", {}).items()
                if isinstance(v, int | float)
            },
            steps=int(result.get("steps", 0)),
            samples=int(result.get("samples", 0)),
            wall_time_s=float(result.get("wall_time_s", 0.0)),
            device=str(result.get("device", ""))[:64],
        )

    def _failure(self, pkg: WorkPackage, error: str, retryable: bool = False) -> Result:
        return Result(pkg.job_id, pkg.unit_id, False, error[:4000], "", 0, b"", retryable=retryable)

    async def _heartbeat(self, unit: RunningUnit) -> None:
        """Progress to the owner every second; it renews the lease or says stop."""
        pkg = unit.package
        interval = min(HEARTBEAT_S, pkg.lease_s / 3)
        while True:
            p = unit.progress
            message = Progress(
                job_id=pkg.job_id,
                unit_id=pkg.unit_id,
                phase=unit.phase,
                step=int(p.get("step", 0)),
                total_steps=int(p.get("total_steps", 0)),
                loss=p.get("loss"),
                samples_per_s=float(p.get("samples_per_s", 0.0)),
                samples=int(p.get("samples", 0)),
                timestamp=time.time(),
            )
            try:
                raw = await self.ctx.host.request(
                    unit.owner,
                    PROGRESS_PROTOCOL,
                    seal(message, self.ctx.identity.signing_key),
                    WORK_LIMITS.max_bytes,
                    timeout=max(5.0, pkg.lease_s / 2),
                )
                ok, reason = decode_ack(raw)
                if not ok:
                    log.info("owner stopped unit %s: %s", pkg.unit_id, reason)
                    unit.scope.cancel()
                    return
            except Exception as exc:  # owner unreachable for now: keep training
                log.debug("heartbeat for %s failed: %s", pkg.unit_id, exc)
            await trio.sleep(interval)

    async def _send_result(self, unit: RunningUnit, result: Result) -> None:
        ctx = self.ctx
        try:
            raw = await ctx.host.request(
                unit.owner,
                RESULT_PROTOCOL,
                seal(result, ctx.identity.signing_key),
                WORK_LIMITS.max_bytes,
                timeout=RESULT_TIMEOUT_S,
            )
            reply = open_envelope(
                raw, ReceiptReply, expected_signer=unit.owner, limits=WORK_LIMITS
            ).message
        except Exception as exc:
            log.warning("unit %s: result not delivered to %s: %s", result.unit_id, unit.owner, exc)
            return
        if not reply.accepted or not reply.receipt:
            log.info("unit %s: owner answered: %s", result.unit_id, reply.reason or "ok")
            return
        try:
            await self._countersign(unit, result, reply.receipt)
        except (ProtocolError, LedgerError, ValueError) as exc:
            log.warning(
                "unit %s: receipt from %s not countersigned: %s", result.unit_id, unit.owner, exc
            )

    async def _countersign(self, unit: RunningUnit, result: Result, half_signed: bytes) -> None:
        """Check the owner's receipt against our result and our own credit figure, sign
        it, record it in our ledger, hand it back to the owner and gossip it."""
        ctx = self.ctx
        receipt = parse_cosigned(half_signed)
        issued = open_receipt(receipt.receipt)
        if (issued.owner, issued.job_id, issued.unit_id, issued.worker, issued.weights_sha256) != (
            unit.owner,
            result.job_id,
            result.unit_id,
            ctx.peer_id,
            result.weights_sha256,
        ):
            raise ProtocolError("the receipt does not match the result sent")
        data = ctx.blobs.path(unit.package.blobs[0]) if unit.package.blobs else None
        credit = await trio.to_thread.run_sync(ctx.credit_for, unit.spec, data)
        cosigned = countersign(half_signed, ctx.identity.signing_key, credit)
        ctx.ledger.append_work("work_done", cosigned, credit, credit)
        ctx.jobs.add_receipt(
            result.unit_id, result.job_id, "worker", unit.owner, ctx.peer_id, cosigned
        )
        try:
            raw = await ctx.host.request(
                unit.owner, RECEIPT_PROTOCOL, cosigned, WORK_LIMITS.max_bytes
            )
            ok, why = decode_ack(raw)
        except Exception as exc:  # recorded here; gossip still tells the network
            ok, why = False, str(exc)
        if not ok:
            log.warning(
                "unit %s: owner did not take the countersigned receipt: %s", result.unit_id, why
            )
        await ctx.publish_receipt(cosigned)
        log.info("unit %s done; co-signed receipt recorded (%.6f TFLOP)", result.unit_id, credit)
