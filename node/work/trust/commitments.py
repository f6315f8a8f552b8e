"""Checkpoint commitments, both ends: the worker commits to each training state as it
makes it; the owner draws at once whether the segment that state ends is replayed.

    worker -> owner  `Progress.commitments` (from index `commit_from`): the sha256 of
                     each checkpoint as it is written; `evidence_grant`, a grant for
                     the states the owner asked to keep
    owner -> worker  `ProgressAck`: how many commitments it holds (`have`), the states
                     to keep until it has fetched them (`keep`), those that may go
                     (`drop`)

Segment i (checkpoint i to i + 1) is drawn once commitment i + 1 is in, with this
node's own random source: chosen with probability p, each segment on its own. The
worker is bound to both ends before the draw, so it cannot know in advance which
segment is replayed; and since the draws are independent, the segments revealed
unchosen tell it nothing of the next ones (with "n of S", the last ones would be
known safe once n were revealed). p is the spot-check budget (less for a trusted
peer: `segments_to_check`) over the unit's segments. The owner fetches what a chosen
segment's replay needs while training goes on (`needed_states`), and the worker lets
every other state go as soon as it is drawn. So a worker holds the newest state, the
one before it until its segment is drawn, and one waiting for the owner's fetch: the
runner waits for room past `MAX_HELD` (`training.evidence.writer`). At the result
the owner draws what is still open and replays the chosen segments
(`spot_checks.py`); a result whose chain differs from its commitments fails.

A job whose units are not spot checked one by one (replicas compare whole chains and
replay wherever they part) keeps every state, as before commitments.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.trust.chains import Chain, Chains
from node.work.trust.comparisons import agrees
from node.work.trust.draws import drawn, drawn_by_commitment, needed_states, replay_chance
from node.work.trust.replays import (
    FetchedStates,
    Replays,
    across_classes,
    across_kinds,
    share_blobs,
    tolerance_of,
)
from node.work.trust.reputation import Reputation
from node.work.trust.resume import (
    ResumePoint,
    clear_point,
    due,
    latest_trusted,
    resume_point,
    save_point,
)
from protocol import ProtocolError, open_envelope
from protocol.blobs import BlobGrant
from protocol.work import WORK_LIMITS, Progress, ProgressAck

log = logging.getLogger(__name__)

FETCHES_QUEUED = 64
#: the reported metrics a spot check re-evaluates (a batch's `train_loss` is not)
CHECKED_REPORTS = ("val_loss", "val_accuracy")
#: training states a worker holds for one unit, at most, once they pass the
#: volunteer's `evidence_floor_mb` in all (a small model's hundred states cost less
#: disk than a round trip to the owner per checkpoint costs time)
MAX_HELD = 3


@dataclass(frozen=True)
class UnitTerms:
    """What a unit's mode says of it, for the draws and what the owner keeps."""

    spec: dict[str, Any]  # the plain spec the unit trains (a trial's own)
    delta_round: int | None = None  # a round's share: the round its delta starts from
    resumable: bool = False  # a lost unit goes on from its states (`resume.py`)
    reports: bool = False  # a trial whose reported validation values are checked


