"""The owner's spot check of a worker's result: replay a few segments, chosen now.

A result commits, under the worker's signature, to the sha256 of its training state
at every checkpoint step (`training.evidence.checkpoints`). After it arrives, this node picks
segments with the OS's random source (the worker cannot know which), fetches the
worker's checkpoints at their starts under the worker's grant, and replays them in
its own sandboxed runner (`training.evidence.replay`). Checked, every time:

- checkpoint 0 is the spec's own initial state (another seed, another model: caught);
- each replayed segment ends on the worker's next checkpoint: the same sha256 within
  one determinism class, a relative distance of at most `TOLERANCE` across classes
  (`BF16_TOLERANCE` for a job trained in bf16, `BF16_ACROSS_KINDS` when a CPU
  replays a GPU's bf16 segment: `tolerance_of`);
- the worker's last checkpoint unpacks to exactly the weights it returned, and those
  are evaluated here: the job shows these metrics, not the worker's.

The number of segments is the job's `trust.spot_check_budget` of them for a peer on
probation, fewer for a trusted one (`node.work.trust.reputation`).

An elastic round's share is checked the same way, before its delta joins the round:
its chain is the round's H inner steps; checkpoint 0 must be the round's global
weights with the slot's seeded RNG, and the last checkpoint must rebuild the delta
the worker sent (`training.evidence.replay`).
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from node.work.blobs import TransferError, fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.run import RequestBuilder
from node.work.trust.commitments import CHECKED_REPORTS, Commitments
from node.work.trust.comparisons import (
    Failure,
    claimed_hash,
    compare_replay,
    compare_reports,
    replay_table,
    with_early,
)
from node.work.trust.draws import drawn, needed_states, replay_chance
from node.work.trust.replays import (
    TOLERANCE,
    FetchedStates,
    Replays,
    across_classes,
    across_kinds,
    share_blobs,
    tolerance_of,
)
from node.work.trust.reputation import Reputation, segments_to_check
from protocol import ProtocolError, seal
from protocol.blobs import BlobGrant
from protocol.evidence import Evidence
from protocol.work import Result
from training.spec.job import relay_blob_bytes

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    ok: bool
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # evaluated here
    evidence: bytes = b""  # the signed Evidence when not ok
    segments: list[int] = field(default_factory=list)  # the checked ones
    replayed_steps: int = 0
    early: int = 0  # of `segments`, replayed while the worker still trained
    total_steps: int = 0
    strict: bool = True  # bitwise (one determinism class), else within `tolerance`
    tolerance: float = TOLERANCE
    note: str = ""  # what a replica comparison found
    caught: bool = False  # a check failed (not: a check could not run)
    unverified: bool = False  # the worker stopped serving its evidence (it vanished)


@dataclass(frozen=True)
class Submitted:
    """A worker's result as the owner has it, with what fetching its files needs."""

    job: Job
    unit: Unit
    spec: dict[str, Any]  # the plain spec the unit trained (a trial's own)
    peer: str
    result: Result
    envelope: bytes  # the worker's signed result, for evidence
    grant: BlobGrant
    key: bytes
    reports: dict[int, float] = field(default_factory=dict)  # a trial's: step -> value
    metric: str = ""  # what `reports` hold (a sweep's metric)
    delta_round: int | None = None  # a round's share: the round its delta starts from


