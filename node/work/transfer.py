"""Blob transfer, both roles and both paths: serving blobs under a grant, and fetching them.

py-libp2p streams move bulk bytes at about 0.1 of raw TCP and burn a core doing it
(the project notes), so blobs go over a **direct data channel** where the serving
node is reachable: plain TCP to the grant's `data_port`, served by `BlobServer` from
its own threads with blocking sockets, so bulk I/O, encryption and hashing never block
the trio loop (PyNaCl and hashlib release the GIL on large buffers). Relayed or
firewalled peers use the **libp2p fallback**, protocol `/meshminer/blob/1` on a
`MeshHost` stream. Both speak the same exchange:

    fetcher -> server   frame: BlobRequest envelope, signed by the grantee
    server  -> fetcher  frame: msgpack {"size": int, "stream": 24-byte secretstream header}
                        or     msgpack {"error": reason, "detail": text}, then the end
    server  -> fetcher  frames: the blob as secretstream chunks (<= CHUNK_SIZE bytes of
                        plaintext each) under the job key; the last is tagged FINAL
                        (an empty blob is one empty FINAL chunk)

A frame is a 4-byte big-endian length and that many bytes; every reader refuses a
length over its bound before reading the body. Every chunk is authenticated with the
blob's raw sha256 as additional data, and the fetcher hashes what it stores: a
truncated, altered, oversized or wrong blob raises and leaves nothing stored.

The server checks, in this order (the first failure is the refusal reason):
the request frame fits `REQUEST_LIMITS` (`oversized`); the request envelope decodes and
its signature verifies (`malformed`, `bad_signature`), on libp2p by the stream's
authenticated remote peer (`signer_mismatch`); its timestamp is within
`REQUEST_MAX_AGE_S` (`stale`); the grant inside decodes and verifies (`bad_grant`), was
sealed by this node with `owner` = this node (`foreign_grant`), has not expired
(`expired`), names the blob (`not_granted`), and names the request's signer as grantee
(`not_grantee`); on the direct channel the request's nonce has not been seen
(`replay`); the node has a job key for the grant's job and unit (`unknown_job`); the
blob is stored (`not_found`) and within the grant's `max_bytes` (`too_large`). A server
at its connection limit answers `busy`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Generic, Protocol, TypeVar

import trio
from nacl.signing import SigningKey

from node.net.host import HostError, MeshHost, read_frame, write_frame
from node.work.blobs import (
    BlobHashMismatch,
    BlobNotFound,
    BlobStore,
    BlobStoreError,
    BlobTooLarge,
    BlobWriter,
)
from protocol import (
    DecryptError,
    Limits,
    ProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    TooLarge,
    decode,
    encode,
    open_envelope,
    seal,
)
from protocol.blobs import GRANT_LIMITS, REQUEST_LIMITS, BlobGrant, BlobRequest
from protocol.crypto import STREAM_ABYTES
from protocol.names import BLOB_PROTOCOL

log = logging.getLogger(__name__)

#: plaintext bytes per encrypted chunk (see docs/performance.md, "Blob transfer")
CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_FRAME = CHUNK_SIZE + STREAM_ABYTES
#: the server's answer before the chunks: {"size", "stream"} or {"error", "detail"}
MAX_HEADER_FRAME = 1024
_HEADER_LIMITS = Limits(
    max_bytes=MAX_HEADER_FRAME, max_depth=1, max_container_len=4, max_str_len=512, max_bin_len=64
)
#: a request older than this (or more than CLOCK_SKEW_S in the future) is refused
REQUEST_MAX_AGE_S = 300.0
CLOCK_SKEW_S = 60.0
CONNECT_TIMEOUT_S = 5.0
#: bound on every single read or write once connected
IO_TIMEOUT_S = 30.0
#: the whole request frame must arrive within this
REQUEST_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16
#: chunks a pipeline stage may run ahead of the next one
PIPELINE_DEPTH = 4
#: every reason a server may give for refusing a request (see the module docstring)
REFUSAL_REASONS = frozenset(
    {
        "invalid",
        "oversized",
        "malformed",
        "bad_signature",
        "signer_mismatch",
        "stale",
        "bad_grant",
        "foreign_grant",
        "expired",
        "not_granted",
        "not_grantee",
        "replay",
        "unknown_job",
        "not_found",
        "too_large",
        "busy",
    }
)
#: nonces remembered by a direct server (each for REQUEST_MAX_AGE_S + CLOCK_SKEW_S)
MAX_REMEMBERED_NONCES = 65536

_LEN = struct.Struct(">I")
T = TypeVar("T")

JobKeyLookup = Callable[[str, str], "bytes | None"]


class _HasSigningKey(Protocol):
    @property
    def signing_key(self) -> SigningKey: ...


class _HasPeerId(Protocol):
    @property
    def peer_id(self) -> str: ...


# -- errors -------------------------------------------------------------------------------


class TransferError(Exception):
    """A blob could not be fetched; nothing was stored. `reason` is a short label."""

    reason = "failed"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class TransferRefused(TransferError):
    """The serving node refused the request; `reason` is the reason it gave."""


class TransferUnreachable(TransferError):
    """No connection or stream to the serving node could be opened."""

    reason = "unreachable"


class TransferCorrupt(TransferError):
    """The peer sent something other than the blob announced: oversized, truncated,
    undecryptable, malformed, or hashing to another id (`reason` says which)."""

    reason = "corrupt"


class Refusal(Exception):
    """Server side: a request is refused with `reason` (sent to the peer) and `detail`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# -- requests -----------------------------------------------------------------------------


