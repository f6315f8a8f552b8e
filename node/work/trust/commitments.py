"""Checkpoint commitments, both ends: the worker commits to each training state as it
makes it, the owner decides at once whether the segment that state ends is replayed.

    worker -> owner  `Progress.commitments` (from index `commit_from`): the sha256 of
                     each checkpoint as it is written, and `evidence_grant`, a grant
                     for the states the owner asked to keep
    owner -> worker  `ProgressAck`: how many commitments it holds (`have`), the states
                     to keep until it fetched them (`keep`), those that may go (`drop`)

Segment i (checkpoint i to i + 1) is decided once commitment i + 1 is in, by a draw
of this node's own random source: chosen with probability p, each segment on its
own. The worker is bound to both ends before the draw, so it cannot know in advance
which segment is replayed; and since every draw is independent, the segments revealed
unchosen tell it nothing of the next ones (with "n of S", the last ones would be
known safe once n were revealed). p is the spot-check budget (fewer for a trusted
peer: `segments_to_check`) over the unit's segments. The owner fetches a chosen
segment's start (and, across determinism classes, its end) while training goes on,
then lets it go; every other state goes when decided. So a worker holds the state
still undecided, the newest, and those waiting for a fetch, instead of all of them.
At the result the owner decides what is still open and replays the chosen segments
(`spot_checks.py`); a result whose chain differs from its commitments fails.

A job with replicas keeps every state (replicas compare whole chains and replay the
first segment where they part, which can be any).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from node.work.trust.reputation import Reputation, segments_to_check
from protocol import ProtocolError, open_envelope
from protocol.blobs import BlobGrant
from protocol.work import WORK_LIMITS, Progress, ProgressAck

log = logging.getLogger(__name__)

FETCHES_QUEUED = 64
MAX_HELD = 3  # training states a worker holds for one unit, at most


def replay_chance(spec: dict[str, Any], streak: int) -> float:
    """The probability that any one segment of a unit of `spec` is replayed: its
    budget's share of the segments, fewer for a peer with a `streak` of valid results;
    0 when the job keeps every state (no checks, or replicas)."""
    trust = spec.get("trust", {})
    segments = int(trust.get("checkpoints", 100))
    budget = float(trust.get("spot_check_budget", 0.1))
    if segments <= 0 or budget <= 0 or int(trust.get("replicas", 1)) > 1:
        return 0.0
    full = max(1, math.floor(budget * segments))
    return min(1.0, segments_to_check(full, streak) / segments)


@dataclass
class _Chain:
    """What the owner holds of one unit's commitments."""

    shas: list[str] = field(default_factory=list)
    decided: dict[int, bool] = field(default_factory=dict)  # segment -> chosen
    fetched: set[int] = field(default_factory=set)  # states in this node's blob store


