"""Offering one job's many units at once (a round's shares, a sweep's trials).

Which peers are candidates (fresh, fit the spec's requirements, not excluded from the
job or by a failed spot check, not waiting out a backoff, not busy with another unit
of it; best first: trusted peers (`node.work.trust.reputation`), then by
`tflops x (1 - load)`), and what a peer's answer means: accepted, the unit runs;
declined for now (busy, unreachable), the unit row is dropped and the peer backs off;
declined for this job, the unit fails and the peer is excluded from the job. Either
way the job's driver is told, so it can offer again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from node.net.peers import fitting, free_tflops
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.offers import offer_if_fit
from node.work.owner.lifecycle import Lifecycle
from node.work.owner.placement import Backoff
from node.work.trust import Reputation
from protocol.crypto import new_job_key
from protocol.rounds import RoundShare


class Fanout:
    def __init__(
        self, ctx: WorkContext, lifecycle: Lifecycle, changed: Callable[[str], None]
    ) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._changed = changed  # the job's driver: a unit of this job moved
        self.backoff = Backoff()
        self._reputation = Reputation(ctx.jobs.db)

    async def candidates(self, job: Job, busy: set[str]) -> list[str]:
        """Peers that fit the job and are not in `busy`, best first (directories are
        asked for more when few are known)."""
        now = time.time()
        excluded = set(job.excluded) | busy | self.backoff.waiting(job.id, now)
        excluded |= self._reputation.excluded(now)
        trusted = self._reputation.trusted()
        requirements = job.spec.get("requirements", {})
        if self.ctx.finder is not None:
            await self.ctx.finder.top_up(requirements, excluded)
        fits = [e.ad for e in fitting(self.ctx.peers.entries(), requirements, excluded)]
        fits.sort(key=lambda ad: (ad.peer_id not in trusted, -free_tflops(ad), ad.peer_id))
        return [ad.peer_id for ad in fits]

    async def offer(
        self,
        job: Job,
        unit: Unit,
        note: str,
        *,
        share: RoundShare | None = None,
        spec: dict[str, Any] | None = None,
    ) -> None:
        """Offer `unit` (with a round's `share`, or a trial's own `spec`) and act on
        the answer."""
        ctx = self.ctx
        key = new_job_key()
        ctx.remember_unit_key(job.id, unit.unit_id, key)
        reply = await offer_if_fit(ctx, job, unit, key, share, spec)
        if reply.accepted:
            self.backoff.succeeded(job.id, unit.worker)
            current = ctx.jobs.unit(unit.unit_id)
            if current is not None and current.state == "offered":
                self._lifecycle.start(current, f"{note} ({ctx.path_to(unit.worker)})")
        elif reply.transient:
            if ctx.jobs.forget_unit(unit.unit_id):
                ctx.forget_unit_key(job.id, unit.unit_id)
            self.backoff.failed(job.id, unit.worker, time.time())
        else:
            self._lifecycle.end(unit.unit_id, "failed", reply.reason)
            fresh = ctx.jobs.get(job.id) or job
            ctx.jobs.transition(
                job.id,
                (fresh.state,),
                f"{unit.worker} declined: {reply.reason}",
                excluded=sorted({*fresh.excluded, unit.worker}),
            )
        self._changed(job.id)
