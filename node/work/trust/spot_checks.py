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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.run import RequestBuilder
from node.work.trust.commitments import Commitments, FetchedStates, needed_states
from node.work.trust.reputation import Reputation, segments_to_check
from protocol import ProtocolError, seal
from protocol.blobs import BlobGrant
from protocol.evidence import Evidence
from protocol.work import Result
from training.spec.job import relay_blob_bytes

log = logging.getLogger(__name__)

#: across determinism classes: the largest relative L2 distance of any weight tensor
#: after one replayed segment (measured honest: <= 1e-6; one skipped step: >= 1e-2)
TOLERANCE = 1e-3
#: the same for a job trained in bf16 (`optim.precision`): 8 bits of mantissa in the
#: matrix products put kernels of two classes further apart
BF16_TOLERANCE = 3e-2
START = "the unit's start (the spec's initial state; a share's: the round's weights)"


@dataclass
class Verdict:
    ok: bool
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # evaluated here
    evidence: bytes = b""  # the signed Evidence when not ok
    segments: list[int] = field(default_factory=list)  # the checked ones
    replayed_steps: int = 0
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
        self._runner_request = runner_request
        self.reputation = reputation
        self._fetched = FetchedStates(ctx.blobs)  # the states fetched for checks
        self._state_limits: dict[str, int] = {}  # job id -> the most bytes of a state
        self.commitments = Commitments(ctx, reputation, self._fetched, self._state_bytes)

    def wanted(self, job: Job) -> bool:
        """Whether the job's units carry checkpoints, and are checked."""
        trust = job.spec.get("trust", {})
        checked = trust.get("spot_check_budget", 0.1) > 0 or trust.get("replicas", 1) > 1
        return trust.get("checkpoints", 100) > 0 and checked

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
        reported = _reported_segments(sub, steps, chosen or [], rng, chosen is None)
        if chosen is None:  # it committed to nothing while training: drawn now
            streak = self.reputation.get(sub.peer).streak
            budget = float(sub.spec.get("trust", {}).get("spot_check_budget", 0.1))
            chosen = choose_segments(len(steps) - 1, budget, streak, rng)
        chosen = sorted({*chosen, *reported})
        cross = self.ctx.peers.determinism_of(sub.peer) != self.ctx.own_ad().determinism
        cps = result.checkpoints
        table = replay_table(steps, chosen, cps, cross)
        for segment, i in zip(table["segments"], chosen, strict=True):
            segment["evaluate"] = i in reported
        share = sub.delta_round is not None
        need = {cps[i] for i in needed_states(chosen, cross, share)} | {cps[-1]}
        owned: set[str] = set()
        if share:  # checkpoint 0 is rebuilt from the round's weights
            table["init_claimed"] = cps[0]
            table["share"] = self._share(sub)
            owned.add(table["share"]["weights"])
        replay = await self._replay(sub, table, need, bound, owned)
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

    async def _state_bytes(self, job: Job, spec: dict[str, Any]) -> int:
        """The most bytes one training state of a unit of `job` may have."""
        if job.id not in self._state_limits:
            from training.spec.job import parse_spec

            data = self.ctx.blobs.path(job.data_sha256) if job.data_sha256 else None
            _, bound = await trio.to_thread.run_sync(
                _sizes, parse_spec(spec), spec, data, self.ctx.blobs.path
            )
            self._state_limits[job.id] = bound
        return self._state_limits[job.id]

    async def _steps(self, sub: Submitted) -> tuple[list[int], int]:
        """The steps of the unit's checkpoints (a share's: its H inner steps), and the
        most bytes one of its checkpoints may have."""
        from training.evidence.checkpoints import checkpoint_steps
        from training.spec.job import parse_spec

        parsed = parse_spec(sub.spec)
        job = sub.job
        data = self.ctx.blobs.path(job.data_sha256) if job.data_sha256 else None
        total, bound = await trio.to_thread.run_sync(
            _sizes, parsed, sub.spec, data, self.ctx.blobs.path
        )
        if sub.delta_round is not None and parsed.elastic is not None:
            return checkpoint_steps(parsed.elastic.inner_steps, parsed.trust.checkpoints), bound
        steps = checkpoint_steps(total, parsed.trust.checkpoints, parsed.optim.validate_every)
        return steps, bound

    def _share(self, sub: Submitted) -> dict[str, Any]:
        """The replay's `share` table: which round and slot, from which weights."""
        from node.work.jobs import RoundStore

        started = RoundStore(self.ctx.jobs.db).get(sub.job.id, sub.delta_round)
        if started is None:
            raise RuntimeError(f"round {sub.delta_round} of this job is unknown here")
        return {
            "job_id": sub.job.id,
            "round": sub.delta_round,
            "slot": sub.unit.slot,
            "weights": started.weights_sha256,
        }

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
        ctx = self.ctx
        self._fetched.hold(need)
        try:
            await fetch_granted(
                ctx,
                sub.peer,
                sub.grant,
                sub.result.weights_grant,
                sub.key,
                sorted(need),
                bound,
                relay_blob_bytes(sub.spec),
            )
            shas = {*sub.job.data_blobs, *need, *owned}
            blobs = {s: str(ctx.blobs.path(s)) for s in shas if ctx.blobs.has(s)}
            folder = ctx.unit_dir(sub.unit.unit_id)
            folder.mkdir(parents=True, exist_ok=True)
            out = folder / "replayed-weights.safetensors"
            request = self._runner_request(sub.spec, blobs, out).replaying(table)
            return await ctx.run_owner_task(
                request, sub.unit.unit_id, sub.job.max_hours, lambda e: None
            )
        finally:
            self._fetched.release(need)


def _claimed(result: Result, index: int) -> str:
    return result.weights_sha256 if index < 0 else result.checkpoints[index]


def _reported_segments(
    sub: Submitted, steps: list[int], chosen: list[int], rng: random.Random, one_more: bool
) -> set[int]:
    """The segments whose end a trial reported a validation value at, among those
    chosen, plus (`one_more`: every state was kept) one more drawn among all of them:
    the reports checked by replay."""
    if sub.metric not in ("val_loss", "val_accuracy"):
        return set()  # a batch loss (train_loss) is not re-evaluated
    ending = {steps[i + 1]: i for i in range(len(steps) - 1)}
    reported = [ending[s] for s in sub.reports if s in ending]
    if not reported:
        return set()
    extra = {rng.choice(reported)} if one_more else set()
    return {i for i in chosen if i in reported} | extra


def tolerance_of(spec: dict[str, Any]) -> float:
    """How far apart two classes' states of this job may be (relative L2)."""
    bf16 = spec.get("optim", {}).get("precision") == "bf16"
    return BF16_TOLERANCE if bf16 else TOLERANCE


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


def _sizes(
    parsed: Any, spec: dict[str, Any], data: Path | None, locate: Callable[[str], Path]
) -> tuple[int, int]:
    """The spec's steps, and the most bytes one of its checkpoints may have: the
    weights, at most two optimizer moments of them, and the RNG and headers."""
    from training.budget import validate_for_submit
    from training.evidence.result_check import expected_tensors, max_weights_bytes

    weights = max_weights_bytes(expected_tensors(spec, data, locate))
    return validate_for_submit(parsed, data).total_steps, 3 * weights + (1 << 20)


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
