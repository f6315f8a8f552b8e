"""A worker's result on its way to the owner: sent again while it fails in transit,
then the owner's receipt checked against what this node trained and countersigned
(`node.work.receipts` holds both ends of that exchange).

An owner that restarted, or a link that dropped, is retried with backoff for
`DELIVERY_DEADLINE_S`; any answer, a refusal too, ends the retries.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from node.work import receipts
from node.work.context import WorkContext
from node.work.jobs import data_shas, sharded
from protocol import MeshminerError, ProtocolError, open_envelope, seal
from protocol.names import RESULT_PROTOCOL
from protocol.receipts import NO_WEIGHTS_SHA256, partial_credit
from protocol.work import RESULT_BEING_CHECKED, WORK_LIMITS, ReceiptReply, Result, WorkPackage

log = logging.getLogger(__name__)
T = TypeVar("T")

RESULT_TIMEOUT_S = 900.0  # one result exchange (the owner fetches and checks the weights)
DELIVERY_DEADLINE_S = 1800.0  # retries of a result or receipt stop after this long
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 15.0


class Trained(Protocol):
    """What delivery reads of a unit this node trained (`heartbeats.RunningUnit`)."""

    owner: str
    package: WorkPackage
    spec: dict[str, Any]
    progress: dict[str, Any]


async def deliver(ctx: WorkContext, unit: Trained, result: Result) -> None:
    """Send the result (retrying what fails in transit) and countersign the receipt."""
    owner = unit.owner
    sealed = seal(result, ctx.identity.signing_key)

    async def send() -> ReceiptReply:
        raw = await ctx.host.request(
            owner, RESULT_PROTOCOL, sealed, WORK_LIMITS.max_bytes, timeout=RESULT_TIMEOUT_S
        )
        return open_envelope(raw, ReceiptReply, expected_signer=owner, limits=WORK_LIMITS).message

    what = f"result of unit {result.unit_id}"
    reply = await with_retries(ctx, send, owner, what)
    with trio.move_on_after(DELIVERY_DEADLINE_S):
        while reply is not None and reply.reason == RESULT_BEING_CHECKED:
            await trio.sleep(RETRY_FIRST_S)  # the owner checks our first copy
            reply = await with_retries(ctx, send, owner, what)
    if reply is None:
        return
    if not reply.accepted or not reply.receipt:
        log.info("unit %s: owner answered: %s", result.unit_id, reply.reason or "ok")
        return
    try:
        await _countersign(ctx, unit, result, reply.receipt)
    except (MeshminerError, ValueError) as exc:
        log.warning("unit %s: receipt from %s not countersigned: %s", result.unit_id, owner, exc)


async def _countersign(ctx: WorkContext, unit: Trained, result: Result, half: bytes) -> None:
    """Check the owner's receipt against our result and our own credit figure (a
    pruned trial's: the share of it for the steps before the stop; a resumed unit's:
    for the steps after its state), then hand it back countersigned."""
    issued = receipts.check_issued(ctx, unit.owner, result, half)
    data = package_data(unit.spec, unit.package.blobs, ctx.blobs.path)
    credit = await trio.to_thread.run_sync(ctx.credit_for, unit.spec, data)
    if issued.weights_sha256 == NO_WEIGHTS_SHA256:  # a pruned trial's share
        total = int(unit.progress.get("total_steps", 0))
        if not 0 < issued.steps <= result.steps or total <= 0:
            raise ProtocolError(
                f"a receipt for {issued.steps} steps; this node trained {result.steps}"
            )
        credit = partial_credit(credit, issued.steps, total)
    elif unit.package.resume is not None:  # resumed: the steps after its state
        total = int(unit.progress.get("total_steps", 0))
        credit = partial_credit(credit, total - unit.package.resume.step, total)
    await receipts.hand_back(ctx, unit.owner, result, half, credit, partial(with_retries, ctx))


async def with_retries(
    ctx: WorkContext,
    call: Callable[[], Awaitable[T]],
    peer: str,
    what: str,
    *,
    deadline_s: float = DELIVERY_DEADLINE_S,
    retry_on: tuple[type[Exception], ...] = (Exception,),
) -> T | None:
    """`await call()` until it answers, with backoff, for `deadline_s`; None when it
    never did. An answer of any kind (a refusal too) ends the retries, and so does an
    exception not in `retry_on` (it propagates)."""
    delay = RETRY_FIRST_S
    with trio.move_on_after(deadline_s):
        while True:
            try:
                return await call()
            except retry_on as exc:
                log.info("%s to %s failed (%s); again in %.0f s", what, peer, exc, delay)
            await trio.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)
            ctx.host.allow_redial(peer)
    log.warning("%s to %s: gave up after %.0f s", what, peer, deadline_s)
    return None


def package_data(spec: dict[str, Any], blobs: list[str], path: Callable[[str], Path]) -> Any:
    """The data files a package brought: the shards among its blobs, in shard order (a
    share's slot's), or its first blob, or None for a built-in data set."""
    if sharded(spec):
        return tuple(path(sha) for sha in data_shas(spec) if sha in blobs)
    return path(blobs[0]) if blobs else None
