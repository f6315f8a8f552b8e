"""The worker's side: check an offer against the owner's policy, then fetch, train,
report progress, and return a signed result.

A node trains up to `max_units` units at once (of different jobs or owners). A unit
whose owner answers a heartbeat with "stop" (lease expired, job cancelled, past its
max_hours) is cancelled here too. Result and receipt exchanges that fail in transit
are retried with backoff until a deadline; `work_done` enters the ledger only once
the owner has taken the countersigned receipt, never on the worker's own word.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from node.work import offers
from node.work.blobs import TransferUnreachable, fetch_granted, issue_grant
from node.work.context import WorkContext
from node.work.delivery import deliver, with_retries
from node.work.heartbeats import Heartbeats, HeldEvidence, RunningUnit
from node.work.held_weights import HeldWeights
from node.work.offers import NO_ID, Declined
from node.work.run import (
    REBUILT_WEIGHTS,
    TAKEN_WEIGHTS,
    RequestBuilder,
    UnitFailed,
    inner_state_for,
    keep_inner_state,
    share_request,
)
from node.work.taken_weights import takes_weights
from node.work.trust import MAX_HELD, HeldStates, drawn_by_commitment, spot_checked
from protocol import ProtocolError, open_envelope
from protocol.work import WORK_LIMITS, Result, WorkOffer, WorkPackage
from training.spec.job import relay_blob_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

OWNER_BACK_S = 60.0  # an owner unreachable while we fetch: the time a restart may take


class WorkerRole:
    def __init__(
        self,
        ctx: WorkContext,
        runner_request: RequestBuilder,
        validate_spec: Callable[[dict[str, Any]], dict[str, Any]],
        nursery: trio.Nursery,
    ) -> None:
        self.ctx = ctx
        self._runner_request = runner_request
        self._validate_spec = validate_spec  # raises ValueError with the field path
        self._nursery = nursery
        self.units: dict[str, RunningUnit] = {}  # by unit id
        self._evidence = HeldEvidence(ctx.blobs)
        self._heartbeats = Heartbeats(ctx, self._evidence)
        self._weights = HeldWeights(ctx.blobs)  # each elastic job's newest global weights

    @property
    def current(self) -> RunningUnit | None:
        """The oldest unit training here, if any (what the status page shows)."""
        return next(iter(self.units.values()), None)

    # -- offers ----------------------------------------------------------------------

    async def handle_offer(self, peer: str, data: bytes) -> bytes:
        job_id = unit_id = NO_ID
        try:
            offer = open_envelope(data, WorkOffer, expected_signer=peer, limits=WORK_LIMITS)
            job_id, unit_id = offer.message.job_id, offer.message.unit_id
            unit = self._check_offer(peer, offer.message)
        except (ProtocolError, Declined) as exc:
            reason = str(exc) if isinstance(exc, Declined) else f"bad offer: {exc}"
            log.info("declined offer %s/%s from %s: %s", job_id, unit_id, peer, reason)
            return self._reply(job_id, unit_id, False, reason, getattr(exc, "transient", False))
        self.units[unit.package.unit_id] = unit
        self.ctx.claim(unit.package.unit_id)
        self._nursery.start_soon(self._run, unit)
        log.info("accepted unit %s of job %s from %s", unit_id, job_id, peer)
        return self._reply(job_id, unit_id, True, "")

    def _check_offer(self, peer: str, offer: WorkOffer) -> RunningUnit:
        """The unit `offer` brings, when every check passes (`offers.check_offer`)."""
        ctx = self.ctx
        offers.check_addressed(ctx, offer)
        if offer.unit_id in self.units or ctx.jobs.receipt(offer.unit_id) is not None:
            raise Declined(f"unit {offer.unit_id} is already known here")
        offers.check_policy(ctx, peer)
        package = offers.open_package(ctx, peer, offer)
        spec, grant = offers.check_offer(ctx, peer, package, self._validate_spec)
        return RunningUnit(peer, package, grant, spec)

    def _reply(
        self, job_id: str, unit_id: str, accepted: bool, reason: str, transient: bool = False
    ) -> bytes:
        return offers.reply(self.ctx, job_id, unit_id, accepted, reason, transient)

    # -- running a unit --------------------------------------------------------------

    def stop_current(self, hand_back: bool, why: str = "node paused") -> None:
        """Pause with hand-back: cancel the running units and tell their owners."""
        if not hand_back:
            return
        for unit in self.units.values():
            unit.hand_back = why
            unit.scope.cancel()

    async def hand_back_all(self, timeout: float) -> None:
        """On shutdown: give every running unit back to its owner, who offers it
        again at once instead of waiting out its lease; up to `timeout` seconds."""
        if not self.units:
            return
        self.stop_current(hand_back=True, why="node shutting down")
        with trio.move_on_after(timeout):
            while self.units:
                await trio.sleep(0.05)

    async def _run(self, unit: RunningUnit) -> None:
        pkg = unit.package
        ctx = self.ctx
        ctx.grant_keys[(pkg.job_id, pkg.unit_id)] = pkg.job_key
        try:
            async with trio.open_nursery() as heartbeat:
                heartbeat.start_soon(self._heartbeats.run, unit, heartbeat)
                outcome = await self._outcome(unit)
                unit.phase = "uploading"  # heartbeats hold the lease while it is delivered
                ctx.release(pkg.unit_id)  # its runner is gone: room for the next unit
                await deliver(ctx, unit, outcome)
                heartbeat.cancel_scope.cancel()
        except Exception:
            log.exception("unit %s: result not delivered", pkg.unit_id)
        finally:
            ctx.grant_keys.pop((pkg.job_id, pkg.unit_id), None)
            self.units.pop(pkg.unit_id, None)
            ctx.release(pkg.unit_id)
            self._evidence.drop(unit)

    async def _outcome(self, unit: RunningUnit) -> Result:
        """Train the unit; whatever happens, a Result to send (a failure says why)."""
        pkg = unit.package
        with unit.scope:
            try:
                return await self._train(unit)
            except Exception as exc:  # a bug here fails this unit, not the node
                log.exception("unit %s: internal error", pkg.unit_id)
                return self._failure(pkg, f"internal error on the worker: {exc}", retryable=True)
        why = (
            f"handed back by the volunteer ({unit.hand_back})"
            if unit.hand_back
            else "stopped: the owner no longer wants this unit"
        )
        stopped = self._failure(pkg, why, retryable=True)
        # the steps it trained: a trial the sweep's pruner stopped earns their share
        return dataclasses.replace(stopped, steps=int(unit.progress.get("step", 0)))

    async def _train(self, unit: RunningUnit) -> Result:
        pkg = unit.package
        ctx = self.ctx
        share = pkg.round_share
        rebuilds = share is not None and self._weights.rebuilds(pkg.job_id, share)
        blobs = self._weights.to_fetch(pkg.blobs, share, rebuilds)
        await ctx.warm_runners()
        if unit.grant is not None:
            fetch = partial(
                fetch_granted,
                ctx,
                unit.owner,
                unit.grant,
                pkg.blob_grant,
                pkg.job_key,
                blobs,
                unit.grant.max_bytes,
                relay_blob_bytes(unit.spec),
            )
            try:  # an owner that restarts is waited for (its grant still holds after)
                fetched = await with_retries(
                    ctx,
                    fetch,
                    unit.owner,
                    f"unit {pkg.unit_id}: fetch",
                    deadline_s=OWNER_BACK_S,
                    retry_on=(TransferUnreachable,),
                )
            except Exception as exc:
                return self._failure(pkg, f"could not fetch the data: {exc}", retryable=True)
            if fetched is None:
                why = f"could not fetch the data: {unit.owner} unreachable for {OWNER_BACK_S:.0f} s"
                return self._failure(pkg, why, retryable=True)
        unit.phase = "training"
        out = ctx.unit_dir(pkg.unit_id) / "weights.safetensors"
        if rebuilds:
            assert share is not None
            blobs.append(share.base_sha256)
        request = self._runner_request(unit.spec, {s: str(ctx.blobs.path(s)) for s in blobs}, out)
        if share is not None:  # one share of an elastic round: it returns a delta
            kept = inner_state_for(ctx.data_dir, pkg.job_id, share.slot, share.round)
            unit.takes = takes_weights(unit.spec, share)
            request = share_request(request, pkg.job_id, share, kept, out, rebuilds, unit.takes)
        if share is None and spot_checked(unit.spec):  # the owner evaluates the weights
            request = request.without_final_validation()
        if pkg.resume is not None:  # it goes on from a lost unit's state
            request = request.resuming(pkg.resume.state_sha256, pkg.resume.step)
        # the evidence a spot check replays (training.evidence.checkpoints), at most
        # MAX_HELD states at once where the owner draws as they come (commitments)
        bounded = drawn_by_commitment(unit.spec)
        if bounded:
            request = request.with_checkpoints(MAX_HELD, ctx.limits.evidence_floor_bytes)
        else:
            request = request.with_checkpoints()
        floor = ctx.limits.evidence_floor_bytes if bounded else None
        held = unit.held = HeldStates(out.parent / "checkpoints", floor_bytes=floor)

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") in ("progress", "started"):
                unit.progress.update({k: v for k, v in event.items() if k != "event"})
            elif event.get("event") == "waiting":  # for the round's weights: ask now
                unit.waiting = True
                unit.committed.set()
            elif event.get("event") == "checkpoint":
                held.written(event)
                if held.pressing():
                    unit.committed.set()  # the runner may wait on the owner: commit now

        try:
            result = await ctx.train_unit(request, pkg.unit_id, pkg.max_hours, on_event)
        except UnitFailed as exc:
            return self._failure(pkg, str(exc))
        if share is not None:  # the inner state this node keeps for the job's next round
            state = out.parent / "state_out.safetensors"
            await trio.to_thread.run_sync(
                keep_inner_state, ctx.data_dir, pkg.job_id, share.slot, share.round, state
            )
            await self._keep_weights(unit, rebuilds, out.parent)
        unit.phase = "uploading"
        sha = await trio.to_thread.run_sync(ctx.blobs.put_file, out)
        size = ctx.blobs.size(sha)
        checkpoints = [str(sha) for sha in result.get("checkpoints", [])]
        if checkpoints != held.shas:
            raise RuntimeError("the runner's checkpoints are not those it committed to")
        async with unit.held_lock:  # from here on the result's grant holds the states
            unit.held = None
            for index, path in held.files.items():  # those not drawn, or drawn to keep
                if index not in held.stored:
                    await trio.to_thread.run_sync(
                        self._evidence.store, unit, path, held.shas[index]
                    )
        shutil.rmtree(held.folder, ignore_errors=True)
        peak = result.get("evidence_peak", {})
        log.info(
            "unit %s: %d checkpoints, at most %s of them held at once (%s MiB)",
            pkg.unit_id,
            len(checkpoints),
            peak.get("states", "?"),
            int(peak.get("bytes", 0)) >> 20,
        )
        kept = sorted(set(unit.evidence))
        largest = max([size, *(ctx.blobs.size(c) for c in kept)])
        grant = issue_grant(
            ctx, pkg.job_id, pkg.unit_id, unit.owner, [sha, *kept], largest, 24 * 3600
        )
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
            checkpoints=checkpoints,
        )

    async def _keep_weights(self, unit: RunningUnit, rebuilt: bool, folder: Path) -> None:
        """The round's weights (or those the share took on its way) stay as the base
        of the job's next update; a used update goes."""
        job_id, share = unit.package.job_id, unit.package.round_share
        assert share is not None
        others = [u for u in self.units.values() if u is not unit]
        in_use = {sha for u in others for sha in [*u.package.blobs, u.taken]}
        if unit.taken:  # its own delivery reads the weights it started from
            in_use.add(share.weights_sha256)
        said = f"job {job_id}: round {share.round}'s weights"
        if rebuilt:  # another share of the round may read the update
            what = f"{said} rebuilt from the round before's and"
            await self._weights.store(folder / REBUILT_WEIGHTS, share.update_sha256, in_use, what)
        newest = share.weights_sha256
        if unit.taken:
            what = f"{said} taken on the share's way, from"
            newest = await self._weights.store(folder / TAKEN_WEIGHTS, unit.taken, in_use, what)
        self._weights.keep(job_id, newest, in_use)

    def _failure(self, pkg: WorkPackage, error: str, retryable: bool = False) -> Result:
        return Result(pkg.job_id, pkg.unit_id, False, error[:4000], "", 0, b"", retryable=retryable)
