"""Placement: which worker gets a job's next unit, and what a decline means.

A job that wants a unit (mode `single`: queued and no live unit) gets one peer chosen
by the scheduler; the offer goes out; the answer decides:
- accepted: the unit runs (`Lifecycle.start`);
- declined for this job (policy, requirements): the peer is excluded from the job;
- declined for now (busy, unreachable): the unit row is dropped again, so retries
  leave no trail of dead units, and that peer waits out an exponential backoff
  before this job asks it again, so placement never spins on one peer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job
from node.work.offers import send_offer
from node.work.owner.leases import unit_deadline
from node.work.owner.lifecycle import Lifecycle, replicas_of
from node.work.owner.worker_choice import SELF, choose_worker
from node.work.trust import Reputation
from protocol.crypto import new_job_key

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
REPLICA_RETRY_S = 1.0


class Backoff:
    """Per (job, peer): when that peer may be asked about that job again."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str], tuple[float, float]] = {}

    def waiting(self, job_id: str, now: float) -> set[str]:
        return {p for (j, p), (until, _) in self._until.items() if j == job_id and until > now}

    def failed(self, job_id: str, peer: str, now: float) -> float:
        _, last = self._until.get((job_id, peer), (0.0, 0.0))
        delay = min(BACKOFF_MAX_S, last * 2 if last else BACKOFF_FIRST_S)
        self._until[(job_id, peer)] = (now + delay, delay)
        return delay

    def succeeded(self, job_id: str, peer: str) -> None:
        self._until.pop((job_id, peer), None)

    def drop_job(self, job_id: str) -> None:
        for key in [k for k in self._until if k[0] == job_id]:
            del self._until[key]


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
    def __init__(
        self,
        ctx: WorkContext,
        lifecycle: Lifecycle,
        train_here: Callable[[Job, str], Awaitable[None]],
        reputation: Reputation,
    ) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._train_here = train_here
        self._reputation = reputation
        self.backoff = Backoff()

    async def place(self, job_id: str) -> None:
        """Offer `job_id`'s next unit until a peer takes it or none is left to ask."""
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
            )
            if choice.worker is None or (choice.worker == SELF and job.state == "running"):
                if job.state == "running":  # the next replica: wait for a peer that fits
                    await trio.sleep(REPLICA_RETRY_S)
                    continue
                if job.reason != choice.reason:
                    ctx.jobs.transition(job.id, ("queued",), reason=choice.reason)
                return
            if choice.worker == SELF:
                await self._train_here(job, choice.reason)
                return
            if ctx.finder is not None and not await ctx.finder.still_fits(
                choice.worker, requirements
            ):  # late binding: it left, or is busy or paused now
                self.backoff.failed(job.id, choice.worker, time.time())
                continue
            if await self._offer(job, choice.worker) and replicas_of(job) == 1:
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

    async def _offer(self, job: Job, peer: str) -> bool:
        """True when the unit is placed; False to choose another peer."""
        ctx = self.ctx
        now = time.time()
        unit = ctx.jobs.add_unit(
            job.id, peer, ctx.lease_s * 3, deadline=unit_deadline(ctx, job, now)
        )
        key = new_job_key()
        ctx.remember_unit_key(job.id, unit.unit_id, key)
        reply = await send_offer(ctx, job, unit, key)
        if reply.accepted:
            self.backoff.succeeded(job.id, peer)
            log.info("job %s: unit %s accepted by %s", job.id, unit.unit_id, peer)
            current = ctx.jobs.unit(unit.unit_id)
            if current is not None and current.state == "offered":
                self._lifecycle.start(current, f"accepted by {peer} ({ctx.path_to(peer)})")
            return True  # (or its result already arrived and was handled)
        log.info("job %s: %s declined: %s", job.id, peer, reply.reason)
        if reply.transient:
            if ctx.jobs.forget_unit(unit.unit_id):
                ctx.forget_unit_key(job.id, unit.unit_id)
            delay = self.backoff.failed(job.id, peer, time.time())
            ctx.jobs.transition(
                job.id, ("queued",), reason=f"{peer}: {reply.reason}; asking again in {delay:g} s"
            )
            return False
        self._lifecycle.end(unit.unit_id, "failed", reply.reason)
        fresh = ctx.jobs.get(job.id) or job
        ctx.jobs.transition(
            job.id,
            ("queued",),
            f"{peer} declined: {reply.reason}",
            excluded=sorted({*fresh.excluded, peer}),
        )
        return False