def make_request(identity: _HasSigningKey, grant_envelope: bytes, sha256: str) -> bytes:
    """A fresh signed `BlobRequest` for blob `sha256` under a grant (envelope bytes).

    Each request carries a new nonce, and a direct server accepts a nonce once: make a
    new request for every attempt over the direct channel."""
    request = BlobRequest(
        grant=grant_envelope, sha256=sha256, timestamp=time.time(), nonce=os.urandom(16)
    )
    request.check("BlobRequest")  # a bad sha or an oversized grant is our bug: say so here
    return seal(request, identity.signing_key)


@dataclass(frozen=True)
class Authorized:
    """A request that passed every check: what to send and under which key."""

    grant: BlobGrant
    requester: str
    sha256: str
    size: int
    job_key: bytes


class ReplayGuard:
    """Nonces of accepted direct-channel requests, each kept until its request would be
    stale anyway. Thread-safe. The direct channel is plain TCP, so a request seen on
    the wire could be sent again by anyone; its answer would be encrypted, but the
    server would still spend the bandwidth."""

    def __init__(self, max_entries: int = MAX_REMEMBERED_NONCES) -> None:
        self._max = max_entries
        self._seen: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def remember(self, nonce: bytes, timestamp: float, now: float) -> None:
        """Record `nonce`, or raise `Refusal` (`replay`, or `busy` when full)."""
        with self._lock:
            if nonce in self._seen:
                raise Refusal("replay", "this request was already used")
            if len(self._seen) >= self._max:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
                if len(self._seen) >= self._max:
                    raise Refusal("busy", "too many recent requests; retry later")
            self._seen[nonce] = timestamp + REQUEST_MAX_AGE_S + CLOCK_SKEW_S


def authorize(
    request_envelope: bytes,
    *,
    our_peer_id: str,
    store: BlobStore,
    job_key_for: JobKeyLookup,
    remote_peer_id: str | None = None,
    replay_guard: ReplayGuard | None = None,
    now: float | None = None,
) -> Authorized:
    """Check a blob request against everything the module docstring lists; raises
    `Refusal` naming the first rule that fails."""
    now = time.time() if now is None else now
    try:
        signed = open_envelope(
            request_envelope, BlobRequest, expected_signer=remote_peer_id, limits=REQUEST_LIMITS
        )
    except ProtocolError as exc:
        raise Refusal(exc.reason, f"blob request: {exc}") from exc
    request, requester = signed.message, signed.signer
    if not now - REQUEST_MAX_AGE_S <= request.timestamp <= now + CLOCK_SKEW_S:
        raise Refusal("stale", f"request made {now - request.timestamp:.0f} s ago")
    try:
        granted = open_envelope(request.grant, BlobGrant, limits=GRANT_LIMITS)
    except ProtocolError as exc:
        raise Refusal("bad_grant", f"grant: {exc}") from exc
    grant = granted.message
    if granted.signer != our_peer_id or grant.owner != our_peer_id:
        raise Refusal("foreign_grant", f"the grant was sealed by {granted.signer}, not this node")
    if grant.expires_at <= now:
        raise Refusal("expired", f"the grant expired {now - grant.expires_at:.0f} s ago")
    if request.sha256 not in grant.blobs:
        raise Refusal("not_granted", f"the grant does not name blob {request.sha256}")
    if requester != grant.grantee:
        raise Refusal("not_grantee", f"the grant is for {grant.grantee}, not {requester}")
    if replay_guard is not None:
        replay_guard.remember(request.nonce, request.timestamp, now)
    job_key = job_key_for(grant.job_id, grant.unit_id)
    if job_key is None:
        raise Refusal("unknown_job", f"no job key for {grant.job_id}/{grant.unit_id}")
    try:
        size = store.size(request.sha256)
    except BlobNotFound:
        raise Refusal("not_found", f"blob {request.sha256} is not stored here") from None
    if size > grant.max_bytes:
        raise Refusal("too_large", f"blob is {size} bytes; the grant allows {grant.max_bytes}")
    return Authorized(grant, requester, request.sha256, size, job_key)