class Commitments:
    """The owner's end: the chains heard in heartbeats, the draws, the fetches."""

    def __init__(
        self,
        ctx: WorkContext,
        reputation: Reputation,
        state_bytes: Callable[[Job, dict[str, Any]], Awaitable[int]],
        fetched: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self._reputation = reputation
        self._state_bytes = state_bytes  # the most bytes one of the unit's states has
        self._fetched = fetched  # a state fetched here, removed once no check needs it
        self._chains: dict[str, _Chain] = {}
        # kept in node.db as well: after a restart the owner draws no segment twice
        self._table = ctx.jobs.db["commitments"]
        if not self._table.exists():
            self._table.create({"unit_id": str, "chain": str}, pk="unit_id")
        self._send, self._queue = trio.open_memory_channel[tuple](FETCHES_QUEUED)
        self._fetching: set[tuple[str, int]] = set()

    def heard(self, job: Job, unit: Unit, spec: dict[str, Any], progress: Progress) -> ProgressAck:
        """Record the heartbeat's new commitments, decide the segments they close,
        and say what the worker keeps and drops; not ok when a commitment changed."""
        chain = self._chain(unit.unit_id)
        before = (len(chain.shas), len(chain.decided))
        start = progress.commit_from
        for offset, sha in enumerate(progress.commitments):
            index = start + offset
            if index < len(chain.shas) and chain.shas[index] != sha:
                return ProgressAck(False, f"commitment {index} changed")
            if index == len(chain.shas):
                chain.shas.append(sha)
        chance = replay_chance(spec, self._reputation.get(unit.worker).streak)
        if chance > 0:
            self._decide(chain, chance, len(chain.shas) - 1)
        keep, drop = self._answer(chain, unit.worker, chance)
        if (len(chain.shas), len(chain.decided)) != before:
            self._save(unit.unit_id, chain)
        if keep and progress.evidence_grant:
            self._queue_fetch(job, unit, spec, progress.evidence_grant, keep)
        return ProgressAck(True, "", len(chain.shas), tuple(keep), tuple(drop))

    def decide_all(self, unit: Unit, spec: dict[str, Any], shas: list[str]) -> list[int] | None:
        """At the result: the chosen segments of a chain whose commitments match
        `shas` (the open ones decided now), or None when the worker committed nothing
        (its result's chain is checked as a whole, chosen then)."""
        chain = self._chain(unit.unit_id)
        if not chain.shas:
            return None
        if chain.shas != shas[: len(chain.shas)]:
            raise ProtocolError("the result's checkpoints are not those it committed to")
        chain.shas = list(shas)
        chance = replay_chance(spec, self._reputation.get(unit.worker).streak)
        self._decide(chain, chance, len(shas) - 1)  # the last state closes segment S - 1
        return sorted(i for i, chosen in chain.decided.items() if chosen)

    def forget(self, unit_id: str) -> None:
        self._chains.pop(unit_id, None)
        self._table.delete_where("unit_id = ?", [unit_id])

    def _chain(self, unit_id: str) -> _Chain:
        if unit_id not in self._chains:
            rows = list(self._table.rows_where("unit_id = ?", [unit_id], limit=1))
            plain = json.loads(rows[0]["chain"]) if rows else {}
            self._chains[unit_id] = _Chain(
                list(plain.get("shas", [])),
                {int(k): bool(v) for k, v in plain.get("decided", {}).items()},
                set(plain.get("fetched", [])),
            )
        return self._chains[unit_id]

    def _save(self, unit_id: str, chain: _Chain) -> None:
        plain = {"shas": chain.shas, "decided": chain.decided, "fetched": sorted(chain.fetched)}
        self._table.upsert({"unit_id": unit_id, "chain": json.dumps(plain)}, pk="unit_id")

    async def run(self) -> None:
        """Fetch the kept states the workers grant, one unit's at a time."""
        async for job, unit, spec, grant_env, indices in self._queue:
            try:
                await self._fetch(job, unit, spec, grant_env, indices)
            except Exception as exc:  # the state stays kept: fetched with the result
                log.info("unit %s: kept states not fetched yet: %s", unit.unit_id, exc)
            finally:
                self._fetching -= {(unit.unit_id, i) for i in indices}

    def _decide(self, chain: _Chain, chance: float, closed: int) -> None:
        """Draw every segment up to `closed` (exclusive) not drawn yet."""
        rng = secrets.SystemRandom()
        for segment in range(closed):
            if segment not in chain.decided:
                chain.decided[segment] = chance > 0 and rng.random() < chance

    def _answer(self, chain: _Chain, worker: str, chance: float) -> tuple[list[int], list[int]]:
        """(states to keep, not fetched yet; states that may go)."""
        if chance <= 0:
            return [], []
        cross = self.ctx.peers.determinism_of(worker) != self.ctx.own_ad().determinism
        needed = {i for i, chosen in chain.decided.items() if chosen}
        if cross:  # across classes the replay is compared with the segment's end state
            needed |= {i + 1 for i in needed}
        keep = sorted(needed - chain.fetched)
        last = len(chain.shas) - 1  # the newest: the next segment's start, undecided
        # a state goes once the segment it starts is drawn (the one it ends was drawn
        # before) and no replay needs it, or once this node has it
        drop = [
            i for i in range(last) if i in chain.decided and (i not in needed or i in chain.fetched)
        ]
        return keep, drop

    def _queue_fetch(
        self, job: Job, unit: Unit, spec: dict[str, Any], grant_env: bytes, keep: list[int]
    ) -> None:
        wanted = [i for i in keep if (unit.unit_id, i) not in self._fetching]
        if not wanted:
            return
        try:
            self._send.send_nowait((job, unit, spec, grant_env, wanted))
        except trio.WouldBlock:
            return  # busy: these are fetched with the result instead
        self._fetching |= {(unit.unit_id, i) for i in wanted}

    async def _fetch(
        self, job: Job, unit: Unit, spec: dict[str, Any], grant_env: bytes, indices: list[int]
    ) -> None:
        chain = self._chains.get(unit.unit_id)
        key = self.ctx.grant_keys.get((job.id, unit.unit_id))
        if chain is None or key is None:
            return
        grant = open_envelope(
            grant_env, BlobGrant, expected_signer=unit.worker, limits=WORK_LIMITS
        ).message
        if (grant.grantee, grant.job_id, grant.unit_id) != (self.ctx.peer_id, job.id, unit.unit_id):
            raise ProtocolError("the evidence grant is for another unit or node")
        granted = [i for i in indices if chain.shas[i] in grant.blobs]  # the rest: next time
        bound = await self._state_bytes(job, spec)
        fresh = [chain.shas[i] for i in granted if not self.ctx.blobs.has(chain.shas[i])]
        await fetch_granted(self.ctx, unit.worker, grant, grant_env, key, fresh, bound, bound)
        for sha in fresh:
            self._fetched(sha)
        chain.fetched |= set(granted)
        self._save(unit.unit_id, chain)


@dataclass
class HeldStates:
    """The worker's end, for one unit: the states it committed to and still holds."""

    folder: Path  # where the runner writes them
    shas: list[str] = field(default_factory=list)
    files: dict[int, Path] = field(default_factory=dict)  # written, not yet stored
    stored: set[int] = field(default_factory=set)  # kept: in the blob store, granted
    dropped: set[int] = field(default_factory=set)
    have: int = 0  # commitments the owner acknowledged
    deciding: bool = False  # the owner decides on states (else it keeps them all)

    def written(self, event: dict[str, Any]) -> None:
        """The runner's `checkpoint` event: a state to commit to."""
        index, sha = int(event["index"]), str(event["sha256"])
        if index == len(self.shas):
            self.shas.append(sha)
            self.files[index] = self.folder / str(event["file"])

    def unsent(self) -> tuple[int, list[str]]:
        """(`commit_from`, `commitments`) for the next heartbeat."""
        return self.have, self.shas[self.have :]

    def apply(
        self, ack: ProgressAck, store: Callable[[Path], str], release: Callable[[str], None]
    ) -> bool:
        """Act on the owner's decisions (`store` puts a state in the blob store where
        the owner's grant reaches it); True when what is granted changed."""
        self.have = min(ack.have, len(self.shas))  # the owner's count: it may have lost some
        self.deciding = self.deciding or bool(ack.keep or ack.drop)
        changed = False
        for index in ack.keep:
            path = self.files.pop(index, None)
            if path is not None and path.is_file():
                store(path)  # a copy: the runner's file goes
                path.unlink()
                self.stored.add(index)
                changed = True
        for index in ack.drop:
            if index >= len(self.shas) - 1 or index in self.dropped:
                continue  # the newest state is never dropped: it starts the next segment
            self.dropped.add(index)
            path = self.files.pop(index, None)
            if path is not None:
                path.unlink(missing_ok=True)
            if index in self.stored:
                self.stored.discard(index)
                release(self.shas[index])
                changed = True
        return changed

    def waiting(self) -> bool:
        """The runner waits while this many states are on disk undecided or unfetched:
        the newest, the one before it (its segment is drawn once the newest is
        committed) and one for the owner to fetch."""
        return self.deciding and len(self.files) + len(self.stored) >= MAX_HELD

    def kept(self) -> list[str]:
        """The states stored for the owner to fetch."""
        return [self.shas[i] for i in sorted(self.stored)]

    def remaining(self) -> list[Path]:
        """The states still in the runner's folder (stored with the result)."""
        return [p for p in self.files.values() if p.is_file()]
