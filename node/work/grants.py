"""Blob grants: issuing them, and fetching what a grant allows from the peer that issued it.

Bulk bytes take the direct TCP channel when the peer advertises one and is
reachable (py-libp2p streams move ~0.1 of raw TCP and burn a core); the libp2p
stream `/meshminer/blob/1` is the fallback.
"""

from __future__ import annotations

import logging
import time

import trio

from node.work.context import WorkContext
from node.work.transfer import fetch_blob_direct, fetch_blob_libp2p, make_request
from protocol import seal
from protocol.blobs import BlobGrant

log = logging.getLogger(__name__)


def issue_grant(
    ctx: WorkContext,
    job_id: str,
    unit_id: str,
    grantee: str,
    blobs: list[str],
    max_bytes: int,
    valid_s: float,
) -> bytes:
    """A grant, sealed by this node, letting `grantee` fetch `blobs` from it."""
    grant = BlobGrant(
        job_id=job_id,
        unit_id=unit_id,
        owner=ctx.peer_id,
        grantee=grantee,
        blobs=list(blobs),
        max_bytes=max_bytes,
        expires_at=time.time() + valid_s,
        data_port=ctx.data_port,
    )
    return seal(grant, ctx.identity.signing_key)


async def fetch_granted(
    ctx: WorkContext,
    peer_id: str,
    grant: BlobGrant,
    grant_env: bytes,
    job_key: bytes,
    shas: list[str],
    max_bytes: int,
) -> None:
    """Fetch every blob in `shas` not already stored; raises on the first failure."""
    for sha in shas:
        if ctx.blobs.has(sha):
            continue
        request = make_request(ctx.identity, grant_env, sha)
        ip = ctx.peer_ip(peer_id)
        if grant.data_port and ip:
            try:
                await trio.to_thread.run_sync(
                    fetch_blob_direct,
                    ip,
                    grant.data_port,
                    request,
                    job_key,
                    ctx.blobs,
                    sha,
                    max_bytes,
                )
                continue
            except Exception as exc:  # unreachable or refused: try the libp2p stream
                log.info(
                    "direct fetch of %s from %s failed (%s); using libp2p", sha[:12], peer_id, exc
                )
        await fetch_blob_libp2p(ctx.host, peer_id, request, job_key, ctx.blobs, sha, max_bytes)
