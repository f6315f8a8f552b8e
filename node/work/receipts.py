"""The receipt exchange, both ends: the owner issues, the worker countersigns.

    owner  -> worker  the half-signed receipt (`protocol.receipts.issue`), in the
                      `ReceiptReply` that answers the worker's result
    worker -> owner   the co-signed receipt on `RECEIPT_PROTOCOL`; answer: an ack

The owner signs the work done and the credit it computes from the spec (never the
worker's word); the worker checks that receipt against the result it sent and its own
credit figure before it countersigns. A receipt counts once both ledgers hold it: the
worker records its copy only after the owner acked, and both gossip it. Each end is
idempotent: the owner answers a result it already receipted with the same receipt
(`issued_for`), and acks a co-signed receipt it already recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from node.work.context import WorkContext
from node.work.jobs import Job, Unit
from protocol import MeshminerError, ProtocolError, seal
from protocol.names import RECEIPT_PROTOCOL
from protocol.receipts import (
    NO_WEIGHTS_SHA256,
    countersign,
    issue,
    open_cosigned,
    open_receipt,
    parse_cosigned,
)
from protocol.work import WORK_LIMITS, Receipt, Result, decode_ack, encode_ack

log = logging.getLogger(__name__)

# -- the owner's end -------------------------------------------------------------------


def half_signed(
    ctx: WorkContext,
    job_id: str,
    unit_id: str,
    worker: str,
    weights_sha256: str,
    steps: int,
    samples: int,
    metrics: dict[str, float],
    credit: float,
) -> bytes:
    """The owner's receipt for a unit's work, with the credit it grants."""
    receipt = Receipt(
        job_id,
        unit_id,
        ctx.peer_id,
        worker,
        weights_sha256,
        steps,
        samples,
        metrics,
        time.time(),
    )
    return issue(seal(receipt, ctx.identity.signing_key), credit, ctx.identity.signing_key)


def for_result(ctx: WorkContext, peer: str, result: Result, credit: float) -> bytes:
    """The half-signed receipt for `peer`'s checked `result`."""
    return half_signed(
        ctx,
        result.job_id,
        result.unit_id,
        peer,
        result.weights_sha256,
        result.steps,
        result.samples,
        dict(result.metrics),
        credit,
    )


def for_stopped(ctx: WorkContext, job: Job, unit: Unit, steps: int, credit: float) -> bytes:
    """The receipt, issued once, for a unit its job stopped early (a pruned trial):
    the steps before the stop, no weights."""
    issued = ctx.jobs.receipt(unit.unit_id)
    if issued is None:
        metrics = {"pruned_at_step": float(steps)}
        issued = half_signed(
            ctx, job.id, unit.unit_id, unit.worker, NO_WEIGHTS_SHA256, steps, 0, metrics, credit
        )
        ctx.jobs.add_receipt(unit.unit_id, job.id, "owner", ctx.peer_id, unit.worker, issued)
    return issued


def issued_for(ctx: WorkContext, peer: str, result: Result) -> bytes | None:
    """The receipt this node issued for this very result (the worker asks again
    when the answer to its first copy was lost), else None."""
    issued = ctx.jobs.receipt(result.unit_id)
    if issued is None or not result.ok:
        return None
    try:
        receipt = open_receipt(parse_cosigned(issued).receipt)
    except ProtocolError:
        return None
    same = (receipt.worker, receipt.job_id, receipt.weights_sha256)
    return issued if same == (peer, result.job_id, result.weights_sha256) else None


async def take_cosigned(
    ctx: WorkContext, peer: str, data: bytes, credit_of: Callable[[Job, Unit], float]
) -> bytes:
    """The worker's co-signed receipt: checked against the one this node issued, then
    recorded in the ledger and gossiped. Idempotent: a worker retrying after a lost
    answer gets the same yes."""
    try:
        verified = open_cosigned(data)
    except ProtocolError as exc:
        return encode_ack(False, f"bad receipt: {exc}")
    if verified.worker != peer or verified.owner != ctx.peer_id:
        return encode_ack(False, "the receipt names other peers")
    issued = ctx.jobs.receipt(verified.unit_id)
    job = ctx.jobs.get(verified.job_id)
    unit = ctx.jobs.unit(verified.unit_id)
    if (
        issued is None
        or job is None
        or unit is None
        or parse_cosigned(issued).receipt != verified.cosigned.receipt
    ):
        return encode_ack(False, "this node issued no such receipt")
    if issued == data:
        return encode_ack(True)  # recorded already
    try:
        ctx.ledger.append_work("work_received", data, verified.credit, credit_of(job, unit))
    except MeshminerError as exc:  # the ledger's refusals, credit disagreements too
        log.warning("receipt for unit %s not recorded: %s", verified.unit_id, exc)
        return encode_ack(False, str(exc))
    ctx.jobs.add_receipt(verified.unit_id, job.id, "owner", ctx.peer_id, peer, data)
    await ctx.publish_receipt(data)
    log.info("unit %s: co-signed receipt recorded (%.6f TFLOP)", verified.unit_id, verified.credit)
    return encode_ack(True)


# -- the worker's end ------------------------------------------------------------------


def check_issued(ctx: WorkContext, owner: str, result: Result, half: bytes) -> Any:
    """The owner's receipt, opened, when it is for the result this node sent (a pruned
    trial's: for no weights); raises ProtocolError when it is not."""
    issued = open_receipt(parse_cosigned(half).receipt)
    partial = issued.weights_sha256 == NO_WEIGHTS_SHA256
    weights = NO_WEIGHTS_SHA256 if partial or not result.ok else result.weights_sha256
    if (issued.owner, issued.job_id, issued.unit_id, issued.worker, issued.weights_sha256) != (
        owner,
        result.job_id,
        result.unit_id,
        ctx.peer_id,
        weights,
    ):
        raise ProtocolError("the receipt does not match the result sent")
    return issued


async def hand_back(
    ctx: WorkContext,
    owner: str,
    result: Result,
    half: bytes,
    credit: float,
    retry: Callable[[Callable[[], Awaitable[Any]], str, str], Awaitable[Any]],
) -> None:
    """Countersign the owner's receipt with this node's own `credit` figure and hand it
    back (`retry` retries what fails in transit); once the owner has recorded it,
    record it in this node's ledger and gossip it."""
    cosigned = countersign(half, ctx.identity.signing_key, credit)

    async def send() -> tuple[bool, str]:
        raw = await ctx.host.request(owner, RECEIPT_PROTOCOL, cosigned, WORK_LIMITS.max_bytes)
        return decode_ack(raw)

    answer = await retry(send, owner, f"receipt of unit {result.unit_id}")
    if answer is None or not answer[0]:
        why = "no answer" if answer is None else answer[1]
        log.warning("unit %s: owner did not take the receipt (%s); no credit", result.unit_id, why)
        return
    ctx.ledger.append_work("work_done", cosigned, credit, credit)
    ctx.jobs.add_receipt(result.unit_id, result.job_id, "worker", owner, ctx.peer_id, cosigned)
    await ctx.publish_receipt(cosigned)
    log.info("unit %s done; co-signed receipt recorded (%.6f TFLOP)", result.unit_id, credit)
