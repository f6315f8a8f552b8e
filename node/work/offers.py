"""The offer exchange, both ends: the owner offers one unit to one peer, the worker
checks the offer and answers.

    owner  -> worker  `WorkOffer` on `TASK_PROTOCOL`: the `WorkPackage` (spec, blob
                      hashes, a blob grant, the unit's own key) sealed to the worker
                      with crypto_box and signed by the owner, so only that worker can
                      read it and it cannot be replayed to another
    worker -> owner   `OfferReply`: accepted, or the reason it declines and whether
                      that is for now (`transient`: busy, paused, unreachable) or for
                      this job (its policy or the job's requirements)

The owner's end builds, sends and reads (what an answer means is placement's:
`node/work/owner/placement.py`). The worker's end checks, in this order: the offer is
for this node (`check_addressed`); the volunteer's policy towards this owner now
(accepting, deny and allow lists, pauses, room, transfer caps: `check_policy`), before
any cryptography, so a busy or unwilling node declines at the cost of one signature;
the package opens and matches the offer; the job's hours; the spec validates;
the job's requirements fit this machine; the blob grant is this node's and its
download fits the per-unit cap and the free disk; the volunteer's disk guards hold
(`check_disk`). Each refusal is a `Declined`.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.work.blobs import issue_grant
from node.work.context import WorkContext
from node.work.jobs import Job, Unit, sharded
from protocol import (
    ProtocolError,
    decode,
    encode,
    open_envelope,
    public_key_from_peer_id,
    seal,
)
from protocol.blobs import BlobGrant
from protocol.crypto import open_from, seal_to
from protocol.ids import is_id
from protocol.names import TASK_PROTOCOL
from protocol.rounds import RoundShare
from protocol.work import WORK_LIMITS, OfferReply, ResumeFrom, WorkOffer, WorkPackage

GRANT_SLACK_S = 3600.0  # a grant outlives the unit's max_hours by this much
NO_ID = "0" * 16  # the ids of a reply to an offer whose own ids could not be read


def unit_data(job: Job, share: RoundShare | None) -> list[str]:
    """The job's blobs a unit fetches: of a sharded data set, a share takes only its
    slot's shards (`training.spec.shards.shards_of_slot`), about 1/W of the data."""
    if share is None or not sharded(job.spec):
        return [*job.data_blobs]
    from training.spec.shards import shards_of_slot

    shas = job.data_shas
    mine = {shas[k] for k in shards_of_slot(len(shas), job.spec["elastic"]["workers"], share.slot)}
    return [sha for sha in job.data_blobs if sha not in shas or sha in mine]


def build_offer(
    ctx: WorkContext,
    job: Job,
    unit: Unit,
    key: bytes,
    share: RoundShare | None = None,
    spec: dict[str, Any] | None = None,
) -> bytes:
    """The signed `WorkOffer` for `unit`, its package sealed to the unit's worker; a
    share of an elastic round adds the global weights it starts from (and the update
    that gives them from the round before's, and an eager start's delta) to the
    blobs, a unit
    that resumes a lost one's state adds that state, a sweep's trial sends its own
    `spec` instead of the job's."""
    peer = unit.worker
    resume = ResumeFrom(unit.resume_sha256, unit.resume_step) if unit.resume_sha256 else None
    blobs = [*unit_data(job, share), *([share.weights_sha256] if share is not None else [])]
    if share is not None:
        blobs += [sha for sha in (share.update_sha256, share.start_delta_sha256) if sha]
    blobs += [resume.state_sha256] if resume is not None else []
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
        ctx.limits.lease_s,
        share,
        resume,
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
    count_load: bool = True,
) -> OfferReply:
    """Late binding: a worker whose ad is not fresh is probed first, and one that is
    gone, or busy (unless not `count_load`) or paused now, gets no offer (a transient
    decline)."""
    if ctx.finder is not None and not await ctx.finder.still_fits(
        unit.worker, job.spec.get("requirements", {}), count_load
    ):
        reason = f"{unit.worker} did not answer a probe, or cannot take work now"
        return OfferReply(job.id, unit.unit_id, False, reason, True)
    return await send_offer(ctx, job, unit, key, share, spec)


# -- the worker's end ------------------------------------------------------------------


class Declined(Exception):
    """An offer this node will not take; the message is sent back as the reason."""

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.transient = transient


def check_addressed(ctx: WorkContext, offer: WorkOffer) -> None:
    if offer.worker != ctx.peer_id:
        raise Declined("the offer is addressed to another node")


def open_package(ctx: WorkContext, peer: str, offer: WorkOffer) -> WorkPackage:
    """The package inside `peer`'s offer (one `check_addressed` passed), when the
    package, sealed to this node and signed by `peer`, matches the offer."""
    try:
        inner = open_from(public_key_from_peer_id(peer), ctx.identity.signing_key, offer.sealed)
    except ProtocolError as exc:
        raise Declined(f"cannot open the package: not sealed to this node ({exc})") from exc
    package = open_envelope(inner, WorkPackage, expected_signer=peer, limits=WORK_LIMITS).message
    if (package.job_id, package.unit_id) != (offer.job_id, offer.unit_id):
        raise Declined("the package does not match the offer")
    return package


