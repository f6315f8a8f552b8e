"""The owner's spot check of a worker's result: replay a few segments, chosen now.

A result commits, under the worker's signature, to the sha256 of its training state
at every checkpoint step (`training.evidence.checkpoints`). After it arrives, this node picks
segments with the OS's random source (the worker cannot know which), fetches the
worker's checkpoints at their starts under the worker's grant, and replays them in
its own sandboxed runner (`training.evidence.replay`). Checked, every time:

- checkpoint 0 is the spec's own initial state (another seed, another model: caught);
- each replayed segment ends on the worker's next checkpoint: the same sha256 within
  one determinism class, a relative distance of at most `TOLERANCE` across classes
  (`BF16_TOLERANCE` for a job trained in bf16);
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

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.run import RequestBuilder
from node.work.trust.commitments import CHECKED_REPORTS, Commitments, needed_states
from node.work.trust.replays import (
    TOLERANCE,
    FetchedStates,
    Replays,
    across_classes,
    tolerance_of,
)
from node.work.trust.reputation import Reputation, segments_to_check
from protocol import ProtocolError, seal
from protocol.blobs import BlobGrant
from protocol.evidence import Evidence
from protocol.work import Result
from training.spec.job import relay_blob_bytes

log = logging.getLogger(__name__)

START = (
    "the unit's start (the spec's initial state; a share's: the round's weights; a "
    "resumed unit's: the state it resumed from)"
)


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


@dataclass(frozen=True)
class Failure:
    index: int  # the checkpoint that failed (-1: the weights)
    start: int
    end: int
    replayed: str
    reason: str


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
        evidence when it fails."""
        try:
            return await self._check(sub)
        finally:
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
            budget = float(sub.spec.get("trust", {}).get("spot_check_budget", 0.1))
            chosen = choose_segments(len(steps) - 1, budget, streak, rng)
        chosen = sorted({*chosen, *reported})
        cross = across_classes(self.ctx, sub.peer)
        cps = result.checkpoints
        early = self.commitments.replayed(sub.unit.unit_id)  # as it trained
        rest = [i for i in chosen if i not in early or i in reported]
        table = replay_table(steps, rest, cps, cross)
        for segment, i in zip(table["segments"], rest, strict=True):
            segment["evaluate"] = i in reported
        share = sub.delta_round is not None
        need = {cps[i] for i in needed_states(rest, cross, share)} | {cps[-1]}
        owned: set[str] = set()
        if share:  # checkpoint 0 is rebuilt from the round's weights
            table["init_claimed"] = cps[0]
            table["share"] = self._share(sub)
            owned.add(table["share"]["weights"])
        resumed_from = sub.unit.resume_sha256
        if resumed_from:  # its start is a state this node holds: compared, not rebuilt
            del table["init"]
            table.pop("init_claimed", None)
            if 0 not in rest:
                need.discard(cps[0])
        replay = with_early(await self._replay(sub, table, need, bound, owned), rest, early, chosen)
        if resumed_from:
            replay["init_sha256"] = resumed_from
            replay["init_distance"] = 0.0 if cps[0] == resumed_from else math.inf
        replay["replayed_steps"] += sum(steps[i + 1] - steps[i] for i in chosen if i not in rest)
        tolerance = tolerance_of(sub.spec)
        failure = compare_replay(
            replay, steps, chosen, cps, cross, result.weights_sha256, tolerance
        )
        if failure is None:
            failure = _compare_reports(sub, replay, steps, chosen, cross, tolerance)
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
        if failure is not None:
            verdict.reason, verdict.caught = failure.reason, True
            if failure.replayed != _claimed(result, failure.index):  # else: a false report
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
        return self.replays.share_table(sub.job.id, sub.delta_round, sub.unit.slot)

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


