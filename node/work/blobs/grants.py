"""Blob grants: issuing them, and fetching what a grant allows from the peer that issued it.

Bulk bytes take the direct TCP channel when the peer advertises one and is
reachable (py-libp2p streams move ~0.1 of raw TCP and burn a core); the libp2p
stream `/meshminer/blob/1` is the fallback. A peer behind a NAT is reached over its
hole-punched connection (DCUtR; `HOLE_PUNCH_WAIT_S` is given to it) or, for blobs of
at most the job's `requirements.relay_blob_mb`, through its relay: a relay's circuit
carries a limited number of bytes, and past it the whole relayed connection closes
(docs/nat.md).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from node.net.host import HostError
from node.work.blobs.auth import TransferError, TransferUnreachable, make_request
from node.work.blobs.fetch import Cutoff, fetch_blob_direct
from node.work.blobs.libp2p import fetch_blob_libp2p
from node.work.blobs.rate import RateCap
from node.work.blobs.store import BlobStore, size_text
from protocol import seal
from protocol.blobs import BlobGrant

log = logging.getLogger(__name__)


class GrantParty(Protocol):
    """What grants need of a node (its `WorkContext`, which this package never sees)."""

    peer_id: str
    data_port: int
    identity: Any
    blobs: BlobStore
    host: Any
    download_cap: RateCap | None

    def path_to(self, peer_id: str) -> str: ...

    def peer_ip(self, peer_id: str) -> str | None: ...


MIN_RATE = 256 << 10  # bytes/s: a peer slower than this over a whole blob is cut off
FIXED_S = 30.0  # on top: connecting, the first bytes, a slow start
MAX_FETCHES = 8  # blobs this node fetches at once, from all peers together
MAX_FETCHES_PER_PEER = 2  # ... and from any one peer
LOGGED_BYTES = 1 << 20  # a fetch this large is logged with its rate (smaller: debug)
HOLE_PUNCH_WAIT_S = 8.0  # measured: DCUtR upgrades within 3.3-4.4 s through two NATs


class FetchSlots:
    """Caps on the fetches in flight, so that many grants at once (or one peer
    handing out many) cannot open unbounded connections and threads on this node.
    A fetch waits for a slot before its deadline starts."""

    def __init__(self) -> None:
        self._total = trio.Semaphore(MAX_FETCHES)
        self._per_peer: dict[str, tuple[trio.Semaphore, list[int]]] = {}

    @asynccontextmanager
    async def hold(self, peer_id: str) -> AsyncIterator[None]:
        sem, users = self._per_peer.setdefault(peer_id, (trio.Semaphore(MAX_FETCHES_PER_PEER), [0]))
        users[0] += 1
        try:
            async with sem, self._total:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:  # the table holds only peers with fetches in flight
                del self._per_peer[peer_id]


_slots: trio.lowlevel.RunVar[FetchSlots] = trio.lowlevel.RunVar("blob_fetch_slots")


def fetch_slots() -> FetchSlots:
    """This trio run's fetch slots (one set per node process)."""
    try:
        return _slots.get()
    except LookupError:
        _slots.set(FetchSlots())
        return _slots.get()


def issue_grant(
    ctx: GrantParty,
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
    ctx: GrantParty,
    peer_id: str,
    grant: BlobGrant,
    grant_env: bytes,
    job_key: bytes,
    shas: list[str],
    max_bytes: int,
    relay_max_bytes: int,
) -> dict[str, str]:
    """Fetch every blob in `shas` not already stored; raises on the first failure.
    Returns the path each fetched blob took ("direct channel", "direct connection",
    "through a relay"). A blob that may be larger than `relay_max_bytes` (the job's
    `relay_blob_mb`) is not fetched through a relay.

    Each blob has an overall deadline, `fetch_deadline_s(max_bytes)`: a peer that
    trickles below `MIN_RATE` (with `FIXED_S` of slack) is cut off, whichever path
    carries the bytes. Cancelling the caller (hand-back, shutdown) ends a direct
    fetch at once too, though it runs in a thread. At most `MAX_FETCHES` blobs are
    fetched at once (`MAX_FETCHES_PER_PEER` from one peer); a fetch waits for its slot."""
    paths = {}
    for sha in shas:
        if ctx.blobs.has(sha):
            continue
        async with fetch_slots().hold(peer_id):
            started = trio.current_time()
            paths[sha] = await _fetch_one(
                ctx, peer_id, grant, grant_env, job_key, sha, max_bytes, relay_max_bytes
            )
            took = max(trio.current_time() - started, 1e-6)
        size = ctx.blobs.path(sha).stat().st_size
        log.log(logging.INFO if size >= LOGGED_BYTES else logging.DEBUG,
                "fetched blob %s from %s: %d bytes in %.3f s (%.2f Mbit/s) by %s",
                sha[:12], peer_id, size, took, size * 8 / took / 1e6, paths[sha])  # fmt: skip
    return paths


