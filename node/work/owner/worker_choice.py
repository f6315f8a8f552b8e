"""Choosing a worker for a job: requirements, the worker's policy, throughput, load.

A pure function of the peer table and this node's own ad, so it is easy to test and
the reason a job stays queued can be shown to the user as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.net.peers import PeerEntry, free_tflops, unfit_reason
from protocol import CapacityAd

SELF = "self"


@dataclass(frozen=True)
class Choice:
    worker: str | None  # a peer id, SELF to train here, or None to stay queued
    reason: str


def _rank(ad: CapacityAd, requirements: dict[str, Any], trusted: frozenset[str]) -> tuple:
    has_gpu = any(g.kind == "cuda" for g in ad.gpus)
    prefer_gpu = requirements.get("gpu", "preferred") == "preferred"
    return (
        has_gpu if prefer_gpu else True,
        ad.peer_id in trusted,
        free_tflops(ad),
        ad.peer_id,
    )


def choose_worker(
    requirements: dict[str, Any],
    placement: str,
    peers: list[PeerEntry],
    own: CapacityAd,
    excluded: set[str],
    trusted: set[str] | frozenset[str] = frozenset(),
    busy: set[str] | frozenset[str] = frozenset(),
) -> Choice:
    """Peers first; this node only when none fits (and its policy allows) or when the
    spec asks for `placement = "local"`. Among fitting peers, GPUs first (when the
    job prefers one), then peers past their probation here (`trusted`), then free
    throughput. `busy` peers (each declined some job's offer for now) are part of
    `excluded`, and say so in the reason."""
    if placement == "local":
        return Choice(SELF, "the spec asks for placement = local")
    reasons = []
    candidates = []
    for entry in peers:
        ad = entry.ad
        why = (
            "stale (not heard from since restart)"
            if entry.stale
            else "declined another job's offer for now (busy, paused, unreachable)"
            if ad.peer_id in busy
            else "declined or lost this job before"
            if ad.peer_id in excluded
            else unfit_reason(ad, requirements)
        )
        if why is None:
            candidates.append(ad)
        else:
            reasons.append(f"{ad.peer_id[-6:]}: {why}")
    if candidates:
        best = max(candidates, key=lambda ad: _rank(ad, requirements, frozenset(trusted)))
        return Choice(best.peer_id, f"{len(candidates)} of {len(peers)} peers fit")
    own_reason = unfit_reason(own, requirements)
    if own_reason is None and SELF not in excluded:
        return Choice(SELF, "no peer fits; training on this node" + _detail(reasons, peers))
    detail = _detail(reasons, peers) or " (no peers known yet)"
    return Choice(None, f"no peer fits{detail}; this node: {own_reason or 'tried already'}")


def _detail(reasons: list[str], peers: list[PeerEntry]) -> str:
    if not peers:
        return ""
    return f" ({len(peers)} known: {'; '.join(reasons[:5])})"