def _error_frame(refusal: Refusal) -> bytes:
    return encode({"error": refusal.reason[:64], "detail": refusal.detail[:400]})


def _header_frame(size: int, stream_header: bytes) -> bytes:
    return encode({"size": size, "stream": stream_header})


# -- the two ends of a stream of chunks ---------------------------------------------------


class _ChunkSource:
    """Server side: reads the blob and yields its encrypted chunks, FINAL last."""

    def __init__(self, store: BlobStore, auth: Authorized, chunk_size: int) -> None:
        try:
            self._file: BinaryIO = store.open(auth.sha256)
        except BlobNotFound:
            raise Refusal("not_found", f"blob {auth.sha256} is no longer stored") from None
        self._remaining = auth.size
        if os.fstat(self._file.fileno()).st_size != auth.size:  # pragma: no cover - immutable
            self._file.close()
            raise Refusal("not_found", "the blob changed while being served")
        self._chunk_size = chunk_size
        self._ad = bytes.fromhex(auth.sha256)
        self._encryptor = StreamEncryptor(auth.job_key)
        self.header = self._encryptor.header

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                chunk = self._file.read(min(self._chunk_size, self._remaining))
                if len(chunk) == 0 and self._remaining:
                    raise OSError("the blob file ended early")
                self._remaining -= len(chunk)
                final = self._remaining == 0
                yield self._encryptor.push(chunk, final=final, ad=self._ad)
                if final:
                    return
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()


class _Receiver:
    """Fetcher side: takes the header and the chunks, decrypts them into a blob writer,
    and commits only a complete blob that hashes to the id asked for."""

    def __init__(self, store: BlobStore, sha256: str, cap: int, job_key: bytes, peer: str):
        self._store, self._sha256, self._cap, self._key = store, sha256, cap, job_key
        self._peer = peer
        self._ad = bytes.fromhex(sha256)
        self._decryptor: StreamDecryptor | None = None
        self._writer: BlobWriter | None = None
        self.size = 0

    def start(self, frame: bytes) -> None:
        try:
            info = decode(frame, _HEADER_LIMITS)
        except ProtocolError as exc:
            raise TransferCorrupt(
                f"{self._peer} sent a malformed header: {exc}", exc.reason
            ) from exc
        if not isinstance(info, dict):
            raise TransferCorrupt(f"{self._peer} sent a malformed header", "malformed")
        if "error" in info:
            reason, detail = info.get("error"), str(info.get("detail", ""))[:400]
            # a peer's word becomes a metrics label only if it is one of ours
            reason = reason if reason in REFUSAL_REASONS else "refused"
            raise TransferRefused(f"{self._peer} refused blob {self._sha256}: {detail}", reason)
        size, stream_header = info.get("size"), info.get("stream")
        if type(size) is not int or size < 0 or not isinstance(stream_header, bytes):
            raise TransferCorrupt(f"{self._peer} sent a malformed header", "malformed")
        if size > self._cap:
            raise TransferCorrupt(
                f"{self._peer} announces {size} bytes for blob {self._sha256}; "
                f"at most {self._cap} are allowed",
                "oversized",
            )
        try:
            self._decryptor = StreamDecryptor(self._key, stream_header)
        except DecryptError as exc:
            raise TransferCorrupt(f"{self._peer}: {exc}", exc.reason) from exc
        self.size = size
        try:
            self._writer = self._store.begin(self._sha256, size)
        except OSError as exc:
            raise TransferError(f"cannot store blob {self._sha256}: {exc}", "store") from exc

    def decrypt(self, ciphertext: bytes) -> tuple[bytes, bool]:
        """One chunk's plaintext, and whether it was the last."""
        assert self._decryptor is not None, "start() first"
        try:
            plain = self._decryptor.pull(ciphertext, ad=self._ad)
        except DecryptError as exc:
            raise TransferCorrupt(
                f"blob {self._sha256} from {self._peer}: {exc}", exc.reason
            ) from exc
        return plain, self._decryptor.finished

    def store(self, plain: bytes) -> None:
        assert self._writer is not None, "start() first"
        try:
            self._writer.write(plain)
        except BlobTooLarge:
            raise TransferCorrupt(
                f"{self._peer} sent more than the {self.size} bytes it announced", "oversized"
            ) from None
        except OSError as exc:  # disk full, say: not the peer's fault
            raise TransferError(f"cannot store blob {self._sha256}: {exc}", "store") from exc

    def chunk(self, ciphertext: bytes) -> bool:
        """Decrypt and store one chunk; True once the FINAL chunk is in."""
        plain, final = self.decrypt(ciphertext)
        self.store(plain)
        return final

    def commit(self) -> Path:
        assert self._decryptor is not None and self._writer is not None, "start() first"
        try:
            self._decryptor.finish()
        except DecryptError as exc:
            raise TransferCorrupt(
                f"blob {self._sha256} from {self._peer}: {exc}", "truncated"
            ) from exc
        if self._writer.size != self.size:
            raise TransferCorrupt(
                f"{self._peer} sent {self._writer.size} of the {self.size} bytes it announced",
                "truncated",
            )
        try:
            return self._writer.commit()
        except BlobHashMismatch as exc:
            raise TransferCorrupt(f"from {self._peer}: {exc}", "hash_mismatch") from exc
        except OSError as exc:
            raise TransferError(f"cannot store blob {self._sha256}: {exc}", "store") from exc

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.discard()