class SpotChecks:
    def __init__(
        self, ctx: WorkContext, runner_request: RequestBuilder, reputation: Reputation
    ) -> None:
        self.ctx = ctx
        self.reputation = reputation
        self._fetched = FetchedStates(ctx.blobs)  # the states fetched for checks
        self.replays = Replays(ctx, runner_request)
        self.commitments = Commitments(ctx, reputation, self._fetched, self.replays)

    def wanted(self, job: Job) -> bool:
        """Whether the job's units carry checkpoints, and are checked."""
        return spot_checked(job.spec)

    async def check(self, sub: Submitted) -> Verdict:
        """Replay the segments chosen (as it trained, or now); the verdict, with
        evidence when it fails. A check cut short because the worker no longer answers
        leaves its job's resume point: the unit is lost, not failed, and the next one
        goes on from there."""
        gone = False
        try:
            return await self._check(sub)
        except TransferError as exc:
            gone = exc.peer_gone
            raise
        finally:
            if gone:
                self.commitments.unit_ended(sub.unit.unit_id)
            else:
                self.commitments.forget(sub.unit.unit_id)

    async def _check(self, sub: Submitted) -> Verdict:
        steps, bound = await self._steps(sub)
        result = sub.result
        if len(result.checkpoints) != len(steps):
            return Verdict(
                False,
                f"the result commits to {len(result.checkpoints)} checkpoints; this job's "
                f"spec takes {len(steps)}",
            )
        rng = secrets.SystemRandom()
        try:  # drawn as it trained, when it committed to each state
            chosen = self.commitments.chosen_at_result(sub.unit, sub.spec, result.checkpoints)
        except ProtocolError as exc:
            return Verdict(False, str(exc), caught=True)
        reported = _reported_segments(sub, steps, chosen or [], rng)
        if chosen is None:  # it committed to nothing while training: drawn now
            streak = self.reputation.get(sub.peer).streak
            if sub.delta_round is not None:  # each segment, as it would have been
                chance = replay_chance(sub.spec, streak)
                chosen = [i for i in range(len(steps) - 1) if drawn(chance, rng)]
            else:
                budget = float(sub.spec.get("trust", {}).get("spot_check_budget", 0.1))
                chosen = choose_segments(len(steps) - 1, budget, streak, rng)
        chosen = sorted({*chosen, *reported})
        cross = across_classes(self.ctx, sub.peer)
        if sub.delta_round is not None:
            return await self._check_share(sub, steps, bound, chosen, cross)
        cps = result.checkpoints
        early = self.commitments.replayed(sub.unit.unit_id)  # as it trained
        rest = [i for i in chosen if i not in early or i in reported]
        table = replay_table(steps, rest, cps, cross)
        for segment, i in zip(table["segments"], rest, strict=True):
            segment["evaluate"] = i in reported
        need = {cps[i] for i in needed_states(rest, cross, False)} | {cps[-1]}
        resumed_from = sub.unit.resume_sha256
        if resumed_from:  # its start is a state this node holds: compared, not rebuilt
            del table["init"]
            table.pop("init_claimed", None)
            if 0 not in rest:
                need.discard(cps[0])
        replay = with_early(await self._replay(sub, table, need, bound), rest, early, chosen)
        if resumed_from:
            replay["init_sha256"] = resumed_from
            replay["init_distance"] = 0.0 if cps[0] == resumed_from else math.inf
        replay["replayed_steps"] += sum(steps[i + 1] - steps[i] for i in chosen if i not in rest)
        kinds = across_kinds(self.ctx, sub.peer)
        tolerance = tolerance_of(sub.spec, kinds)
        failure = compare_replay(
            replay, steps, chosen, cps, cross, result.weights_sha256, tolerance, kinds=kinds
        )
        if failure is None:
            # a reported metric keeps the class bound: BF16_ACROSS_KINDS was measured
            # on weights, not on metrics
            failure = compare_reports(
                sub.metric, sub.reports, replay, steps, chosen, cross, tolerance_of(sub.spec)
            )
        verdict = Verdict(
            failure is None,
            metrics=dict(replay.get("metrics", {})),
            segments=chosen,
            replayed_steps=int(replay.get("replayed_steps", 0)),
            early=len(chosen) - len(rest),
            total_steps=steps[-1],
            strict=not cross,
            tolerance=tolerance,
        )
        return self._with_failure(sub, verdict, failure)

    async def _check_share(
        self, sub: Submitted, steps: list[int], bound: int, chosen: list[int], cross: bool
    ) -> Verdict:
        """A round's share: its drawn segments only (a share is one segment:
        `SHARE_SEGMENTS`), each from its start, and nothing fetched when none was
        drawn. Checkpoint 0 is rebuilt from the round's weights (and the worker's inner
        optimizer state) when segment 0 is replayed; the delta from the replayed last
        state when the last one is (`docs/design/trust.md`)."""
        cps, last = sub.result.checkpoints, len(steps) - 2
        kinds = across_kinds(self.ctx, sub.peer)
        verdict = Verdict(
            True,
            segments=chosen,
            total_steps=steps[-1],
            strict=not cross,
            tolerance=tolerance_of(sub.spec, kinds),
        )
        if not chosen:
            return verdict
        table = replay_table(steps, chosen, cps, cross)
        table["share"] = self._share(sub)
        table["init"] = 0 in chosen
        if 0 in chosen:
            table["init_claimed"] = cps[0]
        del table["final"]
        if last in chosen and cross:  # the replay ends close to the worker's state
            table["final"] = cps[-1]  # (its claimed end, fetched anyway): from that
        elif last in chosen:  # the replay ends on the worker's own state: from that
            table["final_replayed"] = True
        need = {cps[i] for i in needed_states(chosen, cross, True)}
        replay = await self._replay(sub, table, need, bound, share_blobs(table["share"]))
        verdict.replayed_steps = int(replay.get("replayed_steps", 0))
        failure = compare_replay(
            replay,
            steps,
            chosen,
            cps,
            cross,
            sub.result.weights_sha256,
            verdict.tolerance,
            start=0 in chosen,
            end=last in chosen,
            kinds=kinds,
        )
        return self._with_failure(sub, verdict, failure)

    def _with_failure(self, sub: Submitted, verdict: Verdict, failure: Failure | None) -> Verdict:
        if failure is not None:
            verdict.ok, verdict.reason, verdict.caught = False, failure.reason, True
            if failure.replayed != claimed_hash(sub.result, failure.index):  # else: a false report
                verdict.evidence = self.evidence(sub, failure)
        return verdict

    async def replay_segment(self, sub: Submitted, index: int) -> Failure:
        """Replay segment `index` (checkpoint `index` to `index + 1`) from `sub`'s
        checkpoint; what the replay gave, as the failure it is for a chain that
        claims otherwise."""
        steps, bound = await self._steps(sub)
        cps = sub.result.checkpoints
        segment = {"start": steps[index], "end": steps[index + 1], "from": cps[index]}
        replay = await self._replay(sub, {"segments": [segment]}, {cps[index]}, bound)
        reason = (
            f"steps {steps[index]}..{steps[index + 1]} replayed do not give "
            f"checkpoint {index + 1} (the first a replica disagreed on)"
        )
        return Failure(index + 1, steps[index], steps[index + 1], replay["ends"][0], reason)

    def evidence(self, sub: Submitted, failure: Failure) -> bytes:
        evidence = Evidence(
            sub.job.id,
            sub.unit.unit_id,
            self.ctx.peer_id,
            sub.peer,
            sub.envelope,
            failure.index,
            failure.start,
            failure.end,
            failure.replayed,
            failure.reason,
            time.time(),
        )
        return seal(evidence, self.ctx.identity.signing_key)

    async def _steps(self, sub: Submitted) -> tuple[list[int], int]:
        share = sub.delta_round is not None
        return await self.replays.steps(sub.job, sub.spec, share, sub.unit.resume_step)

    def _share(self, sub: Submitted) -> dict[str, Any]:
        assert sub.delta_round is not None
        return self.replays.share_table(sub.unit, sub.spec)

    async def _replay(
        self,
        sub: Submitted,
        table: dict[str, Any],
        need: set[str],
        bound: int,
        owned: Iterable[str] = (),
    ) -> dict[str, Any]:
        """Fetch `need` from the worker and run the runner's replay task on `table`
        (with `owned`: blobs of this node's own it also reads)."""
        self._fetched.hold(need)
        try:
            await fetch_granted(
                self.ctx,
                sub.peer,
                sub.grant,
                sub.result.weights_grant,
                sub.key,
                sorted(need),
                bound,
                relay_blob_bytes(sub.spec),
            )
            return await self.replays.run(sub.job, sub.unit, sub.spec, table, {*need, *owned})
        finally:
            self._fetched.release(need)


