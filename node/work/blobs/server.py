"""The direct data channel's server: `BlobServer` serves blobs over plain TCP from its
own threads with blocking sockets, so bulk I/O, encryption and hashing never block the
trio loop (PyNaCl and hashlib release the GIL on large buffers)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from nacl.signing import SigningKey

from node.work.blobs.auth import (
    SEALED_OVERHEAD,
    JobKeyLookup,
    OnServed,
    Refusal,
    ReplayGuard,
    TransferCorrupt,
    TransferError,
    authorize,
    open_request,
)
from node.work.blobs.frames import (
    _LEN,
    CHUNK_SIZE,
    IO_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    _ChunkSource,
    _error_frame,
    _header_frame,
)
from node.work.blobs.rate import RateCap
from node.work.blobs.sockets import PIPELINE_DEPTH, _Ahead, _send_frame, _send_parts
from node.work.blobs.store import BlobStore
from protocol import TooLarge
from protocol.blobs import REQUEST_LIMITS

#: one logger for all of blob transfer, named for the module that was split up
log = logging.getLogger("node.work.blobs")


MAX_CONNECTIONS = 16
MAX_CONNECTIONS_PER_ADDRESS = 4  # one peer cannot take every transfer slot


class _HasPeerId(Protocol):
    @property
    def peer_id(self) -> str: ...

    @property
    def signing_key(self) -> SigningKey: ...


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """The request frame, which must arrive whole before `deadline` (a peer trickling
    bytes cannot hold a connection slot); None if the peer left without sending one."""
    buf = bytearray()
    need = _LEN.size
    while len(buf) < need:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no complete request within {REQUEST_TIMEOUT_S:.0f} s")
        conn.settimeout(remaining)
        data = conn.recv(min(need - len(buf), 65536))
        if not data:
            if not buf:
                return None
            raise TransferCorrupt(f"connection closed inside the request ({len(buf)} bytes)")
        buf += data
        if need == _LEN.size and len(buf) >= _LEN.size:
            (length,) = _LEN.unpack(buf[: _LEN.size])
            limit = REQUEST_LIMITS.max_bytes + SEALED_OVERHEAD
            if length > limit:
                raise TooLarge(f"request of {length} bytes exceeds the {limit}-byte limit")
            need = _LEN.size + length
    return bytes(buf[_LEN.size :])


def _peer_host(conn: socket.socket) -> str:
    try:
        return conn.getpeername()[0]
    except OSError:
        return ""


class BlobServer:
    """Serves blobs over plain TCP from its own threads: one accepting, one per
    connection (at most `max_connections`), each with a helper that reads and encrypts
    ahead of the socket. `start()` returns the bound port; `stop()` closes the listener
    (a dial fails afterwards) and ends open transfers.

    `job_key_for(job_id, unit_id)` is called from these threads; the node passes a
    lookup into a dict whose entries it replaces atomically, so no lock is needed."""

    def __init__(
        self,
        store: BlobStore,
        identity: _HasPeerId,
        bind_host: str,
        port: int,
        job_key_for: JobKeyLookup,
        *,
        chunk_size: int = CHUNK_SIZE,
        pipeline: bool = True,
        io_timeout: float = IO_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        on_served: OnServed | None = None,
        rate: RateCap | None = None,
    ) -> None:
        if not 0 < chunk_size <= CHUNK_SIZE:
            raise ValueError(f"chunk_size must be 1..{CHUNK_SIZE} (the fetcher's frame bound)")
        self.store = store
        self.peer_id = identity.peer_id
        self._signing_key = identity.signing_key
        self.bind_host = bind_host
        self.port = port
        self._job_key_for = job_key_for
        self._chunk_size = chunk_size
        self._pipeline = pipeline
        self._io_timeout = io_timeout
        self._max_connections = max_connections
        self._on_served = on_served
        self._rate = rate  # the volunteer's upload cap, shared with every other serve
        self._replay = ReplayGuard()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._stopping = threading.Event()

    def start(self) -> int:
        """Bind and start accepting; returns the port (useful with port 0)."""
        if self._listener is not None:
            raise RuntimeError("BlobServer already started")
        family = socket.AF_INET6 if ":" in self.bind_host else socket.AF_INET
        self._listener = socket.create_server(
            (self.bind_host, self.port), family=family, backlog=64
        )
        self.port = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"blob-server:{self.port}", daemon=True
        )
        self._accept_thread.start()
        log.info("blob data channel listening on %s:%d", self.bind_host, self.port)
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every open connection; wait for the threads."""
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        with self._lock:
            connections = dict(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in connections.values():
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BlobServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                conn, addr = listener.accept()
            except OSError as exc:
                if self._stopping.is_set():
                    return
                log.warning("blob data channel: accept failed: %s", exc)
                self._stopping.wait(0.1)  # back off (e.g. out of file descriptors)
                continue
            with self._lock:
                same = sum(1 for c in self._connections if _peer_host(c) == addr[0])
                busy = (
                    len(self._connections) >= self._max_connections
                    or same >= MAX_CONNECTIONS_PER_ADDRESS
                )
                if not busy:
                    thread = threading.Thread(
                        target=self._serve, args=(conn, addr), name="blob-conn", daemon=True
                    )
                    self._connections[conn] = thread
            if busy:
                self._refuse(conn, addr, Refusal("busy", "too many transfers; retry later"))
                conn.close()
            else:
                thread.start()

    def _serve(self, conn: socket.socket, addr: tuple[Any, ...]) -> None:
        try:
            self._serve_one(conn, addr)
        except (TransferError, TooLarge, OSError) as exc:
            log.info("blob transfer to %s:%d failed: %s", addr[0], addr[1], exc)
        except Exception:  # a bug must end this connection, not the server
            log.exception("blob transfer to %s:%d crashed", addr[0], addr[1])
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _serve_one(self, conn: socket.socket, addr: tuple[Any, ...]) -> None:
        try:
            try:
                request = _read_request(conn, time.monotonic() + REQUEST_TIMEOUT_S)
            except TooLarge as exc:
                raise Refusal("oversized", str(exc)) from exc
            if request is None:
                return  # connected and left
            auth = authorize(
                open_request(request, self._signing_key),
                our_peer_id=self.peer_id,
                store=self.store,
                job_key_for=self._job_key_for,
                replay_guard=self._replay,
            )
            source = _ChunkSource(self.store, auth, self._chunk_size)
        except Refusal as refusal:
            self._refuse(conn, addr, refusal)
            return
        conn.settimeout(self._io_timeout)
        _send_frame(conn, _header_frame(auth.size, source.header))
        chunks: Iterator[bytes] = iter(source)
        ahead = _Ahead(chunks, PIPELINE_DEPTH, "blob-encrypt") if self._pipeline else None
        try:
            for ciphertext in ahead if ahead is not None else chunks:
                if self._rate is not None:
                    self._rate.take(len(ciphertext))
                _send_parts(conn, _LEN.pack(len(ciphertext)), ciphertext)
        finally:
            if ahead is not None:
                ahead.close()
            source.close()
        log.debug("sent blob %s (%d bytes) to %s", auth.sha256[:12], auth.size, auth.requester)
        if self._on_served is not None:
            self._on_served(auth, "direct channel")

    def _refuse(self, conn: socket.socket, addr: tuple[Any, ...], refusal: Refusal) -> None:
        log.info("blob request from %s:%d refused: %s", addr[0], addr[1], refusal)
        with contextlib.suppress(OSError):
            conn.settimeout(REQUEST_TIMEOUT_S)
            _send_frame(conn, _error_frame(refusal))