def with_early(
    replay: dict[str, Any],
    rest: list[int],
    early: dict[int, tuple[str, float]],
    chosen: list[int],
) -> dict[str, Any]:
    """The result's replay (of `rest`) with the segments replayed while the worker
    trained (`early`), in the order of `chosen`, as one replay of them all."""
    at = {i: j for j, i in enumerate(rest)}
    merged = {**replay, "ends": [], "distances": [], "evaluations": []}
    distances = replay["distances"] or [0.0] * len(rest)
    for i in chosen:
        if i in at:
            j = at[i]
            merged["ends"].append(replay["ends"][j])
            merged["distances"].append(distances[j])
            merged["evaluations"].append(replay["evaluations"][j])
        else:
            merged["ends"].append(early[i][0])
            merged["distances"].append(early[i][1])
            merged["evaluations"].append({})
    return merged


def _claimed(result: Result, index: int) -> str:
    return result.weights_sha256 if index < 0 else result.checkpoints[index]


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


def _compare_reports(
    sub: Submitted,
    replay: dict[str, Any],
    steps: list[int],
    chosen: list[int],
    cross: bool,
    tolerance: float,
) -> Failure | None:
    """A reported value against the replayed state's evaluation at that step: equal
    within a class, within `tolerance` (relative) across classes."""
    for j, i in enumerate(chosen):
        found = replay["evaluations"][j].get(sub.metric)
        claimed = sub.reports.get(steps[i + 1])
        if found is None or claimed is None:
            continue
        off = abs(found - claimed) / max(abs(found), 1e-12)
        if (off > tolerance) if cross else (found != claimed):
            return Failure(
                i + 1,
                steps[i],
                steps[i + 1],
                replay["ends"][j],
                f"the trial reported {sub.metric} {claimed:.6g} at step {steps[i + 1]}; "
                f"the replayed state gives {found:.6g}",
            )
    return None


def choose_segments(segments: int, budget: float, streak: int, rng: random.Random) -> list[int]:
    """Which of a unit's `segments` to replay: `budget` of them (at least one) for a
    peer on probation, fewer as its `streak` of valid results grows."""
    if budget <= 0:
        return []
    full = max(1, math.floor(budget * segments))
    return sorted(rng.sample(range(segments), min(segments, segments_to_check(full, streak))))


def replay_table(steps: list[int], chosen: list[int], cps: list[str], cross: bool) -> dict:
    """The runner's `replay` request table for the `chosen` segments of a chain."""
    segments = []
    for i in chosen:
        segment = {"start": steps[i], "end": steps[i + 1], "from": cps[i]}
        if cross:
            segment["claimed"] = cps[i + 1]
        segments.append(segment)
    table: dict[str, Any] = {"init": True, "segments": segments, "final": cps[-1]}
    if cross:
        table["init_claimed"] = cps[0]
    return table


def compare_replay(
    replay: dict[str, Any],
    steps: list[int],
    chosen: list[int],
    cps: list[str],
    cross: bool,
    weights_sha256: str,
    tolerance: float = TOLERANCE,
) -> Failure | None:
    """The first disagreement between the replay and the worker's commitments."""
    if cross:
        if replay.get("init_distance", math.inf) > tolerance:
            off = f"{replay.get('init_distance', math.inf):.3g}"
            why = f"checkpoint 0 is {off} off {START}"
            return Failure(0, 0, 0, replay["init_sha256"], why)
    elif replay.get("init_sha256") != cps[0]:
        return Failure(
            0,
            0,
            0,
            replay["init_sha256"],
            f"checkpoint 0 is not {START}",
        )
    for j, i in enumerate(chosen):
        ok = replay["distances"][j] <= tolerance if cross else replay["ends"][j] == cps[i + 1]
        if not ok:
            how = f" (relative distance {replay['distances'][j]:.3g})" if cross else ""
            return Failure(
                i + 1,
                steps[i],
                steps[i + 1],
                replay["ends"][j],
                f"steps {steps[i]}..{steps[i + 1]} replayed do not give checkpoint {i + 1}{how}",
            )
    if replay.get("weights_sha256") != weights_sha256:
        return Failure(
            -1,
            steps[-1],
            steps[-1],
            replay.get("weights_sha256", "0" * 64),
            "what it returned (weights, or a round's delta) is not built from its last checkpoint",
        )
    return None
