"""A running unit's heartbeats, the worker's end of the progress exchange (the owner's
is `node.work.owner.leases`): progress out every second and soon after each new
checkpoint (its commitment); the answer in, which renews the lease or says stop,
decides which committed states stay for the owner and which may go
(`HeldEvidence`), and names the round's weights an eager elastic share takes on its
way (`node.work.taken_weights`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.work.blobs import BlobStore, issue_grant
from node.work.context import WorkContext
from node.work.taken_weights import fetch_taken
from node.work.trust import HeldStates
from protocol import seal
from protocol.blobs import BlobGrant
from protocol.names import PROGRESS_PROTOCOL
from protocol.work import WORK_LIMITS, Progress, ProgressAck, WorkPackage, decode_progress_ack

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
MIN_HEARTBEAT_S = 0.1  # heartbeats come at most this often, checkpoints or not
TAKES_HEARTBEAT_S = 0.2  # ... and this often while a runner waits for its round's weights


@dataclass
class RunningUnit:
    """A unit training on this node (`node.work.worker`), as its heartbeats see it."""

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


class HeldEvidence:
    """Committed states in the blob store, by the units holding them: units of one
    spec share states, so a file goes when the last unit holding it is settled."""

    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs
        self._held = Counter[str]()

    def drop(self, unit: RunningUnit) -> None:
        """The unit is settled (the owner answered, or gave up): its checkpoints go,
        except those another unit here still holds (equal initial states)."""
        for sha in unit.evidence:
            self.release(sha)
        unit.evidence = []

    def store(self, unit: RunningUnit, path: Path, sha: str) -> None:
        """A committed state into the blob store (its file's second name), held for
        `unit`; the owner fetches it from there."""
        self._blobs.link_file(path, sha)
        unit.evidence.append(sha)
        self._held[sha] += 1

    def release(self, sha: str) -> None:
        self._held[sha] -= 1
        if self._held[sha] <= 0:
            del self._held[sha]
            self._blobs.remove(sha)


class Heartbeats:
    def __init__(self, ctx: WorkContext, evidence: HeldEvidence) -> None:
        self.ctx = ctx
        self._evidence = evidence

    def phase(self, unit: RunningUnit) -> str:
        """What the owner is told: a training unit is "paused" while the volunteer's
        preferences hold its runner stopped, and "waiting" while its runner waits for
        its round's weights (the owner answers once they exist)."""
        if unit.phase != "training":
            return unit.phase
        if self.ctx.paused_because():
            return "paused"
        return "waiting" if unit.waiting and not unit.taken else "training"

    async def run(self, unit: RunningUnit, nursery: trio.Nursery) -> None:
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
            told = self.phase(unit)
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
            if told == "waiting" or self.phase(unit) != "waiting":  # else: ask now
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
                await trio.to_thread.run_sync(self._evidence.store, unit, path, sha)
                held.stored.add(index)
            files, released = held.to_drop(ack)
            for path in files:
                path.unlink(missing_ok=True)
            for sha in released:
                unit.evidence.remove(sha)
                self._evidence.release(sha)
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
