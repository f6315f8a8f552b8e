"""The direct data channel's client: `fetch_blob_direct` fetches one blob over plain
TCP, receiving, decrypting, and hashing and writing in three overlapping threads."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from node.work.blobs.auth import (
    TransferCorrupt,
    TransferError,
    TransferUnreachable,
    _fetch_cap,
    seal_request,
)
from node.work.blobs.frames import (
    IO_TIMEOUT_S,
    MAX_CHUNK_FRAME,
    MAX_HEADER_FRAME,
    _Receiver,
)
from node.work.blobs.rate import RateCap
from node.work.blobs.sockets import (
    PIPELINE_DEPTH,
    _Ahead,
    _read_sock_frame,
    _send_frame,
)
from node.work.blobs.store import BlobStore
from protocol import TooLarge

CONNECT_TIMEOUT_S = 5.0


def _chunk_frames(rfile: BinaryIO, rate: RateCap | None) -> Iterator[bytes]:
    """The chunk frames of a response, until the connection ends, each read once the
    download cap allows it (the kernel's buffers then hold the sender back)."""
    while (frame := _read_sock_frame(rfile, MAX_CHUNK_FRAME, "chunk")) is not None:
        if rate is not None:
            rate.take(len(frame))
        yield frame


def _decrypted(receiver: _Receiver, frames: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Plaintext chunks and whether each is the last; stops after the FINAL one."""
    for ciphertext in frames:
        plain, final = receiver.decrypt(ciphertext)
        yield plain, final
        if final:
            return


class Cutoff:
    """Ends a blocking direct fetch from another thread (deadline passed, unit handed
    back, node shutting down): its socket is shut down, so the fetch's next read
    fails at once and the fetch reports `why`."""

    def __init__(self) -> None:
        self.why = ""
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.why:
                self._shut()

    def cut(self, why: str) -> None:
        with self._lock:
            self.why = self.why or why
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)


def fetch_blob_direct(
    host_ip: str,
    port: int,
    request_envelope: bytes,
    job_key: bytes,
    store: BlobStore,
    sha256: str,
    max_bytes: int,
    *,
    timeout: float = IO_TIMEOUT_S,
    pipeline: bool = True,
    cutoff: Cutoff | None = None,
    rate: RateCap | None = None,
) -> Path:
    """Fetch one blob over a peer's direct data channel into `store`; returns its path.

    Blocking (run it in a thread). A blob already stored is returned at once. Raises
    `TransferUnreachable`, `TransferRefused`, `TransferCorrupt` or `TransferError`
    (timeouts: reason `timeout`); on any error nothing is stored."""
    cap, server_peer = _fetch_cap(request_envelope, sha256, max_bytes)
    if store.has(sha256):
        return store.path(sha256)
    peer = f"{host_ip}:{port}"
    try:
        sock = socket.create_connection((host_ip, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise TransferUnreachable(f"cannot connect to the data channel at {peer}: {exc}") from exc
    if cutoff is not None:
        cutoff.attach(sock)
    receiver = _Receiver(store, sha256, cap, job_key, peer)
    rfile = sock.makefile("rb")
    ahead: _Ahead[bytes] | None = None
    try:
        sock.settimeout(timeout)
        _send_frame(sock, seal_request(request_envelope, server_peer))
        header = _read_sock_frame(rfile, MAX_HEADER_FRAME, "response header")
        if header is None:
            raise TransferCorrupt(f"{peer} closed the connection without answering", "truncated")
        receiver.start(header)
        frames: Iterator[bytes] = _chunk_frames(rfile, rate)
        if pipeline:
            # three stages in three threads: receive | decrypt | hash and write
            ahead = _Ahead(frames, PIPELINE_DEPTH, "blob-receive")
            decrypting = _Ahead(_decrypted(receiver, iter(ahead)), PIPELINE_DEPTH, "blob-decrypt")
            try:
                for plain, final in decrypting:
                    receiver.store(plain)
                    if final:
                        break
            finally:
                decrypting.close()
        else:
            for ciphertext in frames:
                if receiver.chunk(ciphertext):
                    break
        return receiver.commit()
    except TooLarge as exc:
        raise TransferCorrupt(f"{peer}: {exc}", "oversized") from exc
    except TimeoutError as exc:
        raise TransferError(f"{peer} sent nothing for {timeout:.0f} s", "timeout") from exc
    except (OSError, TransferError) as exc:
        if cutoff is not None and cutoff.why:  # ended from outside: say why
            raise TransferError(f"{peer}: {cutoff.why}", "cut_off") from exc
        if isinstance(exc, TransferError):
            raise
        raise TransferError(f"connection to {peer} failed: {exc}", "connection") from exc
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a helper blocked in recv
        if ahead is not None:
            ahead.close()
        rfile.close()
        sock.close()
        receiver.discard()
