"""The global weights a worker holds for each elastic job it trains: the base the
owner's next `RoundUpdate` applies to (`training.elastic.updates`).

A worker that trained in round r holds round r's weights; round r+1's share names
them as its base, with the update that gives round r+1's weights from them, so the
worker fetches the update (about a quarter of the weights) and its runner rebuilds
the weights, checked against the round's hash. A worker that holds another round's
weights, or none (a newcomer, or after a restart), fetches the weights whole. Each job
keeps only its newest weights in the blob store.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from node.work.blobs import BlobStore
from protocol.rounds import RoundShare

log = logging.getLogger(__name__)


class HeldWeights:
    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs
        self._held: dict[str, str] = {}  # job id -> sha256 of its newest global weights
        self._stale: set[str] = set()  # weights held before, still read by a unit here

    def rebuilds(self, job_id: str, share: RoundShare) -> bool:
        """Whether this share's weights come as the update to weights held here."""
        base = share.base_sha256
        return (
            bool(share.update_sha256) and self._held.get(job_id) == base and self._blobs.has(base)
        )

    def to_fetch(self, blobs: list[str], share: RoundShare | None, rebuilds: bool) -> list[str]:
        """Of a package's `blobs`, those to fetch: the update or the weights, not both."""
        if share is None or not share.update_sha256:
            return list(blobs)
        skipped = share.weights_sha256 if rebuilds else share.update_sha256
        return [sha for sha in blobs if sha != skipped]

    def keep(self, job_id: str, sha: str, in_use: set[str]) -> None:
        """`sha` (in the blob store) is the newest weights of `job_id` held here; the
        ones before go once no unit here reads them (`in_use`: a share that took its
        round's weights on its way still names those it started from)."""
        before = self._held.get(job_id)
        self._held[job_id] = sha
        if before and before != sha:
            self._stale.add(before)
        for old in self._stale - in_use - set(self._held.values()):
            self._blobs.remove(old)
            self._stale.discard(old)

    async def store(self, path: Path, came_as: str, in_use: set[str], what: str) -> str:
        """Weights a runner rebuilt (from the update `came_as`, or fetched whole) into
        the blob store, `what` they are in the log; the blob they came as goes unless
        a unit here reads it. Returns their sha256."""
        size = self._blobs.size(came_as)
        sha = await trio.to_thread.run_sync(self._blobs.put_file, path)
        if came_as != sha and came_as not in in_use:
            self._blobs.remove(came_as)
        log.info("%s a %d-byte blob (the weights are %d bytes)", what, size, path.stat().st_size)
        return sha
