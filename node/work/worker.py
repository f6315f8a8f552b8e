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
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from node.work import offers
from node.work.blobs import TransferUnreachable, fetch_granted, issue_grant
from node.work.context import WorkContext
from node.work.delivery import deliver, with_retries
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
from node.work.taken_weights import fetch_taken, takes_weights
from node.work.trust import MAX_HELD, HeldStates, drawn_by_commitment, spot_checked
from protocol import (
    ProtocolError,
    open_envelope,
    seal,
)
from protocol.blobs import BlobGrant
from protocol.names import PROGRESS_PROTOCOL
from protocol.work import (
    WORK_LIMITS,
    Progress,
    ProgressAck,
    Result,
    WorkOffer,
    WorkPackage,
    decode_progress_ack,
)
from training.spec.job import relay_blob_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_S = 1.0
MIN_HEARTBEAT_S = 0.1  # heartbeats come at most this often, checkpoints or not
TAKES_HEARTBEAT_S = 0.2  # ... and this often while a runner waits for its round's weights
OWNER_BACK_S = 60.0  # an owner unreachable while we fetch: the time a restart may take


@dataclass
class RunningUnit:
    owner: str
    package: WorkPackage
    grant: BlobGrant | None  # None when the unit needs no blobs
    spec: dict[str, Any]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    phase: str = "fetching"
    progress: dict[str, Any] = field(default_factory=dict)
    hand_back: str = ""  # why the volunteer gives it back ("": it does not)
    evidence: list[str] = field(default_factory=list)  # its checkpoints in the blob store
    held: HeldStates | None = None  # the states it committed to, while it trains
    held_lock: trio.Lock = field(default_factory=trio.Lock)  # heartbeats vs. the result
    committed: trio.Event = field(default_factory=trio.Event)  # a new state to commit to
    evidence_grant: bytes = b""  # the worker's grant to the states the owner asked for
    takes: bool = False  # an eager share that takes its round's weights on its way
    waiting: bool = False  # ... whose runner waits for them
    taking: bool = False  # ... and fetches them now
    taken: str = ""  # ... the blob it fetched for them


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
        # checkpoints in the blob store, by the units holding them: units of one spec
        # share states, so a file goes when the last unit holding it is settled
        self._evidence = Counter[str]()
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
                heartbeat.start_soon(self._heartbeat, unit, heartbeat)
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
            self._drop_evidence(unit)

    def _drop_evidence(self, unit: RunningUnit) -> None:
        """The unit is settled (the owner answered, or gave up): its checkpoints go,
        except those another unit here still holds (equal initial states)."""
        for sha in unit.evidence:
            self._release_state(sha)
        unit.evidence = []

    def _store_state(self, unit: RunningUnit, path: Path, sha: str) -> None:
        """A committed state into the blob store (its file's second name), held for
        `unit`; the owner fetches it from there."""
        self.ctx.blobs.link_file(path, sha)
        unit.evidence.append(sha)
        self._evidence[sha] += 1

    def _release_state(self, sha: str) -> None:
        self._evidence[sha] -= 1
        if self._evidence[sha] <= 0:
            del self._evidence[sha]
            self.ctx.blobs.remove(sha)

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
                    await trio.to_thread.run_sync(self._store_state, unit, path, held.shas[index])
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

    def _phase(self, unit: RunningUnit) -> str:
        """What the owner is told: a training unit is "paused" while the volunteer's
        preferences hold its runner stopped, and "waiting" while its runner waits for
        its round's weights (the owner answers once they exist)."""
        if unit.phase != "training":
            return unit.phase
        if self.ctx.paused_because():
            return "paused"
        return "waiting" if unit.waiting and not unit.taken else "training"

    async def _heartbeat(self, unit: RunningUnit, nursery: trio.Nursery) -> None:
        """Progress to the owner every second, and soon after each new checkpoint (its
        commitment); the answer renews the lease or says stop, and decides which
        committed states the worker keeps for the owner and which may go. A share
        that takes its round's weights on its way fetches them (in `nursery`) once an
        answer names them, and asks at once when its runner begins to wait for them
        (the owner holds that answer until they exist), then every 0.3 s."""
        pkg = unit.package
        interval = min(HEARTBEAT_S, pkg.lease_s / 3)
        reached = True  # whether the last heartbeat got an answer
        while True:
            told = self._phase(unit)
            p = unit.progress
            commit_from, commitments = unit.held.unsent() if unit.held else (0, [])
            message = Progress(
                job_id=pkg.job_id,
                unit_id=pkg.unit_id,
                phase=told,
                step=int(p.get("step", 0)),
                total_steps=int(p.get("total_steps", 0)),
                loss=p.get("loss"),
                samples_per_s=float(p.get("samples_per_s", 0.0)),
                samples=int(p.get("samples", 0)),
                timestamp=time.time(),
                val_loss=p.get("val_loss"),
                val_step=int(p.get("val_step", -1)),
                val_accuracy=p.get("val_accuracy"),
                commit_from=commit_from,
                commitments=commitments,
                evidence_grant=unit.evidence_grant,
                evidence_full=unit.held is not None and unit.held.pressing(),
            )
            try:
                raw = await self.ctx.host.request(
                    unit.owner,
                    PROGRESS_PROTOCOL,
                    seal(message, self.ctx.identity.signing_key),
                    WORK_LIMITS.max_bytes,
                    timeout=max(5.0, pkg.lease_s / 2),
                )
                ack = decode_progress_ack(raw)
                if not ack.ok:
                    log.info("owner stopped unit %s: %s", pkg.unit_id, ack.reason)
                    unit.scope.cancel()
                    return
                await self._decided(unit, ack)
                if ack.weights_sha256 and unit.takes and not (unit.taken or unit.taking):
                    unit.taking = True
                    nursery.start_soon(self._take, unit, ack)
                if not reached:
                    log.info("unit %s: owner %s answers again", pkg.unit_id, unit.owner)
                reached = True
            except Exception as exc:  # owner unreachable for now (restarting?): keep training
                if reached:
                    log.info("unit %s: heartbeat failed (%s); training goes on", pkg.unit_id, exc)
                reached = False
                # libp2p would refuse to dial it for 60 s: longer than the owner waits
                # after its restart for this heartbeat
                self.ctx.host.allow_redial(unit.owner)
            waiting = unit.waiting and not unit.taken
            with trio.move_on_after(TAKES_HEARTBEAT_S if waiting else interval):
                await unit.committed.wait()
            unit.committed = trio.Event()
            if told == "waiting" or self._phase(unit) != "waiting":  # else: ask now
                await trio.sleep(MIN_HEARTBEAT_S)

    async def _take(self, unit: RunningUnit, ack: ProgressAck) -> None:
        """Fetch the round's weights the owner named, for the runner to take."""
        pkg = unit.package
        folder = self.ctx.unit_dir(pkg.unit_id)
        try:
            unit.taken = await fetch_taken(self.ctx, unit.owner, pkg, unit.spec, ack, folder)
        except Exception as exc:  # the next answer names them again
            log.info("unit %s: the round's weights not fetched (%s)", pkg.unit_id, exc)
        finally:
            unit.taking = False

    async def _decided(self, unit: RunningUnit, ack: ProgressAck) -> None:
        """Keep what the owner will replay until it has it; let the rest go."""
        async with unit.held_lock:
            held = unit.held
            if held is None:
                return
            stored = held.to_store(ack)
            for index in stored:
                path, sha = held.files[index], held.shas[index]
                await trio.to_thread.run_sync(self._store_state, unit, path, sha)
                held.stored.add(index)
            files, released = held.to_drop(ack)
            for path in files:
                path.unlink(missing_ok=True)
            for sha in released:
                unit.evidence.remove(sha)
                self._release_state(sha)
            if stored or released:
                unit.committed.set()  # the new grant goes at once
                pkg, kept = unit.package, held.kept()
                largest = max((self.ctx.blobs.size(sha) for sha in kept), default=0)
                unit.evidence_grant = (
                    issue_grant(
                        self.ctx, pkg.job_id, pkg.unit_id, unit.owner, kept, largest, 24 * 3600
                    )
                    if kept
                    else b""
                )
