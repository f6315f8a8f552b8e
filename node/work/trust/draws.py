"""The draws of spot checks: whether a unit's segments are drawn one by one as its
worker commits to them, the chance of each, and what a chosen one's replay reads.

Pure functions of the spec and a random source, so the owner's draws and the
benchmarks' (`benchmarks/trust.py`) are the same functions."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any

from node.work.trust.reputation import segments_to_check


def drawn_by_commitment(spec: dict[str, Any]) -> bool:
    """Whether a unit of `spec` is spot checked segment by segment (else a worker
    keeps every state until its result is settled)."""
    trust = spec.get("trust", {})
    return (
        int(trust.get("checkpoints", 100)) > 0
        and float(trust.get("spot_check_budget", 0.1)) > 0
        and int(trust.get("replicas", 1)) <= 1
    )


def replay_chance(spec: dict[str, Any], streak: int) -> float:
    """The probability that any one segment of a unit of `spec` is replayed: its
    budget's share of the segments, less for a peer with a `streak` of valid results."""
    if not drawn_by_commitment(spec):
        return 0.0
    trust = spec.get("trust", {})
    segments = int(trust.get("checkpoints", 100))
    full = max(1, math.floor(float(trust.get("spot_check_budget", 0.1)) * segments))
    return min(1.0, segments_to_check(full, streak) / segments)


def drawn(chance: float, rng: random.Random) -> bool:
    """One segment's draw: replayed with probability `chance`, on its own."""
    return chance > 0 and rng.random() < chance


def needed_states(chosen: Iterable[int], cross: bool, share: bool) -> set[int]:
    """The states a replay of the `chosen` segments reads from the worker: their
    starts; across determinism classes their ends as well (compared within a
    tolerance, not by hash), and a unit's checkpoint 0 (a share's is compared only
    when segment 0 is replayed). A unit's last state is read at the result."""
    needed = set(chosen)
    if cross:
        needed |= {i + 1 for i in needed}
        if not share:
            needed.add(0)
    return needed
