"""Offering one unit to one peer: the sealed work package and the peer's answer.

The package (spec, blob hashes, a blob grant and the unit's own key) is sealed to
the worker with crypto_box and signed by the owner, so only that worker can read it
and it cannot be replayed to another. What the answer means is the placement's
business (`placement.py`); this module only builds, sends and reads.
"""

from __future__ import annotations

import time
from typing import Any

from node.work.blobs import issue_grant
from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from protocol import ProtocolError, encode, open_envelope, public_key_from_peer_id, seal
from protocol.crypto import seal_to
from protocol.names import TASK_PROTOCOL
from protocol.rounds import RoundShare
from protocol.work import WORK_LIMITS, OfferReply, WorkOffer, WorkPackage

GRANT_SLACK_S = 3600.0  # a grant outlives the unit's max_hours by this much


def build_offer(
    ctx: WorkContext,
    job: Job,
    unit: Unit,
    key: bytes,
    share: RoundShare | None = None,
    spec: dict[str, Any] | None = None,
) -> bytes:
    """The signed `WorkOffer` for `unit`, its package sealed to the unit's worker; a
    share of an elastic round adds the round's global weights to the blobs, a sweep's
    trial sends its own `spec` instead of the job's."""
    peer = unit.worker
    blobs = [*job.data_blobs, *([share.weights_sha256] if share is not None else [])]
    max_bytes = max((ctx.blobs.size(s) for s in blobs), default=0)
    grant = (
        issue_grant(
            ctx,
            job.id,
            unit.unit_id,
            peer,
            blobs,
            max_bytes,
            job.max_hours * 3600 + GRANT_SLACK_S,
        )
        if blobs
        else b""  # built-in data sets need no blobs
    )
    package = WorkPackage(
        job.id,
        unit.unit_id,
        encode(spec if spec is not None else job.spec),
        blobs,
        grant,
        key,
        job.max_hours,
        ctx.lease_s,
        share,
    )
    sealed = seal_to(
        public_key_from_peer_id(peer),
        ctx.identity.signing_key,
        seal(package, ctx.identity.signing_key),
    )
    return seal(
        WorkOffer(job.id, unit.unit_id, peer, sealed, time.time()), ctx.identity.signing_key
    )


async def send_offer(
    ctx: WorkContext,
    job: Job,
    unit: Unit,
    key: bytes,
    share: RoundShare | None = None,
    spec: dict[str, Any] | None = None,
) -> OfferReply:
    """Offer `unit` to its worker. A peer that cannot be reached or answers nonsense
    counts as a transient decline: it says nothing about the job."""
    offer = build_offer(ctx, job, unit, key, share, spec)
    try:
        raw = await ctx.host.request(unit.worker, TASK_PROTOCOL, offer, WORK_LIMITS.max_bytes)
        reply = open_envelope(
            raw, OfferReply, expected_signer=unit.worker, limits=WORK_LIMITS
        ).message
        if (reply.job_id, reply.unit_id) != (job.id, unit.unit_id):
            raise ProtocolError("the reply names another job or unit")
    except Exception as exc:  # unreachable or garbled: not a refusal of this job
        return OfferReply(job.id, unit.unit_id, False, f"offer failed: {exc}"[:1000], True)
    return reply


async def offer_if_fit(
    ctx: WorkContext,
    job: Job,
    unit: Unit,
    key: bytes,
    share: RoundShare | None = None,
    spec: dict[str, Any] | None = None,
) -> OfferReply:
    """Late binding: a worker whose ad is not fresh is probed first, and one that is
    gone, or busy or paused now, gets no offer (a transient decline)."""
    if ctx.finder is not None and not await ctx.finder.still_fits(
        unit.worker, job.spec.get("requirements", {})
    ):
        reason = f"{unit.worker} did not answer a probe, or cannot take work now"
        return OfferReply(job.id, unit.unit_id, False, reason, True)
    return await send_offer(ctx, job, unit, key, share, spec)
