"""A result's weights (an elastic share's delta) fetched under the worker's grant and
checked against the job's model plan before anything of the result is accepted.

Checked: the grant names exactly the result's files and this owner; the size is at
most the plan's bound before a byte is fetched; the file hashes to the result's
sha256; its safetensors header matches the plan (read in the daemon); its values are
finite (checked in a subprocess, since the daemon parses no untrusted bulk data). A
delta is checked as a `RoundDelta` of its round instead. What fails is not kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.work.blobs import fetch_granted
from node.work.context import WorkContext
from node.work.jobs import Job, RoundStore
from node.work.run import check_forked
from node.work.trust import model_shapes
from protocol import ProtocolError, open_envelope
from protocol.blobs import BlobGrant
from protocol.rounds import delta_limits
from protocol.work import WORK_LIMITS, Result
from training.evidence.result_check import (
    WeightsRejected,
    check_delta_file,
    check_weights_header,
    check_weights_values,
    max_weights_bytes,
)
from training.spec.job import elastic_of_plain, relay_blob_bytes


@dataclass(frozen=True)
class Fetched:
    had: bool  # the weights were stored here before
    path: str  # how they came ("" when they did not need to)

    @property
    def via(self) -> str:
        """For the timeline: " (<path>)", or nothing when it came the usual way."""
        return f" ({self.path})" if self.path and self.path != "direct channel" else ""


async def fetch_and_check(
    ctx: WorkContext,
    job: Job,
    spec: dict[str, Any],
    peer: str,
    result: Result,
    delta_round: int | None,
    start_delta: str = "",
    taken: str = "",
) -> Fetched:
    """Fetch the weights (a round's share: its delta of `delta_round`, from that
    round's weights, or from the round before's for an eager start, `start_delta`,
    or from those it was told to take on its way, `taken`)
    under the worker's grant, at most the plan's size, and check them; what fails is
    not kept."""
    grant = weights_grant(ctx, peer, result)
    key = ctx.grant_keys.get((result.job_id, result.unit_id))
    if key is None:
        raise ProtocolError("no key for this unit (it ended)")
    data = job.data_files(ctx.blobs.path)
    expected, numel = await model_shapes(ctx, spec, job.data_blobs, data)
    if delta_round is not None:
        bound = delta_limits(numel).max_bytes
    else:
        bound = max_weights_bytes(expected)
    what = "weights" if delta_round is None else "delta"
    if result.weights_size > bound:
        raise WeightsRejected(
            f"{what} of {result.weights_size} bytes; this model's are at most {bound}"
        )
    had = ctx.blobs.has(result.weights_sha256)
    paths = await fetch_granted(
        ctx,
        peer,
        grant,
        result.weights_grant,
        key,
        [result.weights_sha256],
        bound,
        relay_blob_bytes(spec),
    )
    path = ctx.blobs.path(result.weights_sha256)
    try:
        if delta_round is not None:
            if start_delta and elastic_of_plain(spec).takes_weights and not taken:
                raise WeightsRejected("the share was never told its round's weights to take")
            started = RoundStore(ctx.jobs.db).delta_base(job.id, delta_round, start_delta, taken)
            if not started:
                raise WeightsRejected(f"round {delta_round} of this job is unknown here")
            await check_delta_file(
                path,
                numel,
                job.id,
                delta_round,
                started,
                str(job.spec["elastic"]["compression"]),
                forked=check_forked,
            )
        else:
            check_weights_header(path, expected)
            await check_weights_values(path, forked=check_forked)
    except Exception:
        if not had:  # what was just fetched for this result is not kept
            ctx.blobs.remove(result.weights_sha256)
        raise
    return Fetched(had, paths.get(result.weights_sha256, ""))


def weights_grant(ctx: WorkContext, peer: str, result: Result) -> BlobGrant:
    """The worker's grant for its weights and the checkpoints it still holds (those
    its owner let go of while it trained are gone), as the result names them."""
    grant = open_envelope(
        result.weights_grant, BlobGrant, expected_signer=peer, limits=WORK_LIMITS
    ).message
    if (
        grant.grantee != ctx.peer_id
        or grant.blobs[:1] != [result.weights_sha256]
        or not set(grant.blobs[1:]) <= set(result.checkpoints)
        or (grant.job_id, grant.unit_id) != (result.job_id, result.unit_id)
    ):
        raise ProtocolError("the weights grant does not match the result")
    return grant
