"""The owner's elastic (DiLoCo) rounds: offer shares, gather deltas, take the outer step.

One task per elastic job drives its rounds (`drive`). A round:
1. starts from the global weights (and outer momentum) of the round before, kept as
   blobs and named in node.db (`round_store.py`);
2. offers one unit per data slot, up to `elastic.workers`, to the best peers that fit;
   a peer that held slot s last round is offered slot s again (it kept its inner
   optimizer state for it), newcomers take the free slots. A slot whose unit is lost
   mid-round (the worker vanished, declined, or sent a bad delta) is offered to
   another peer while the round has time: the slot's data does not depend on the peer;
3. closes when every slot's delta is in, or at the deadline with at least
   `min_workers` deltas; with fewer, the deadline is extended and the timeline says
   why. Units still training at the close are dropped (their late deltas are refused
   and counted);
4. applies the deltas in slot order with the fused outer step in a runner subprocess
   on this node (the daemon never parses the deltas' tensors) and opens the next
   round. The close is a compare-and-set, so no round is applied twice. The new
   weights are evaluated on the validation split by a runner of their own while the
   next round trains (`_validations`, one round after another); the job completes
   once the last round's figures are in.

Rounds overlap (`elastic.overlap` above 0): the moment a slot's delta is fetched
(`delta_fetched`), the slot's share of the next round is offered (`_offer_ahead`),
starting eagerly from this round's weights and that delta (`training.elastic.starts`),
so no worker waits for the checks or the outer step. A slot of a round whose delta of
the round before came in starts that way whenever it is offered. Such a share takes
the next round's weights on its way (`weights_to_take`, answering its heartbeats):
the outer step taken early, once every slot's delta is in and before their checks
end (`early_weights.py`), which the close reuses when its deltas are the same;
docs/design/elastic.md.

The deadline: `elastic.round_timeout_s`, or adaptive when 0: three times the
slowest applied share of the last closed round (at least 60 s; 600 s before any round
has closed), so a fast job does not wait minutes for a vanished worker and a slow one
is not cut short.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import Any

import trio

from node.work.jobs import LIVE_UNIT_STATES, Job, Round, RoundStore, Unit
from node.work.owner.leases import unit_deadline
from node.work.owner.lifecycle import round_closed_reason
from node.work.owner.modes.early_weights import EarlyWeights
from node.work.owner.modes.mode import ManyUnits, OwnerParts
from node.work.owner.modes.round_tasks import RoundTasks
from protocol.rounds import RoundShare
from training.spec.job import elastic_of_plain

log = logging.getLogger(__name__)

FIRST_ROUND_TIMEOUT_S = 600.0
MIN_ADAPTIVE_TIMEOUT_S = 60.0
ADAPTIVE_FACTOR = 3.0
WAIT_S = 0.5


class ElasticRounds(ManyUnits):
    name = "elastic"
    units_are = "rounds"

    def __init__(self, parts: OwnerParts) -> None:
        super().__init__(parts)
        self.store = RoundStore(self.ctx.jobs.db)
        self.tasks = RoundTasks(self.ctx, parts.runner_request)  # runner tasks on this node
        # bytes fetched for eager shares before their round opened: (job, round) -> bytes
        self._ahead_bytes: dict[tuple[str, int], int] = {}
        self.early = EarlyWeights(self.ctx, self.store, self.tasks)  # steps before a close

    # -- the engine's hooks (`JobMode`) -------------------------------------------------

    def where(self, unit: Unit) -> str:
        return f"round {unit.round}"

    def delta_round(self, unit: Unit) -> int | None:
        return unit.round

    def served(self, unit: Unit, sha: str, size: int) -> str | None:
        if self.store.get(unit.job_id, unit.round) is None:  # an eager share, ahead
            key = (unit.job_id, unit.round)
            self._ahead_bytes[key] = self._ahead_bytes.get(key, 0) + size
        else:
            self.store.sent(unit.job_id, unit.round, size)  # the round's bytes down
        if sha == unit.start_delta:
            return f"round {unit.round - 1}'s delta of slot {unit.slot} (an eager start)"
        told = self.early.told(unit.unit_id)  # the weights it takes on its way
        if sha and sha == told.get("update_sha256"):
            return f"round {unit.round}'s weights update"
        if sha and sha == told.get("weights_sha256"):
            return f"round {unit.round}'s weights"
        weights_round = unit.round - 1 if unit.start_delta else unit.round
        before = self.store.get(unit.job_id, weights_round - 1) if weights_round else None
        if before is not None and sha == before.next_update_sha256:
            return f"round {weights_round}'s weights update"
        return f"round {weights_round}'s weights"

    async def weights_to_take(self, job: Job, unit: Unit, hold_s: float = 0.0) -> dict[str, Any]:
        return await self.early.weights_to_take(job, unit, hold_s)

    def delta_fetched(self, unit: Unit, sha: str, size: int) -> None:
        """The slot's next share may start from this delta while it is checked
        (`_offer_ahead`); should the check fail, that share ends with it (`unit_lost`)."""
        if self.ctx.jobs.unit_output(unit.unit_id, sha, size):
            self.unit_changed(unit.job_id)

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None:
        """A share that failed its check also ends its worker's later shares of the
        job: an eager one started from the delta that failed."""
        self.early.forget(unit.unit_id)
        super().unit_lost(unit, reason, state, at_fault)
        if state != "failed" or not at_fault:
            return
        for later in self.ctx.jobs.units_of(unit.job_id, *LIVE_UNIT_STATES):
            if later.worker == unit.worker and later.round > unit.round:
                why = f"its worker's share of round {unit.round} failed: {reason}"
                self._lifecycle.end(later.unit_id, "failed", why[:500])

    def accept(self, job: Job, unit: Unit, peer: str, checked: Any) -> str:
        """A round's delta, checked: its unit is done; the round applies the delta
        when it closes."""
        result = checked.result
        self.early.forget(unit.unit_id)
        how = "checked" if checked.status == "verified" else "taken unchecked"
        if not self._lifecycle.share_done(
            unit.unit_id,
            result.weights_sha256,
            self.ctx.blobs.size(result.weights_sha256),  # as fetched, not as claimed
            f"round {unit.round}: delta from {peer}{checked.via} {how}; receipt issued",
        ):
            return "the round closed while it was checked"
        return ""

    def describe(self, job: Job) -> dict[str, Any]:
        return {"rounds": [r.to_json() for r in self.store.of_job(job.id)]}

    # -- the job -----------------------------------------------------------------------

    async def drive(self, job_id: str) -> None:
        """Run `job_id`'s rounds from where node.db says they stand until the last one."""
        ctx = self.ctx
        job = ctx.jobs.transition(job_id, ("queued",), "elastic rounds", state="running")
        if job is None:
            return
        current = self.store.latest(job_id)
        if current is None:
            weights = await self.tasks.init_weights(job)
            current = self.store.open(job_id, 0, weights, "", self._deadline(job))
            if current is None:
                raise RuntimeError("round 0 was opened twice")
        elif current.state == "open":
            self.store.update(job_id, current.round, "open", deadline=self._deadline(job))
            self.store.note(job_id, current.round, "the owner restarted; the round goes on")
        closed, to_validate = trio.open_memory_channel[Round](math.inf)
        for earlier in self.store.of_job(job_id):  # closed before a restart, not evaluated
            if earlier.state == "closed" and earlier.val_loss is None and not earlier.metrics:
                closed.send_nowait(earlier)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._validations, job_id, to_validate)
                with closed:
                    current = await self._rounds(job_id, current, closed, nursery)
        finally:
            self.early.drop_job(job_id)
        job = ctx.jobs.get(job_id)
        if current is not None and job is not None and job.state == "running":
            self._complete(job, self.store.get(job_id, current.round) or current)

    async def _rounds(
        self,
        job_id: str,
        current: Round,
        closed: trio.MemorySendChannel[Round],
        ahead: trio.Nursery,
    ) -> Round | None:
        """Run the rounds from `current` to the last; the last, closed (None if the job
        stopped). Each round closed is sent to `closed`, to be evaluated; the next
        round's eager shares are offered in `ahead`, which outlives the round."""
        while True:
            job = self.ctx.jobs.get(job_id)
            if job is None or job.state != "running":
                return None
            if current.state == "open":
                ended = await self._run_round(job, current, ahead)
                if ended is None:
                    return None
                await closed.send(ended)
                current = ended
                continue
            if current.round + 1 >= int(job.spec["elastic"]["rounds"]):
                return current
            current = self.store.open(
                job_id,
                current.round + 1,
                current.next_weights_sha256,
                current.next_momentum_sha256,
                self._deadline(job),
            ) or self.store.get(job_id, current.round + 1)
            assert current is not None
            early = self._ahead_bytes.pop((job_id, current.round), 0)
            if early:
                self.store.sent(job_id, current.round, early)

    async def _validations(self, job_id: str, rounds: trio.MemoryReceiveChannel[Round]) -> None:
        """Evaluate each closed round's new weights, in order, off the rounds' path."""
        async with rounds:
            async for closed in rounds:
                job = self.ctx.jobs.get(job_id)
                if job is None or job.state != "running":
                    continue  # stopped: the rest is not worth evaluating
                metrics = await self.tasks.validate(job, closed)
                evaluated = self.store.update(
                    job_id,
                    closed.round,
                    "closed",
                    val_loss=metrics.get("val_loss"),
                    metrics=metrics,
                    evaluated_at=time.time(),
                )
                log.info(
                    "job %s: round %d closed with %d deltas, val_loss %s",
                    job_id,
                    closed.round,
                    len(closed.workers),
                    metrics.get("val_loss"),
                )
                self._record(job, evaluated or closed)

    def _complete(self, job: Job, last: Round) -> None:
        self._placement.backoff.drop_job(job.id)
        self.ctx.jobs.transition(
            job.id,
            ("running",),
            f"{last.round + 1} rounds done",
            state="completed",
            weights_sha256=last.next_weights_sha256,
            metrics=dict(last.metrics),
            metrics_status="local",  # this node evaluated the weights after its outer step
            reason="",
        )

    def _deadline(self, job: Job) -> float:
        fixed = float(job.spec["elastic"].get("round_timeout_s", 0.0))
        if fixed:
            return time.time() + fixed
        closed = [r for r in self.store.of_job(job.id) if r.state == "closed"]
        if not closed:
            return time.time() + FIRST_ROUND_TIMEOUT_S
        # only applied shares: one dropped at the close ran until that deadline, and
        # counting it would triple the deadline after every round with a straggler
        done = self._units(job.id, closed[-1].round, "done")
        if not done:
            return time.time() + FIRST_ROUND_TIMEOUT_S
        slowest = max(u.ended_at - u.started_at for u in done)
        return time.time() + max(MIN_ADAPTIVE_TIMEOUT_S, ADAPTIVE_FACTOR * slowest)

    def _units(self, job_id: str, round_: int, *states: str) -> list[Unit]:
        return [u for u in self.ctx.jobs.units_of(job_id, *states) if u.round == round_]

    # -- one round ---------------------------------------------------------------------

    async def _run_round(self, job: Job, current: Round, ahead: trio.Nursery) -> Round | None:
        """Fill the round's slots and wait for its deltas; close it and return it.
        Meanwhile each slot whose delta is in starts the next round (`_offer_ahead`)."""
        ctx = self.ctx
        elastic = job.spec["elastic"]
        workers, min_workers = int(elastic["workers"]), int(elastic["min_workers"])
        self._changed[job.id] = trio.Event()
        try:
            async with trio.open_nursery() as offers:
                while True:
                    job = ctx.jobs.get(job.id) or job
                    if job.state != "running":
                        offers.cancel_scope.cancel()
                        return None
                    done = self._units(job.id, current.round, "done")
                    live = self._units(job.id, current.round, *LIVE_UNIT_STATES)
                    early = self._units(job.id, current.round + 1, *LIVE_UNIT_STATES)
                    # one share at a time; a worker whose delta is being checked is free
                    busy = {u.worker for u in live + early if u.state != "verifying"}
                    await self._offer_ahead(ahead, job, current, busy)
                    self.early.maybe_start(ahead, job, current, done, live)
                    now = time.time()
                    if len(done) >= workers:
                        break
                    if now > current.deadline:
                        if len(done) >= min_workers:
                            break
                        current = self._extend(job, current, len(done), min_workers)
                    taken = {u.slot for u in done + live}
                    free = [s for s in range(workers) if s not in taken]
                    offered = 0
                    if free:
                        offered = await self._offer_slots(offers, job, current.round, free, busy)
                    if not offered and not live and len(done) >= min_workers:
                        break  # nothing in flight and nobody left to ask
                    with trio.move_on_after(WAIT_S):
                        await self._changed[job.id].wait()
                    self._changed[job.id] = trio.Event()
                offers.cancel_scope.cancel()
        finally:
            self._changed.pop(job.id, None)
        return await self._close(job, current)

    def _extend(self, job: Job, current: Round, have: int, need: int) -> Round:
        deadline = self._deadline(job)
        note = (
            f"round {current.round}: {have} of min_workers {need} deltas at its deadline; "
            f"extended by {deadline - time.time():.0f} s"
        )
        self.ctx.jobs.note(job.id, note)
        self.store.note(job.id, current.round, note)
        return self.store.update(job.id, current.round, "open", deadline=deadline) or current

    async def _offer_ahead(
        self, nursery: trio.Nursery, job: Job, current: Round, busy: set[str]
    ) -> None:
        """Offer the next round's share of each slot whose delta of this round is in
        (fetched; checked or still being checked): an eager start
        (`training.elastic.starts`), so its worker trains on while this round's other
        deltas, their checks and its outer step are still to come."""
        following = current.round + 1
        if not _eager(job) or following >= int(job.spec["elastic"]["rounds"]):
            return
        started = {u.slot for u in self._units(job.id, following, "done", *LIVE_UNIT_STATES)}
        waiting = [slot for slot in self._delivered(job.id, current.round) if slot not in started]
        if waiting:
            await self._offer_slots(nursery, job, following, waiting, busy)

    def _delivered(self, job_id: str, round_: int) -> dict[int, str]:
        """Slot -> its delta of `round_`: applied or to be (done), or fetched and being
        checked (an eager share may start from it meanwhile)."""
        units = self._units(job_id, round_, "done", "verifying")
        return {u.slot: u.output_sha256 for u in units if u.output_sha256}

    async def _offer_slots(
        self, nursery: trio.Nursery, job: Job, round_: int, slots: list[int], busy: set[str]
    ) -> int:
        """Start an offer of each of `slots` of `round_` that has a peer to ask; how many
        started (each peer asked joins `busy`). A slot whose delta of the round before
        came in starts eagerly from it; others from the round's own weights."""
        delivered = self._delivered(job.id, round_ - 1) if _eager(job) else {}
        previous = {  # who held each slot: its kept inner optimizer state is there
            u.slot: u.worker
            for u in self._units(job.id, round_ - 1, "done", "expired", "verifying")
        }
        candidates = await self._placement.candidates(job, busy)
        offered = 0
        for slot in slots:
            if not candidates:
                break
            peer = previous.get(slot) if previous.get(slot) in candidates else None
            peer = peer or next(
                (p for p in candidates if p not in previous.values()), candidates[0]
            )
            candidates.remove(peer)
            busy.add(peer)
            start_delta = delivered.get(slot, "")
            unit = self.ctx.jobs.add_unit(
                job.id,
                peer,
                self.ctx.limits.lease_s * 3,
                deadline=unit_deadline(self.ctx, job, time.time()),
                round_=round_,
                slot=slot,
                start_delta=start_delta,
            )
            share = self._share(job.id, round_, slot, start_delta)
            note = f"round {share.round} slot {share.slot}" + (" (eager)" if start_delta else "")
            nursery.start_soon(partial(self._offer_unit, job, unit, note, share=share))
            offered += 1
        return offered

    def _share(self, job_id: str, round_: int, slot: int, start_delta: str) -> RoundShare:
        """Slot `slot`'s share of `round_`, from the round's weights or eagerly from the
        round before's and `start_delta`; the weights come as an update to those before
        them when the outer step wrote one (a worker that holds them fetches that)."""
        weights_round = round_ - 1 if start_delta else round_
        row = self.store.get(job_id, weights_round)
        assert row is not None  # the round open, or the one before it
        before = self.store.get(job_id, weights_round - 1) if weights_round else None
        way_down = (
            (before.weights_sha256, before.next_update_sha256)
            if before is not None
            and before.next_update_sha256
            and before.next_weights_sha256 == row.weights_sha256
            else ("", "")
        )
        return RoundShare(round_, slot, row.weights_sha256, *way_down, start_delta)

    async def _close(self, job: Job, current: Round) -> Round | None:
        """Drop what is still in flight, apply the deltas, record the round."""
        late = self._units(job.id, current.round, *LIVE_UNIT_STATES)
        for unit in late:
            self._lifecycle.end(unit.unit_id, "expired", round_closed_reason(current.round))
        done = sorted(self._units(job.id, current.round, "done"), key=lambda u: u.slot)
        lost = self._units(job.id, current.round, "expired", "failed")
        before = {u.worker for u in self._units(job.id, current.round - 1, "done")}
        workers = [u.worker for u in done]
        began = time.monotonic()
        bases = [self.store.delta_base(job.id, u.round, u.start_delta, u.taken) for u in done]
        deltas = tuple(u.output_sha256 for u in done)
        stepped = await self.early.at_close(job, current, deltas, tuple(bases))
        if stepped is None:
            stepped = await self.tasks.outer_step(job, current, done, bases)
        weights, momentum, update = stepped
        self.early.closed(job.id, current.round)
        numel_bytes = 4 * await self.tasks.delta_numel(job)
        closed = self.store.update(
            job.id,
            current.round,
            "open",
            state="closed",
            closed_at=time.time(),
            next_weights_sha256=weights,
            next_momentum_sha256=momentum,
            next_update_sha256=update,
            workers=workers,
            dropped=sorted({u.worker for u in lost} - set(workers)),
            joined=sorted(set(workers) - before) if current.round else [],
            left=sorted(before - set(workers)),
            bytes_in=sum(u.output_bytes for u in done),
            full_bytes=numel_bytes * len(done),
            seconds=time.time() - current.opened_at,
        )
        if closed is not None:  # else closed by someone else meanwhile: never applied twice
            log.info("job %s: outer step of round %d in %.1f s", job.id, current.round,
                     time.monotonic() - began)  # fmt: skip
        return closed

    def _record(self, job: Job, closed: Round) -> None:
        rounds = int(job.spec["elastic"]["rounds"])
        inner = int(job.spec["elastic"]["inner_steps"])
        history = list(job.progress.get("history", []))
        step = (closed.round + 1) * inner
        history.append([step, None, closed.val_loss])  # the outer step has no training loss
        self.ctx.jobs.set_progress(
            job.id,
            note=f"round {closed.round}: {len(closed.workers)} deltas applied"
            + (f"; dropped {', '.join(p[-6:] for p in closed.dropped)}" if closed.dropped else ""),
            progress={
                "phase": "training",
                "step": step,
                "total_steps": rounds * inner,
                "fraction": round(step / (rounds * inner), 4),
                "loss": closed.val_loss,
                "round": closed.round,
                "rounds": rounds,
                "updated_at": time.time(),
                "history": history[-500:],
            },
        )


def _eager(job: Job) -> bool:
    """Whether the job's shares start eagerly (`elastic.overlap` above 0)."""
    return elastic_of_plain(job.spec).eager
