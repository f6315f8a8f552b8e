"""Placement: which workers get a job's units, and what an answer to an offer means.

The one offer path of the owner. A `single` job that wants a unit (queued, no live
unit) gets the one peer `worker_choice.choose_worker` picks (`place`); a job of many
units (a round's shares, a sweep's trials) asks for `candidates` and offers each unit
itself. Candidates are fresh, fit the spec's requirements, are not excluded from the
job or by a failed spot check (`node.work.trust.reputation`), not waiting out a
backoff, not busy with another unit of it; best first: trusted peers, then by
`tflops x (1 - load)`, where the load of a peer that ended a unit of the job and
trains none of it now is left out (`done_here`: its ad may still count that unit).
A worker whose ad is not fresh is probed before its offer (late binding). The answer
decides (`offer`):
- accepted: the unit runs (`Lifecycle.start`);
- declined for this job (policy, requirements): the unit fails and the peer is
  excluded from the job;
- declined for now (busy, unreachable): the unit row is dropped again, so retries
  leave no trail of dead units, and that peer waits out an exponential backoff
  before this job asks it again, so placement never spins on one peer; and a
  shorter one before any job does (`Backoff`).
Offers to one peer go one at a time, whichever jobs make them (`Backoff.turn`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from node.net.peers import fitting, free_tflops
from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job, Unit
from node.work.offers import offer_if_fit
from node.work.owner.leases import unit_deadline
from node.work.owner.lifecycle import Lifecycle, replicas_of
from node.work.owner.worker_choice import SELF, choose_worker
from node.work.trust import Reputation, resume_point
from protocol.crypto import new_job_key
from protocol.rounds import RoundShare
from protocol.work import OfferReply

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
PEER_BACKOFF_MAX_S = 15.0
REPLICA_RETRY_S = 1.0
WAITS_ITS_TURN = "declined another job's offer just now; asked again soon"


class Backoff:
    """When a peer may be asked again after it declined for now: by the same job, after
    a delay that doubles up to `BACKOFF_MAX_S`; by any job, after one that doubles up
    to `PEER_BACKOFF_MAX_S`, since what it said (busy, paused, out of disk or quota,
    unreachable) holds for every job. Without the second, an owner with fifty queued
    jobs offered a busy volunteer fifty units a second, and those streams crowded out
    its units' heartbeats until their leases lapsed. A unit of ours on that peer
    ending (`freed`) ends its wait for all jobs: it has room again.

    Offers to one peer wait their `turn`, so a queue of jobs that all chose the best
    peer asks it one after another, and once it declines, the rest do not ask."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str], tuple[float, float]] = {}
        self._peer_until: dict[str, tuple[float, float]] = {}
        self._turns: dict[str, trio.Lock] = {}

    def waiting(self, job_id: str, now: float) -> set[str]:
        mine = {p for (j, p), (until, _) in self._until.items() if j == job_id and until > now}
        return mine | self.busy(now)

    def busy(self, now: float) -> set[str]:
        """Peers no job asks now: each waits out a decline for now."""
        return {p for p, (until, _) in self._peer_until.items() if until > now}

    def failed(self, job_id: str, peer: str, now: float) -> float:
        delay = _doubled(self._until, (job_id, peer), now, BACKOFF_MAX_S)
        _doubled(self._peer_until, peer, now, PEER_BACKOFF_MAX_S)
        return delay

    def delay(self, job_id: str, peer: str) -> float:
        """The backoff `peer` waits out now before `job_id` asks it again."""
        return self._until.get((job_id, peer), (0.0, 0.0))[1]

    def succeeded(self, job_id: str, peer: str) -> None:
        self._until.pop((job_id, peer), None)
        self.freed(peer)

    def freed(self, peer: str) -> None:
        self._peer_until.pop(peer, None)

    @asynccontextmanager
    async def turn(self, peer: str) -> AsyncIterator[None]:
        """Held while one offer to `peer` is made."""
        lock = self._turns.setdefault(peer, trio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._turns.pop(peer, None)

    def drop_job(self, job_id: str) -> None:
        for key in [k for k in self._until if k[0] == job_id]:
            del self._until[key]


def _doubled(table: dict[Any, tuple[float, float]], key: Any, now: float, cap: float) -> float:
    """`key`'s next delay (the first, or its last one doubled, at most `cap`), noted as
    running from `now`."""
    _, last = table.get(key, (0.0, 0.0))
    delay = min(cap, last * 2 if last else BACKOFF_FIRST_S)
    table[key] = (now + delay, delay)
    return delay


def wants_unit(ctx: WorkContext, job: Job) -> bool:
    """A queued job with no live unit; a job with replicas also while it runs with
    fewer live units than replicas and none done yet."""
    live = ctx.jobs.units_of(job.id, *LIVE_UNIT_STATES)
    if job.state == "queued":
        return len(live) < replicas_of(job)
    return (
        job.state == "running"
        and 0 < len(live) < replicas_of(job)
        and not ctx.jobs.units_of(job.id, "done")
    )


class Placement:
    def __init__(self, ctx: WorkContext, lifecycle: Lifecycle, reputation: Reputation) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._reputation = reputation
        self.backoff = Backoff()

    async def place(self, job_id: str, train_here: Callable[[Job, str], Awaitable[None]]) -> None:
        """Offer `job_id`'s next unit until a peer takes it or none is left to ask;
        `train_here` when the choice is this node."""
        ctx = self.ctx
        while True:
            job = ctx.jobs.get(job_id)
            if job is None or not wants_unit(ctx, job):
                if job is None or job.state != "queued":
                    self.backoff.drop_job(job_id)
                # a replica may be lost and wanted again until the job settles
                if (
                    job is not None
                    and job.state == "running"
                    and replicas_of(job) > 1
                    and not ctx.jobs.units_of(job.id, "done")
                ):
                    await trio.sleep(REPLICA_RETRY_S)
                    continue
                return
            used = ctx.transfer_cap_used()
            if used and job.placement != "local":  # its workers would fetch from us
                if job.reason != f"waits: {used}":
                    ctx.jobs.amend(job.id, ("queued",), reason=f"waits: {used}")
                return
            now = time.time()
            excluded = set(job.excluded) | self.backoff.waiting(job_id, now)
            excluded |= self._reputation.excluded(now)
            excluded |= self._replica_misfits(job)
            if not ctx.has_room():
                excluded.add(SELF)
            requirements = job.spec.get("requirements", {})
            if ctx.finder is not None and job.placement != "local":
                await ctx.finder.top_up(requirements, excluded)
            choice = choose_worker(
                requirements,
                job.placement,
                ctx.peers.entries(),
                ctx.own_ad(),
                excluded,
                self._reputation.trusted(),
                busy=self.backoff.busy(now),
            )
            if choice.worker is None or (choice.worker == SELF and job.state == "running"):
                if job.state == "running":  # the next replica: wait for a peer that fits
                    await trio.sleep(REPLICA_RETRY_S)
                    continue
                if job.reason != choice.reason:
                    ctx.jobs.amend(job.id, ("queued",), reason=choice.reason)
                return
            if choice.worker == SELF:
                await train_here(job, choice.reason)
                return
            if await self._offer_single(job, choice.worker) and replicas_of(job) == 1:
                return

    def _replica_misfits(self, job: Job) -> set[str]:
        """Peers that may not take the job's next replica: those holding one, and, once
        one is placed, those of another determinism class (replicas compare bitwise)."""
        if replicas_of(job) <= 1:
            return set()
        holders = {u.worker for u in self.ctx.jobs.units_of(job.id, *LIVE_UNIT_STATES)}
        if not holders:
            return set()
        classes = {e.ad.peer_id: e.ad.determinism for e in self.ctx.peers.entries()}
        wanted = {classes.get(peer, "") for peer in holders}
        return holders | {peer for peer, cls in classes.items() if cls not in wanted}

    async def _offer_single(self, job: Job, peer: str) -> bool:
        """True when the unit is placed; False to choose another peer."""
        ctx = self.ctx
        point = resume_point(ctx.jobs.db, job.id) if replicas_of(job) == 1 else None
        if point is not None and not ctx.blobs.has(point.sha256):
            point = None
        unit = ctx.jobs.add_unit(
            job.id,
            peer,
            ctx.limits.lease_s * 3,
            deadline=unit_deadline(ctx, job, time.time()),
            resume=(point.sha256, point.step) if point is not None else ("", 0),
        )
        note = f"accepted by {peer}"
        if point is not None:
            note += f", going on from step {point.step} (a state of unit {point.unit_id})"
        reply = await self.offer(job, unit, note)
        if reply.reason == WAITS_ITS_TURN:
            ctx.jobs.amend(job.id, ("queued",), reason=f"{peer}: {reply.reason}")
        elif reply.transient:
            delay = self.backoff.delay(job.id, peer)
            ctx.jobs.amend(
                job.id, ("queued",), reason=f"{peer}: {reply.reason}; asking again in {delay:g} s"
            )
        return reply.accepted  # (or its result already arrived and was handled)

    async def candidates(self, job: Job, busy: set[str]) -> list[str]:
        """Peers that fit the job and are not in `busy`, best first (directories are
        asked for more when few are known). The load in the ad of a peer that trained
        a unit of the job and trains none now is not held against it (`done_here`)."""
        now = time.time()
        excluded = set(job.excluded) | busy | self.backoff.waiting(job.id, now)
        excluded |= self._reputation.excluded(now)
        trusted = self._reputation.trusted()
        requirements = job.spec.get("requirements", {})
        if self.ctx.finder is not None:
            await self.ctx.finder.top_up(requirements, excluded)
        entries = self.ctx.peers.entries()
        fits = [e.ad for e in fitting(entries, requirements, excluded, self.done_here(job))]
        # ties in random order: a peer id sorting first can be ground, a draw cannot
        fits.sort(key=lambda ad: (ad.peer_id not in trusted, -free_tflops(ad), random.random()))
        return [ad.peer_id for ad in fits]

    def done_here(self, job: Job, offering: str = "") -> set[str]:
        """Peers that trained a unit of `job` and train none now (but the unit being
        `offering`): the load in their ads may be that unit's. A node whose units
        follow each other advertises itself busy throughout (load-only ads wait a
        second, `node.net.discovery.gossip`), so without this the slot an elastic
        worker just delivered would not go back to it; it declines if it is full."""
        return self.ctx.jobs.workers_done(job.id, but=offering)

    async def offer(
        self,
        job: Job,
        unit: Unit,
        note: str,
        *,
        share: RoundShare | None = None,
        spec: dict[str, Any] | None = None,
    ) -> OfferReply:
        """Offer `unit` (with a round's `share`, or a trial's own `spec`) to its worker
        and act on the answer; the unit's mode hears of any end (`Lifecycle.end`)."""
        ctx = self.ctx
        peer = unit.worker
        count_load = peer not in self.done_here(job, offering=unit.unit_id)
        key = new_job_key()
        ctx.remember_unit_key(job.id, unit.unit_id, key)
        async with self.backoff.turn(peer):
            if peer in self.backoff.busy(time.time()):  # it declined another job meanwhile
                if ctx.jobs.forget_unit(unit.unit_id):
                    ctx.forget_unit_key(job.id, unit.unit_id)
                return OfferReply(job.id, unit.unit_id, False, WAITS_ITS_TURN, True)
            reply = await offer_if_fit(ctx, job, unit, key, share, spec, count_load)
        if reply.accepted:
            self.backoff.succeeded(job.id, peer)
            log.info("job %s: unit %s accepted by %s", job.id, unit.unit_id, peer)
            current = ctx.jobs.unit(unit.unit_id)
            if current is not None and current.state == "offered":
                self._lifecycle.start(current, f"{note} ({ctx.path_to(peer)})")
            return reply
        log.info("job %s: %s declined: %s", job.id, peer, reply.reason)
        if reply.transient:
            if ctx.jobs.forget_unit(unit.unit_id):
                ctx.forget_unit_key(job.id, unit.unit_id)
            self.backoff.failed(job.id, peer, time.time())
        else:
            self._lifecycle.end(unit.unit_id, "failed", reply.reason)
            fresh = ctx.jobs.get(job.id) or job
            ctx.jobs.amend(
                job.id,
                (fresh.state,),
                f"{peer} declined: {reply.reason}",
                excluded=sorted({*fresh.excluded, peer}),
            )
        return reply