def _fetch_cap(request_envelope: bytes, sha256: str, max_bytes: int) -> int:
    """The most bytes the fetcher accepts: its own cap and the grant's, whichever is less.
    The request is our own, so a bad one is a `ValueError`, not a peer's fault."""
    try:
        request = open_envelope(request_envelope, BlobRequest, limits=REQUEST_LIMITS).message
        grant = open_envelope(request.grant, BlobGrant, limits=GRANT_LIMITS).message
    except ProtocolError as exc:
        raise ValueError(f"not a valid blob request: {exc}") from exc
    if request.sha256 != sha256:
        raise ValueError(f"the request is for blob {request.sha256}, not {sha256}")
    return min(grant.max_bytes, max_bytes)


# -- blocking socket helpers (the direct channel) --------------------------------------------


def _send_parts(sock: socket.socket, *parts: bytes) -> None:
    """Send all of `parts` with as few system calls as the kernel allows (no joining copy)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    _send_parts(sock, _LEN.pack(len(payload)), payload)


def _read_exactly(rfile: BinaryIO, n: int, what: str) -> bytes:
    data = rfile.read(n)  # a buffered socket file reads until n bytes or EOF
    if data is None or len(data) != n:
        got = 0 if data is None else len(data)
        raise TransferCorrupt(f"connection closed after {got} of {n} bytes of {what}", "truncated")
    return data


def _read_sock_frame(rfile: BinaryIO, limit: int, what: str) -> bytes | None:
    """One frame of at most `limit` bytes; None at a clean end of the connection."""
    head = rfile.read(_LEN.size)
    if not head:
        return None
    if len(head) != _LEN.size:
        raise TransferCorrupt(f"connection closed inside a {what} length", "truncated")
    (length,) = _LEN.unpack(head)
    if length > limit:
        raise TooLarge(f"{what} of {length} bytes exceeds the {limit}-byte limit")
    return _read_exactly(rfile, length, what)


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
            if length > REQUEST_LIMITS.max_bytes:
                raise TooLarge(
                    f"request of {length} bytes exceeds the {REQUEST_LIMITS.max_bytes}-byte limit"
                )
            need = _LEN.size + length
    return bytes(buf[_LEN.size :])


def _chunk_frames(rfile: BinaryIO) -> Iterator[bytes]:
    """The chunk frames of a response, until the connection ends."""
    while (frame := _read_sock_frame(rfile, MAX_CHUNK_FRAME, "chunk")) is not None:
        yield frame


def _decrypted(receiver: _Receiver, frames: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Plaintext chunks and whether each is the last; stops after the FINAL one."""
    for ciphertext in frames:
        plain, final = receiver.decrypt(ciphertext)
        yield plain, final
        if final:
            return