def check_offer(
    ctx: WorkContext,
    owner: str,
    package: WorkPackage,
    validate_spec: Callable[[dict[str, Any]], dict[str, Any]],
) -> tuple[dict[str, Any], BlobGrant | None]:
    """The unit's validated spec and blob grant, when this node takes it now (after
    `check_policy`)."""
    max_hours = ctx.policy().max_job_hours
    if package.max_hours > max_hours:
        raise Declined(
            f"job may run {package.max_hours:g} h; this node takes up to {max_hours:g} h"
        )
    try:
        spec = validate_spec(decode(package.spec, WORK_LIMITS))
    except ValueError as exc:
        raise Declined(f"invalid job spec: {exc}") from exc
    check_requirements(ctx, spec)
    grant = None
    if package.blobs:
        grant = open_envelope(
            package.blob_grant, BlobGrant, expected_signer=owner, limits=WORK_LIMITS
        ).message
        if grant.grantee != ctx.peer_id or sorted(grant.blobs) != sorted(package.blobs):
            raise Declined("the blob grant does not match the package")
        check_download(ctx, grant.max_bytes * len(package.blobs))
    check_disk(ctx, grant.max_bytes * len(package.blobs) if grant else 0)
    return spec, grant


def check_policy(ctx: WorkContext, owner: str) -> None:
    """The volunteer's policy and preferences take work from `owner` now."""
    policy = ctx.policy()
    if not policy.accepting:
        raise Declined("this node is paused (not accepting work)")
    preferences = ctx.preferences()
    if owner in preferences.deny_owners:
        raise Declined("this node does not take work from you (deny list)")
    if preferences.allow_owners and owner not in preferences.allow_owners:
        raise Declined("this node only takes work from its allow list")
    why = ctx.paused_because()
    if why:
        raise Declined(f"this node does not train now: {why}", transient=True)
    if not ctx.has_room():
        raise Declined(f"busy: {len(ctx.units_here)} unit(s) training here", transient=True)
    used = ctx.transfer_cap_used()
    if used:
        raise Declined(f"this node moves no more data today: {used}", transient=True)


def check_requirements(ctx: WorkContext, spec: dict[str, Any]) -> None:
    """The job's GPU requirements fit this machine and the share of it offered."""
    req = spec.get("requirements", {})
    gpus = [g for g in ctx.own_ad().gpus if g.kind == "cuda"]
    if req.get("gpu") == "required" and not gpus:
        raise Declined("the job requires a GPU; this node has none")
    need_mb = float(req.get("min_gpu_memory_gb", 0)) * 1024
    share = ctx.policy().max_gpu_memory_share
    if gpus and need_mb and not any(g.memory_total_mb * share >= need_mb for g in gpus):
        raise Declined(
            f"the job needs {need_mb / 1024:g} GB of GPU memory; this node "
            f"offers {share:.0%} of its GPU memory"
        )


def check_download(ctx: WorkContext, total: int) -> None:
    """A unit may make this node fetch at most its per-unit cap, and never more than
    half the disk's free space."""
    cap = ctx.limits.max_unit_download_bytes
    if total > cap:
        raise Declined(
            f"the unit's data may be {total / 2**20:.0f} MiB; this node fetches at "
            f"most {cap / 2**20:.0f} MiB per unit"
        )
    free = shutil.disk_usage(ctx.data_dir).free
    if total > free // 2:
        raise Declined(
            f"the unit's data may be {total / 2**20:.0f} MiB; this node has "
            f"{free / 2**20:.0f} MiB of disk free",
            transient=True,
        )


def check_disk(ctx: WorkContext, incoming: int) -> None:
    """The volunteer's disk guards: all units' folders together stay within
    `max_units_disk_gb`, and `min_free_disk_gb` stays free, counting what this unit
    would fetch. For now: a unit that ends frees its folder."""
    prefs = ctx.preferences()
    gib = 2**30
    if prefs.max_units_disk_gb:
        used = folder_bytes(ctx.data_dir / "units")
        if used + incoming > prefs.max_units_disk_gb * gib:
            raise Declined(
                f"its units' folders hold {used / gib:.1f} GB (with this unit's data "
                f"{(used + incoming) / gib:.1f} GB); this node keeps them within "
                f"{prefs.max_units_disk_gb:g} GB",
                transient=True,
            )
    if prefs.min_free_disk_gb:
        free = shutil.disk_usage(ctx.data_dir).free
        if free - incoming < prefs.min_free_disk_gb * gib:
            raise Declined(
                f"{free / gib:.1f} GB of disk free; this node keeps "
                f"{prefs.min_free_disk_gb:g} GB free",
                transient=True,
            )


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (0 when it does not exist)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):  # removed while we looked
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def reply(
    ctx: WorkContext, job_id: str, unit_id: str, accepted: bool, reason: str, transient: bool
) -> bytes:
    """The worker's signed answer; a malformed offer's ids are not echoed."""
    answer = OfferReply(
        job_id if is_id(job_id) else NO_ID,
        unit_id if is_id(unit_id) else NO_ID,
        accepted,
        reason[:1000],
        transient,
    )
    return seal(answer, ctx.identity.signing_key)
