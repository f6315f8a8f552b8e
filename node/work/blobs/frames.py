"""The exchange both paths speak, as frames and chunks: the bounds and timeouts, the
server's answer before the chunks, and the two ends of a stream of encrypted chunks
(`_ChunkSource` on the server, `_Receiver` on the fetcher).

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
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from node.work.blobs.auth import (
    REFUSAL_REASONS,
    Authorized,
    Refusal,
    TransferCorrupt,
    TransferError,
    TransferRefused,
)
from node.work.blobs.store import (
    BlobHashMismatch,
    BlobNotFound,
    BlobStore,
    BlobTooLarge,
    BlobWriter,
)
from protocol import (
    DecryptError,
    Limits,
    ProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    decode,
    encode,
)
from protocol.crypto import STREAM_ABYTES

#: plaintext bytes per encrypted chunk (see docs/performance.md, "Blob transfer")
CHUNK_SIZE = 1024 * 1024
MAX_CHUNK_FRAME = CHUNK_SIZE + STREAM_ABYTES
#: the server's answer before the chunks: {"size", "stream"} or {"error", "detail"}
MAX_HEADER_FRAME = 1024
_HEADER_LIMITS = Limits(
    max_bytes=MAX_HEADER_FRAME, max_depth=1, max_container_len=4, max_str_len=512, max_bin_len=64
)
#: bound on every single read or write once connected
IO_TIMEOUT_S = 30.0
#: the whole request frame must arrive within this
REQUEST_TIMEOUT_S = 10.0

_LEN = struct.Struct(">I")


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
