"""What a replay is compared with: the worker's commitments, what it returned (its
weights, or a round's delta) and a trial's reported values. Pure functions over the
runner's replay output (`training.evidence.replay`), so that the spot check, the
replica bisection and the benchmarks compare alike."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from node.work.trust.replays import TOLERANCE
from protocol.work import Result
from training.evidence.bounds import STEP_RATIO

START = (
    "the unit's start (the spec's initial state; a share's: the round's weights; a "
    "resumed unit's: the state it resumed from)"
)


@dataclass(frozen=True)
class Failure:
    index: int  # the checkpoint that failed (-1: the weights)
    start: int
    end: int
    replayed: str
    reason: str


def with_early(
    replay: dict[str, Any],
    rest: list[int],
    early: dict[int, tuple[str, float, float]],
    chosen: list[int],
) -> dict[str, Any]:
    """The result's replay (of `rest`) with the segments replayed while the worker
    trained (`early`: end, distance, step ratio), in the order of `chosen`, as one
    replay of them all."""
    at = {i: j for j, i in enumerate(rest)}
    merged = {**replay, "ends": [], "distances": [], "step_ratios": [], "evaluations": []}
    distances = replay["distances"] or [0.0] * len(rest)
    ratios = replay.get("step_ratios") or [0.0] * len(rest)
    for i in chosen:
        if i in at:
            j = at[i]
            merged["ends"].append(replay["ends"][j])
            merged["distances"].append(distances[j])
            merged["step_ratios"].append(ratios[j])
            merged["evaluations"].append(replay["evaluations"][j])
        else:
            merged["ends"].append(early[i][0])
            merged["distances"].append(early[i][1])
            merged["step_ratios"].append(early[i][2])
            merged["evaluations"].append({})
    return merged


def agrees(distance: float, ratio: float, tolerance: float, kinds: bool) -> bool:
    """A replay across determinism classes agrees with the claim: within `tolerance`
    (relative L2), or, across device kinds (`kinds`: a CPU and a GPU), within
    `STEP_RATIO` of the replay's own last step, tensor by tensor."""
    return distance <= tolerance or (kinds and ratio <= STEP_RATIO)


def claimed_hash(result: Result, index: int) -> str:
    return result.weights_sha256 if index < 0 else result.checkpoints[index]


def compare_reports(
    metric: str,
    reports: dict[int, float],
    replay: dict[str, Any],
    steps: list[int],
    chosen: list[int],
    cross: bool,
    tolerance: float,
) -> Failure | None:
    """A reported value against the replayed state's evaluation at that step: equal
    within a class, within `tolerance` (relative) across classes."""
    for j, i in enumerate(chosen):
        found = replay["evaluations"][j].get(metric)
        claimed = reports.get(steps[i + 1])
        if found is None or claimed is None:
            continue
        off = abs(found - claimed) / max(abs(found), 1e-12)
        if (off > tolerance) if cross else (found != claimed):
            return Failure(
                i + 1,
                steps[i],
                steps[i + 1],
                replay["ends"][j],
                f"the trial reported {metric} {claimed:.6g} at step {steps[i + 1]}; "
                f"the replayed state gives {found:.6g}",
            )
    return None


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
    start: bool = True,
    end: bool = True,
    kinds: bool = False,
) -> Failure | None:
    """The first disagreement between the replay and the worker's commitments (its
    checkpoint 0 unless not `start`, what it returned unless not `end`); across device
    kinds (`kinds`) a segment may be off by a share of a step (`agrees`)."""
    if start and cross and replay.get("init_distance", math.inf) > tolerance:
        off = f"{replay.get('init_distance', math.inf):.3g}"
        return Failure(0, 0, 0, replay["init_sha256"], f"checkpoint 0 is {off} off {START}")
    if start and not cross and replay.get("init_sha256") != cps[0]:
        return Failure(0, 0, 0, replay["init_sha256"], f"checkpoint 0 is not {START}")
    ratios = replay.get("step_ratios") or [math.inf] * len(chosen)
    for j, i in enumerate(chosen):
        if cross:
            ok = agrees(replay["distances"][j], ratios[j], tolerance, kinds)
        else:
            ok = replay["ends"][j] == cps[i + 1]
        if not ok:
            how = ""
            if cross:
                how = f" (relative distance {replay['distances'][j]:.3g}"
                how += f", {ratios[j]:.3g} of its last step)" if kinds else ")"
            return Failure(
                i + 1,
                steps[i],
                steps[i + 1],
                replay["ends"][j],
                f"steps {steps[i]}..{steps[i + 1]} replayed do not give checkpoint {i + 1}{how}",
            )
    if end and replay.get("weights_sha256") != weights_sha256:
        return Failure(
            -1,
            steps[-1],
            steps[-1],
            replay.get("weights_sha256", "0" * 64),
            "what it returned (weights, or a round's delta) is not built from its last checkpoint",
        )
    return None
