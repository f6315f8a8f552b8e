"""The libp2p fallback for relayed or firewalled peers: blobs on `/meshminer/blob/1`
streams of a `MeshHost`, in the same exchange as the direct channel. py-libp2p streams
move bulk bytes at about 0.1 of raw TCP, so this path is only for peers without a
reachable data channel."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import trio

from node.net.host import HostError, MeshHost, read_frame, write_frame
from node.net.relay import PATH_WORDS, stream_path
from node.work.blobs.auth import (
    JobKeyLookup,
    OnServed,
    Refusal,
    TransferCorrupt,
    TransferError,
    TransferUnreachable,
    _fetch_cap,
    authorize,
)
from node.work.blobs.frames import (
    CHUNK_SIZE,
    IO_TIMEOUT_S,
    MAX_CHUNK_FRAME,
    MAX_HEADER_FRAME,
    REQUEST_TIMEOUT_S,
    _ChunkSource,
    _error_frame,
    _header_frame,
    _Receiver,
)
from node.work.blobs.rate import RateCap
from node.work.blobs.store import BlobStore, BlobStoreError
from protocol import TooLarge
from protocol.blobs import REQUEST_LIMITS
from protocol.names import BLOB_PROTOCOL

#: one logger for all of blob transfer, named for the module that was split up
log = logging.getLogger("node.work.blobs")


def serve_blobs_libp2p(
    mesh: MeshHost,
    store: BlobStore,
    job_key_for: JobKeyLookup,
    *,
    chunk_size: int = CHUNK_SIZE,
    io_timeout: float = IO_TIMEOUT_S,
    on_served: OnServed | None = None,
    rate: RateCap | None = None,
) -> None:
    """Serve blobs on `/meshminer/blob/1` of `mesh`; the request must be signed by the
    stream's authenticated remote peer. Reading and encryption run in worker threads."""

    async def handle(peer: str, stream: Any) -> None:
        try:
            try:
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    request = await read_frame(stream, REQUEST_LIMITS.max_bytes)
            except TooLarge as exc:
                raise Refusal("oversized", str(exc)) from exc
            auth = authorize(
                request,
                our_peer_id=mesh.peer_id,
                store=store,
                job_key_for=job_key_for,
                remote_peer_id=peer,
            )
            source = _ChunkSource(store, auth, chunk_size)
        except Refusal as refusal:
            log.info("blob request from %s refused: %s", peer, refusal)
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await write_frame(stream, _error_frame(refusal))
            return
        chunks = iter(source)
        try:
            with trio.fail_after(io_timeout):
                await write_frame(stream, _header_frame(auth.size, source.header))
            while (ciphertext := await trio.to_thread.run_sync(next, chunks, None)) is not None:
                if rate is not None:
                    await rate.take_async(len(ciphertext))
                with trio.fail_after(io_timeout):
                    await write_frame(stream, ciphertext)
        finally:
            source.close()
        log.debug("sent blob %s (%d bytes) to %s over libp2p", auth.sha256[:12], auth.size, peer)
        if on_served is not None:
            on_served(auth, PATH_WORDS[stream_path(stream)])

    mesh.serve_stream(BLOB_PROTOCOL, handle)


async def fetch_blob_libp2p(
    mesh: MeshHost,
    peer_id: str,
    request_envelope: bytes,
    job_key: bytes,
    store: BlobStore,
    sha256: str,
    max_bytes: int,
    *,
    timeout: float = IO_TIMEOUT_S,
    rate: RateCap | None = None,
) -> Path:
    """Fetch one blob from `peer_id` over a `/meshminer/blob/1` stream into `store`.

    The fallback for peers without a reachable data channel. Decryption, hashing and
    writing run in worker threads. Raises like `fetch_blob_direct`."""
    cap, _ = _fetch_cap(request_envelope, sha256, max_bytes)
    if store.has(sha256):
        return store.path(sha256)
    try:
        stream = await mesh.open_stream(peer_id, BLOB_PROTOCOL, timeout=timeout)
    except HostError as exc:
        raise TransferUnreachable(str(exc)) from exc
    receiver = _Receiver(store, sha256, cap, job_key, peer_id)
    ok = False
    try:
        with trio.fail_after(timeout):
            await write_frame(stream, request_envelope)
            header = await read_frame(stream, MAX_HEADER_FRAME)
        receiver.start(header)
        while True:
            with trio.fail_after(timeout):
                ciphertext = await read_frame(stream, MAX_CHUNK_FRAME)
            if rate is not None:
                await rate.take_async(len(ciphertext))
            if await trio.to_thread.run_sync(receiver.chunk, ciphertext):
                break
        path = await trio.to_thread.run_sync(receiver.commit)
        ok = True
        return path
    except TooLarge as exc:
        raise TransferCorrupt(f"{peer_id}: {exc}", "oversized") from exc
    except trio.TooSlowError as exc:
        raise TransferError(f"{peer_id} sent nothing for {timeout:.0f} s", "timeout") from exc
    except HostError as exc:  # the stream ended early
        raise TransferCorrupt(f"{peer_id}: {exc}", "truncated") from exc
    except (TransferError, BlobStoreError):
        raise
    except Exception as exc:  # py-libp2p raises its own types for reset or closed streams
        raise TransferError(
            f"stream from {peer_id} failed: {type(exc).__name__}: {exc}", "connection"
        ) from exc
    finally:
        receiver.discard()
        with trio.CancelScope(shield=True), trio.move_on_after(3), contextlib.suppress(Exception):
            await (stream.close() if ok else stream.reset())