class _Ahead(Generic[T]):
    """Runs an iterator in a helper thread, up to `depth` items ahead of its consumer,
    so two stages of a transfer (receive and decrypt, read and send) overlap. An error
    in the helper is raised to the consumer when it reaches that point."""

    _END = object()

    def __init__(self, source: Iterator[T], depth: int, name: str) -> None:
        self._queue: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put((True, item)):
                    return
            self._put((False, self._END))
        except BaseException as exc:  # handed to the consumer
            self._put((False, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, entry: tuple[bool, Any]) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(entry, timeout=0.1)  # wake up now and then to see `_stop`
                return True
        return False

    def __iter__(self) -> Iterator[T]:
        while True:
            ok, item = self._queue.get()  # the helper's own I/O has timeouts: it will put
            if ok:
                yield item
            elif item is self._END:
                return
            else:
                raise item

    def close(self, timeout: float = 5.0) -> None:
        """Stop the helper (it finishes the item in hand) and wait for it."""
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        self._thread.join(timeout)


# -- the direct channel: server -------------------------------------------------------------


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
    ) -> None:
        if not 0 < chunk_size <= CHUNK_SIZE:
            raise ValueError(f"chunk_size must be 1..{CHUNK_SIZE} (the fetcher's frame bound)")
        self.store = store
        self.peer_id = identity.peer_id
        self.bind_host = bind_host
        self.port = port
        self._job_key_for = job_key_for
        self._chunk_size = chunk_size
        self._pipeline = pipeline
        self._io_timeout = io_timeout
        self._max_connections = max_connections
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
                busy = len(self._connections) >= self._max_connections
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
                request,
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
                _send_parts(conn, _LEN.pack(len(ciphertext)), ciphertext)
        finally:
            if ahead is not None:
                ahead.close()
            source.close()
        log.debug("sent blob %s (%d bytes) to %s", auth.sha256[:12], auth.size, auth.requester)

    def _refuse(self, conn: socket.socket, addr: tuple[Any, ...], refusal: Refusal) -> None:
        log.info("blob request from %s:%d refused: %s", addr[0], addr[1], refusal)
        with contextlib.suppress(OSError):
            conn.settimeout(REQUEST_TIMEOUT_S)
            _send_frame(conn, _error_frame(refusal))


# -- the direct channel: client -----------------------------------------------------------


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
) -> Path:
    """Fetch one blob over a peer's direct data channel into `store`; returns its path.

    Blocking (run it in a thread). A blob already stored is returned at once. Raises
    `TransferUnreachable`, `TransferRefused`, `TransferCorrupt` or `TransferError`
    (timeouts: reason `timeout`); on any error nothing is stored."""
    cap = _fetch_cap(request_envelope, sha256, max_bytes)
    if store.has(sha256):
        return store.path(sha256)
    peer = f"{host_ip}:{port}"
    try:
        sock = socket.create_connection((host_ip, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise TransferUnreachable(f"cannot connect to the data channel at {peer}: {exc}") from exc
    receiver = _Receiver(store, sha256, cap, job_key, peer)
    rfile = sock.makefile("rb")
    ahead: _Ahead[bytes] | None = None
    try:
        sock.settimeout(timeout)
        _send_frame(sock, request_envelope)
        header = _read_sock_frame(rfile, MAX_HEADER_FRAME, "response header")
        if header is None:
            raise TransferCorrupt(f"{peer} closed the connection without answering", "truncated")
        receiver.start(header)
        frames: Iterator[bytes] = _chunk_frames(rfile)
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
    except OSError as exc:
        raise TransferError(f"connection to {peer} failed: {exc}", "connection") from exc
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes a helper blocked in recv
        if ahead is not None:
            ahead.close()
        rfile.close()
        sock.close()
        receiver.discard()


# -- the libp2p fallback --------------------------------------------------------------------


def serve_blobs_libp2p(
    mesh: MeshHost,
    store: BlobStore,
    job_key_for: JobKeyLookup,
    *,
    chunk_size: int = CHUNK_SIZE,
    io_timeout: float = IO_TIMEOUT_S,
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
                with trio.fail_after(io_timeout):
                    await write_frame(stream, ciphertext)
        finally:
            source.close()
        log.debug("sent blob %s (%d bytes) to %s over libp2p", auth.sha256[:12], auth.size, peer)

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
) -> Path:
    """Fetch one blob from `peer_id` over a `/meshminer/blob/1` stream into `store`.

    The fallback for peers without a reachable data channel. Decryption, hashing and
    writing run in worker threads. Raises like `fetch_blob_direct`."""
    cap = _fetch_cap(request_envelope, sha256, max_bytes)
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