async def _fetch_one(
    ctx: GrantParty,
    peer_id: str,
    grant: BlobGrant,
    grant_env: bytes,
    job_key: bytes,
    sha: str,
    max_bytes: int,
    relay_max_bytes: int,
) -> str:
    """One blob, within its deadline; the path it took."""
    deadline_s = fetch_deadline_s(max_bytes)
    too_slow = (
        f"{peer_id} is too slow: {sha[:12]} (up to {max_bytes} bytes) did not arrive "
        f"within {deadline_s:.0f} s (minimum rate {MIN_RATE >> 10} KiB/s)"
    )
    request = make_request(ctx.identity, grant_env, sha)
    ip = _data_channel_ip(ctx, peer_id)
    started = trio.current_time()
    if grant.data_port and ip:
        try:
            await _direct(ip, grant.data_port, request, job_key, ctx, sha, max_bytes,
                          deadline_s, too_slow)  # fmt: skip
            return "direct channel"
        except TransferError as exc:
            if exc.reason == "cut_off":
                raise
            log.info("direct fetch of %s from %s failed (%s); using libp2p", sha[:12], peer_id, exc)
    await _off_relay(ctx, peer_id, sha, max_bytes, relay_max_bytes)
    path = ctx.path_to(peer_id)
    left = deadline_s - (trio.current_time() - started)
    with trio.move_on_after(max(left, 1.0)) as scope:
        await fetch_blob_libp2p(
            ctx.host, peer_id, request, job_key, ctx.blobs, sha, max_bytes, rate=ctx.download_cap
        )
    if scope.cancelled_caught:
        raise TransferError(too_slow, "cut_off")
    return path


def _data_channel_ip(ctx: GrantParty, peer_id: str) -> str | None:
    """The peer's advertised IP, if the data channel can reach it there: not when
    we reach the peer only through a relay, or at another IP (its NAT's): the data
    channel's port is not the one a hole punch opened."""
    ip = ctx.peer_ip(peer_id)
    path = ctx.host.path_to(peer_id)
    if path == "relayed" or (path == "direct" and ip not in ctx.host.relay.remote_ips(peer_id)):
        return None
    return ip


async def _off_relay(
    ctx: GrantParty, peer_id: str, sha: str, max_bytes: int, relay_max_bytes: int
) -> None:
    """Give a hole punch under way its time before bulk bytes go to a peer reached
    through a relay; refuse a blob larger than the job lets a relay carry. A peer that
    cannot be reached (an owner restarting) is `TransferUnreachable`: worth waiting for."""
    try:
        await ctx.host.reach(peer_id)
    except HostError as exc:
        raise TransferUnreachable(str(exc)) from exc
    with trio.move_on_after(HOLE_PUNCH_WAIT_S):
        while ctx.host.path_to(peer_id) == "relayed" and ctx.host.relay.punching(peer_id):
            await trio.sleep(0.2)
    if ctx.host.path_to(peer_id) == "relayed" and max_bytes > relay_max_bytes:
        raise TransferError(
            f"{peer_id} is reachable only through a relay, and {sha[:12]} may be up to "
            f"{size_text(max_bytes)}; this job lets a relay carry at most "
            f"{size_text(relay_max_bytes)} of a blob (requirements.relay_blob_mb)",
            "relayed",
        )


def fetch_deadline_s(max_bytes: int) -> float:
    return FIXED_S + max_bytes / MIN_RATE


async def _direct(
    ip: str,
    port: int,
    request: bytes,
    job_key: bytes,
    ctx: GrantParty,
    sha: str,
    max_bytes: int,
    deadline_s: float,
    too_slow: str,
) -> None:
    """The blocking direct fetch in a thread, cut off at the deadline or when the
    caller is cancelled."""
    cutoff = Cutoff()
    fetch = functools.partial(
        fetch_blob_direct, ip, port, request, job_key, ctx.blobs, sha, max_bytes,
        cutoff=cutoff, rate=ctx.download_cap,
    )  # fmt: skip
    async with trio.open_nursery() as watch:

        async def watchdog() -> None:
            try:
                await trio.sleep(deadline_s)
                cutoff.cut(too_slow)
            finally:
                cutoff.cut("the fetch was cancelled")  # no-op once the fetch is done

        watch.start_soon(watchdog)
        failed: TransferError | None = None
        try:
            await trio.to_thread.run_sync(fetch)
        except TransferError as exc:  # raised below, not wrapped in the nursery's group
            failed = exc
        finally:
            watch.cancel_scope.cancel()
    if failed is not None:
        raise failed