def spot_checked(spec: dict[str, Any]) -> bool:
    """Whether results of `spec` are spot checked: then the owner evaluates the final
    weights itself, and the worker need not (`RunnerRequest.final_validation`)."""
    trust = spec.get("trust", {})
    checked = trust.get("spot_check_budget", 0.1) > 0 or trust.get("replicas", 1) > 1
    return trust.get("checkpoints", 100) > 0 and checked


def _reported_segments(
    sub: Submitted, steps: list[int], chosen: list[int], rng: random.Random
) -> set[int]:
    """The segments whose end a trial reported a validation value at, among those
    chosen, plus one more drawn among all of them (their starts were kept for it:
    `Commitments._report_starts`): the reports checked by replay."""
    if sub.metric not in CHECKED_REPORTS:
        return set()  # a batch loss (train_loss) is not re-evaluated
    ending = {steps[i + 1]: i for i in range(len(steps) - 1)}
    reported = [ending[s] for s in sub.reports if s in ending]
    if not reported:
        return set()
    return {i for i in chosen if i in reported} | {rng.choice(reported)}


def choose_segments(segments: int, budget: float, streak: int, rng: random.Random) -> list[int]:
    """Which of a unit's `segments` to replay: `budget` of them (at least one) for a
    peer on probation, fewer as its `streak` of valid results grows."""
    if budget <= 0:
        return []
    full = max(1, math.floor(budget * segments))
    return sorted(rng.sample(range(segments), min(segments, segments_to_check(full, streak))))
