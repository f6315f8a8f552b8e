"""A round's next weights before its close: the early outer step, and what the shares
that take those weights on their way are told (docs/design/elastic.md, "Rounds that
overlap" and "The early outer step").

A share that starts eagerly takes its round's weights after `overlap x H` steps, and
a drawn delta's check replays H steps: waiting for the close would hold every such
share in every round with a drawn delta. So once each slot's delta of round r is in
(checked, or fetched and sound in form while its check goes on), the outer step is
taken at once (`EarlyWeights.maybe_start`); its weights answer the takers' heartbeats
(`weights_to_take`), and the close reuses them when it applies the same deltas on the
same bases (`at_close`). A unit once told keeps its answer (`Unit.taken` in node.db,
its delta's base), whatever the close does after. The heartbeat of a share whose
runner already waits is answered the moment the weights exist (up to `hold_s`), not
at its next heartbeat: that wait is on every round's critical path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from node.work.blobs import issue_grant
from node.work.context import WorkContext
from node.work.jobs import LIVE_UNIT_STATES, Job, Round, RoundStore, Unit
from node.work.offers import GRANT_SLACK_S
from node.work.owner.modes.round_tasks import RoundTasks
from training.spec.job import elastic_of_plain

log = logging.getLogger(__name__)

StepResult = tuple[str, str, str]  # the next weights, momentum and update (blob hashes)


@dataclass
class EarlyStep:
    """A round's outer step taken before its deltas' checks end."""

    deltas: tuple[str, ...]  # in slot order
    bases: tuple[str, ...] = ()
    result: StepResult | None = None
    ready: trio.Event = field(default_factory=trio.Event)


class EarlyWeights:
    """The early outer steps of one owner's elastic jobs, and its answers to takers."""

    def __init__(self, ctx: WorkContext, store: RoundStore, tasks: RoundTasks) -> None:
        self.ctx = ctx
        self.store = store
        self.tasks = tasks
        self._steps: dict[tuple[str, int], EarlyStep] = {}  # (job, round) ->
        self._answers: dict[str, dict[str, Any]] = {}  # unit -> what it was told
        self._ready: dict[tuple[str, int], trio.Event] = {}  # set once the weights exist

    def told(self, unit_id: str) -> dict[str, Any]:
        """What `unit_id` was told of the weights it takes ({} if nothing yet)."""
        return self._answers.get(unit_id, {})

    def forget(self, unit_id: str) -> None:
        """The unit ended: its answer is in node.db (`Unit.taken`) if it matters."""
        self._answers.pop(unit_id, None)

    def drop_job(self, job_id: str) -> None:
        """The job's rounds ended or stopped: its steps and answers go."""
        for key in [k for k in self._steps if k[0] == job_id]:
            del self._steps[key]
        for key in [k for k in self._ready if k[0] == job_id]:
            self._ready.pop(key).set()
        for unit in self.ctx.jobs.units_of(job_id):
            self._answers.pop(unit.unit_id, None)

    async def weights_to_take(self, job: Job, unit: Unit, hold_s: float = 0.0) -> dict[str, Any]:
        """For an eager share that takes its round's weights on its way: their hash,
        the update that gives them from the weights it started from (else it fetches
        them whole), and a grant to fetch that blob (`ProgressAck`); nothing for any
        other unit, or before they exist. Before they exist, waits up to `hold_s` for
        them. Once told, a unit is told the same weights again (`Unit.taken`, its
        delta's base)."""
        if not unit.start_delta or not elastic_of_plain(job.spec).takes_weights:
            return {}
        answer = self._answer(job, unit)
        if answer or hold_s <= 0:
            return answer
        with trio.move_on_after(hold_s):
            await self._ready.setdefault((job.id, unit.round - 1), trio.Event()).wait()
        fresh = self.ctx.jobs.unit(unit.unit_id)  # it may have ended meanwhile
        live = fresh is not None and fresh.state in LIVE_UNIT_STATES
        return self._answer(job, fresh) if live else {}

    def _answer(self, job: Job, unit: Unit) -> dict[str, Any]:
        if unit.unit_id in self._answers:
            return self._answers[unit.unit_id]
        weights, update = self._newest(job.id, unit.round - 1)
        if unit.taken and unit.taken != weights:  # told before this node restarted
            weights, update = unit.taken, ""
        if not weights:
            return {}
        weights = self.ctx.jobs.unit_taken(unit.unit_id, weights)
        blob = update or weights
        valid_s = job.max_hours * 3600 + GRANT_SLACK_S
        grant = issue_grant(
            self.ctx, job.id, unit.unit_id, unit.worker, [blob], self.ctx.blobs.size(blob), valid_s
        )
        answer = {"weights_sha256": weights, "update_sha256": update, "weights_grant": grant}
        self._answers[unit.unit_id] = answer
        return answer

    def _newest(self, job_id: str, round_: int) -> tuple[str, str]:
        """The weights `round_`'s outer step gave, and their update from its own:
        at its close, or early; ("", "") before either."""
        row = self.store.get(job_id, round_)
        if row is not None and row.state == "closed" and row.next_weights_sha256:
            return row.next_weights_sha256, row.next_update_sha256
        early = self._steps.get((job_id, round_))
        if early is not None and early.result is not None:
            weights, _, update = early.result
            return weights, update
        return "", ""

    def maybe_start(
        self, nursery: trio.Nursery, job: Job, current: Round, done: list[Unit], live: list[Unit]
    ) -> None:
        """Once every slot's delta is in (checked, or fetched and sound in form while
        its check goes on), take the round's outer step in `nursery`."""
        key = (job.id, current.round)
        if key in self._steps or not elastic_of_plain(job.spec).takes_weights:
            return
        delivered = done + [u for u in live if u.state == "verifying" and u.output_sha256]
        if len({u.slot for u in delivered}) < int(job.spec["elastic"]["workers"]):
            return
        units = sorted(delivered, key=lambda u: u.slot)
        self._steps[key] = EarlyStep(tuple(u.output_sha256 for u in units))
        nursery.start_soon(self._step, job, current, units)

    async def _step(self, job: Job, current: Round, units: list[Unit]) -> None:
        """The outer step over `units`' deltas before all of them are checked."""
        early = self._steps[(job.id, current.round)]
        bases = [self.store.delta_base(job.id, u.round, u.start_delta, u.taken) for u in units]
        try:
            early.result = await self.tasks.outer_step(job, current, units, bases)
        except Exception as exc:  # a delta unsound past its header: the close finds it
            log.info("job %s: round %d's early outer step failed: %s", job.id, current.round, exc)
        finally:
            early.bases = tuple(bases)
            early.ready.set()
        if early.result is not None:
            self._announce(job.id, current.round)

    async def at_close(
        self, job: Job, current: Round, deltas: tuple[str, ...], bases: tuple[str, ...]
    ) -> StepResult | None:
        """The early step's result when the close applies the same `deltas` on the same
        `bases` (the same bits: the close takes it); None when there was none, or a
        delta failed its check meanwhile. Waits for a step under way; the step stays
        (takers are told its weights) until `closed`."""
        early = self._steps.get((job.id, current.round))
        if early is None:
            return None
        await early.ready.wait()
        if early.result and (early.deltas, early.bases) == (deltas, bases):
            return early.result
        return None

    def closed(self, job_id: str, round_: int) -> None:
        """The round closed: its next weights are in node.db from now on."""
        self._steps.pop((job_id, round_), None)
        self._announce(job_id, round_)

    def _announce(self, job_id: str, round_: int) -> None:
        """`round_`'s next weights exist: the heartbeats held for them are answered."""
        ready = self._ready.pop((job_id, round_), None)
        if ready is not None:
            ready.set()