class Commitments:
    """The owner's end: the chains heard in heartbeats, the draws, the fetches."""

    def __init__(
        self, ctx: WorkContext, reputation: Reputation, fetched: FetchedStates, replays: Replays
    ) -> None:
        self.ctx = ctx
        self._reputation = reputation
        self._fetched = fetched
        self._replays = replays
        self._chains = Chains(ctx.jobs.db)
        self._send, self._queue = trio.open_memory_channel[tuple](FETCHES_QUEUED)
        self._fetching: set[tuple[str, int]] = set()
        self._replay_send, self._replay_queue = trio.open_memory_channel[tuple](FETCHES_QUEUED)

    async def heard(
        self, job: Job, unit: Unit, terms: UnitTerms, progress: Progress
    ) -> ProgressAck:
        """Record the heartbeat's new commitments, draw the segments they close, and
        say what the worker keeps and drops; not ok when a commitment changed. A
        `resumable` unit also keeps its newest state for this node to fetch when none
        was fetched for `trust.resume_minutes` (`resume.py`); a trial whose reports
        are checked keeps the start of every segment that ends on a report."""
        chain = self._chain(unit.unit_id)
        before = (len(chain.shas), len(chain.drawn))
        for offset, sha in enumerate(progress.commitments):
            index = progress.commit_from + offset
            if index < len(chain.shas) and chain.shas[index] != sha:
                return ProgressAck(False, f"commitment {index} changed")
            if index == len(chain.shas):
                chain.shas.append(sha)
        spec = terms.spec
        if not drawn_by_commitment(spec):
            return ProgressAck(True, "", len(chain.shas))
        self._draw(chain, self._chance(unit, spec), len(chain.shas) - 1)
        share = terms.delta_round is not None
        reported = await self._report_starts(job, unit, spec, share) if terms.reports else set()
        keep, drop = self._answer(chain, unit.worker, share, reported)
        minutes = float(spec.get("trust", {}).get("resume_minutes", 10.0))
        newest = len(chain.shas) - 1
        resume = terms.resumable and newest >= 1 and due(chain.last_fetch_at, minutes, time.time())
        if resume:
            keep = sorted({*keep, newest} - chain.fetched)
        if (len(chain.shas), len(chain.drawn)) != before:
            self._chains.save(unit.unit_id, chain)
        # fetched now when the worker is short of room (or for resumption); else the
        # worker keeps them and they come with the result, as a small model's states do
        if keep and progress.evidence_grant and (progress.evidence_full or resume):
            self._queue_fetch(job, unit, terms, progress.evidence_grant, keep)
        return ProgressAck(True, "", len(chain.shas), tuple(keep), tuple(drop))

    async def _report_starts(
        self, job: Job, unit: Unit, spec: dict[str, Any], share: bool
    ) -> set[int]:
        """The segments that end on a step the trial reports a validation value at:
        the owner holds their starts, so that at the result it can replay one drawn
        among all of them (`spot_checks._reported_segments`)."""
        every = int(spec.get("optim", {}).get("validate_every", 0) or 0)
        if every <= 0:
            return set()
        steps, _ = await self._replays.steps(job, spec, share, unit.resume_step)
        total = steps[-1]
        return {
            k for k in range(len(steps) - 1) if steps[k + 1] % every == 0 < total - steps[k + 1]
        }

    def chosen_at_result(
        self, unit: Unit, spec: dict[str, Any], shas: list[str]
    ) -> list[int] | None:
        """At the result: the chosen segments of a chain whose commitments match
        `shas` (the open ones drawn now), or None when the worker committed nothing
        while training (its chain is drawn from as a whole, as it stands)."""
        chain = self._chain(unit.unit_id)
        if not chain.shas or not drawn_by_commitment(spec):
            return None
        if chain.shas != shas[: len(chain.shas)]:
            raise ProtocolError("the result's checkpoints are not those it committed to")
        chain.shas = list(shas)
        self._draw(chain, self._chance(unit, spec), len(shas) - 1)
        self._chains.save(unit.unit_id, chain)
        return chain.chosen()

    def replayed(self, unit_id: str) -> dict[int, tuple[str, float, float]]:
        """The unit's segments replayed while it trained: (end sha256, distance, step
        ratio; a chain kept before ratios were measured has none: inf)."""
        chain = self._chains.loaded(unit_id)
        if chain is None:
            return {}
        return {
            i: (str(r[0]), float(r[1]), float(r[3]) if len(r) > 3 else math.inf)
            for i, r in chain.replayed.items()
        }

    def unit_ended(self, unit_id: str) -> None:
        """The unit ended: the states fetched for its chain go (its job's resume point
        stays, held on its own, for the next unit)."""
        chain = self._chains.forget(unit_id)
        if chain is not None:
            self._fetched.release(chain.shas[i] for i in chain.fetched)

    def forget(self, unit_id: str) -> None:
        """The unit's check is over: its chain, the states fetched for it and its
        job's resume point go (the job is done, or the next unit starts over)."""
        self.unit_ended(unit_id)
        unit = self.ctx.jobs.unit(unit_id)
        point = clear_point(self.ctx.jobs.db, unit.job_id) if unit is not None else None
        if point is not None:
            self._fetched.release([point.sha256])

    async def run(self) -> None:
        """Fetch the kept states the workers grant, one unit's at a time, and replay
        each chosen segment once what it reads is here."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._replay_all)
            async for job, unit, terms, grant_env, indices in self._queue:
                try:
                    await self._fetch(job, unit, terms.spec, grant_env, indices)
                    if terms.resumable:
                        await self._advance_point(job, unit, terms.spec)
                    self._replay_send.send_nowait((job, unit, terms))
                except trio.WouldBlock:
                    pass  # replayed at the result instead
                except Exception as exc:  # the state stays kept: fetched with the result
                    log.info("unit %s: kept states not fetched yet: %s", unit.unit_id, exc)
                finally:
                    self._fetching -= {(unit.unit_id, i) for i in indices}

    async def _replay_all(self) -> None:
        async for job, unit, terms in self._replay_queue:
            try:
                await self._replay_ready(job, unit, terms.spec, terms.delta_round)
                if terms.resumable:
                    await self._advance_point(job, unit, terms.spec)
            except Exception as exc:  # replayed at the result instead
                log.info("unit %s: a segment not replayed early: %s", unit.unit_id, exc)

    async def _replay_ready(
        self, job: Job, unit: Unit, spec: dict[str, Any], delta_round: int | None
    ) -> None:
        """Replay the chosen segments whose states are all here, not replayed yet."""
        chain = self._chains.loaded(unit.unit_id)
        if chain is None:
            return
        cross = across_classes(self.ctx, unit.worker)
        ready = [
            i
            for i in chain.chosen()
            if i not in chain.replayed
            and i + 1 < len(chain.shas)
            and needed_states([i], cross, False) <= chain.fetched
        ]
        if not ready:
            return
        steps, _ = await self._replays.steps(job, spec, delta_round is not None, unit.resume_step)
        table: dict[str, Any] = {"segments": []}
        for i in ready:
            segment = {"start": steps[i], "end": steps[i + 1], "from": chain.shas[i]}
            if cross:
                segment["claimed"] = chain.shas[i + 1]
            table["segments"].append(segment)
        owned: set[str] = set()
        if delta_round is not None:
            table["share"] = self._replays.share_table(unit, spec)
            owned |= share_blobs(table["share"])
        shas = {chain.shas[i] for i in needed_states(ready, cross, False)} | owned
        replay = await self._replays.run(job, unit, spec, table, shas)
        if self._chains.loaded(unit.unit_id) is not chain:
            return  # checked and forgotten meanwhile
        distances = replay["distances"] if cross else [0.0] * len(ready)
        ratios = replay.get("step_ratios") if cross else None
        ratios = ratios or [0.0] * len(ready)
        kinds = across_kinds(self.ctx, unit.worker)
        tolerance = tolerance_of(spec, kinds)
        for i, end, distance, ratio in zip(ready, replay["ends"], distances, ratios, strict=True):
            if cross:
                agreed = agrees(distance, ratio, tolerance, kinds)
            else:
                agreed = end == chain.shas[i + 1]
            chain.replayed[i] = [end, distance, agreed, ratio]
        self._chains.save(unit.unit_id, chain)

    async def _advance_point(self, job: Job, unit: Unit, spec: dict[str, Any]) -> None:
        """Make the unit's latest trusted state the job's resume point."""
        chain = self._chains.loaded(unit.unit_id)
        if chain is None:
            return
        index = latest_trusted(chain.fetched, chain.chosen(), chain.agreed())
        if index is None:
            return
        steps, _ = await self._replays.steps(job, spec, False, unit.resume_step)
        db = self.ctx.jobs.db
        before = resume_point(db, job.id)
        if before is not None and before.step >= steps[index]:
            return
        self._fetched.hold([chain.shas[index]])
        save_point(db, ResumePoint(job.id, unit.unit_id, chain.shas[index], steps[index]))
        if before is not None:
            self._fetched.release([before.sha256])

    def _chance(self, unit: Unit, spec: dict[str, Any]) -> float:
        return replay_chance(spec, self._reputation.get(unit.worker).streak)

    def _chain(self, unit_id: str) -> Chain:
        chain, loaded = self._chains.get(unit_id)
        if loaded:  # after a restart: what was fetched before is held again, or fetched again
            chain.fetched = {i for i in chain.fetched if self.ctx.blobs.has(chain.shas[i])}
            self._fetched.hold(chain.shas[i] for i in chain.fetched)
        return chain

    def _draw(self, chain: Chain, chance: float, closed: int) -> None:
        """Draw every segment before `closed` not drawn yet."""
        rng = secrets.SystemRandom()
        for segment in range(closed):
            if segment not in chain.drawn:
                chain.drawn[segment] = drawn(chance, rng)

    def _answer(
        self, chain: Chain, worker: str, share: bool, reported: set[int]
    ) -> tuple[list[int], list[int]]:
        """(states to keep, not fetched yet; states that may go). A state goes once
        the segment it starts is drawn (the one it ends was drawn before) and no
        replay needs it, or once this node holds it; the newest never does."""
        cross = across_classes(self.ctx, worker)
        last = len(chain.shas) - 1
        wanted = {*chain.chosen(), *reported}
        needed = {i for i in needed_states(wanted, cross, share) if i <= last}
        keep = sorted(needed - chain.fetched)
        drop = [i for i in range(last) if i not in needed or i in chain.fetched]
        return keep, drop

    def _queue_fetch(
        self, job: Job, unit: Unit, terms: UnitTerms, grant_env: bytes, keep: list[int]
    ) -> None:
        wanted = [i for i in keep if (unit.unit_id, i) not in self._fetching]
        if not wanted:
            return
        try:
            self._send.send_nowait((job, unit, terms, grant_env, wanted))
        except trio.WouldBlock:
            return  # busy: asked for again at the next heartbeat, or read at the result
        self._fetching |= {(unit.unit_id, i) for i in wanted}

    async def _fetch(
        self, job: Job, unit: Unit, spec: dict[str, Any], grant_env: bytes, indices: list[int]
    ) -> None:
        chain = self._chains.loaded(unit.unit_id)
        key = self.ctx.grant_keys.get((job.id, unit.unit_id))
        if chain is None or key is None:
            return
        grant = open_envelope(
            grant_env, BlobGrant, expected_signer=unit.worker, limits=WORK_LIMITS
        ).message
        if (grant.grantee, grant.job_id, grant.unit_id) != (self.ctx.peer_id, job.id, unit.unit_id):
            raise ProtocolError("the evidence grant is for another unit or node")
        granted = [i for i in indices if chain.shas[i] in grant.blobs]  # the rest: next time
        shas = [chain.shas[i] for i in granted]
        self._fetched.hold(shas)
        try:
            bound = await self._replays.state_bytes(job, spec)
            await fetch_granted(self.ctx, unit.worker, grant, grant_env, key, shas, bound, bound)
        except BaseException:
            self._fetched.release(shas)
            raise
        if self._chains.loaded(unit.unit_id) is not chain:  # checked and forgotten meanwhile
            self._fetched.release(shas)
            return
        chain.fetched |= set(granted)
        chain.last_fetch_at = time.time()
        self._chains.save(unit.unit_id, chain)


@dataclass
class HeldStates:
    """The worker's end, for one unit: the states it committed to, and those of them
    still on disk in the runner's folder (`files`) and in the blob store (`stored`:
    a second name of the same file, granted to the owner)."""

    folder: Path  # where the runner writes them
    shas: list[str] = field(default_factory=list)
    files: dict[int, Path] = field(default_factory=dict)
    stored: set[int] = field(default_factory=set)
    have: int = 0  # commitments the owner acknowledged
    floor_bytes: int | None = None  # the runner's `Hold` floor (None: it keeps them all)

    def written(self, event: dict[str, Any]) -> None:
        """The runner's `checkpoint` event: a state to commit to."""
        index, sha = int(event["index"]), str(event["sha256"])
        if index == len(self.shas):
            self.shas.append(sha)
            self.files[index] = self.folder / str(event["file"])

    def pressing(self) -> bool:
        """Whether the runner may soon wait for room (`training.evidence.writer`): then
        heartbeats go at once (else at their second) and say so (`evidence_full`)."""
        if self.floor_bytes is None or len(self.files) < MAX_HELD - 1:
            return False
        sizes = (path.stat().st_size for path in self.files.values() if path.exists())
        return sum(sizes) >= self.floor_bytes

    def unsent(self) -> tuple[int, list[str]]:
        """(`commit_from`, `commitments`) for the next heartbeat."""
        return self.have, self.shas[self.have :]

    def to_store(self, ack: ProgressAck) -> list[int]:
        """The states the owner asks for, not yet in the blob store."""
        self.have = min(ack.have, len(self.shas))  # the owner's count: it may have lost some
        return [i for i in ack.keep if i in self.files and i not in self.stored]

    def to_drop(self, ack: ProgressAck) -> tuple[list[Path], list[str]]:
        """The states the owner lets go of (never the newest: it starts the next
        segment), forgotten here: (their files, the sha256 of those stored)."""
        newest = len(self.shas) - 1
        gone = [i for i in ack.drop if i < newest and i in self.files]
        released = [self.shas[i] for i in gone if i in self.stored]
        self.stored -= set(gone)
        return [self.files.pop(i) for i in gone], released

    def kept(self) -> list[str]:
        """The states stored for the owner to fetch."""
        return [self.shas[i] for i in sorted(self.stored)]
