"""The blob store: content-addressed files under ``<root>/blobs/<ab>/<sha256>``.

A blob's name is the sha256 of its bytes, so a stored blob is by construction the
blob asked for: every write hashes as it goes and is renamed into place only if the
digest matches (and the size stayed within its cap). Until then the bytes live in a
temporary file in the same folder, so the final rename is atomic: a reader, a crash
or a failed transfer never sees a partial or wrong blob under a blob's name. For the
crash case the file is fsynced before the rename (`durable=True`, the default), and
the kernel is asked to start writing it out every 16 MiB along the way, so that fsync
does not add a whole blob's disk writes to the end of a transfer.

The store never interprets content. A blob that happens to be a pickle (`.pt`) is
just bytes here; refusing such formats is the training side's job.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from protocol.blobs import is_sha256_hex

#: read size when copying a file into the store
COPY_CHUNK = 1024 * 1024
#: a durable writer asks the kernel to start writing its dirty pages every this many bytes
WRITEBACK_EVERY = 16 * 1024 * 1024
_INCOMING = ".incoming"  # temp files whose hash is not known in advance
_SYNC_FILE_RANGE_WRITE = 2


def size_text(size: int) -> str:
    """A byte count as people read it: "312 B", "45.1 KiB", "12.3 MiB"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.3g} {unit}"
    return f"{size} B"


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's `sync_file_range` (Linux; not in `os`), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def _start_writeback(fd: int, start: int, end: int) -> None:
    """Start (not wait for) writing bytes [start, end) of `fd` to disk. The fsync before
    the rename would otherwise wait for a whole blob's writes at the end of a transfer;
    this way they overlap it. Advisory: failure or absence changes only the timing."""
    if _sync_file_range is not None:
        _sync_file_range(fd, start, end - start, _SYNC_FILE_RANGE_WRITE)


class BlobStoreError(Exception):
    """A blob could not be stored or found; `reason` is a short label for metrics."""

    reason = "store_error"


class BadBlobId(BlobStoreError, ValueError):
    """The blob id is not a lowercase sha256 hex digest (it never reaches a path)."""

    reason = "malformed"


class BlobNotFound(BlobStoreError, KeyError):
    """No blob with this id is stored."""

    reason = "not_found"

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else "blob not found"


class BlobTooLarge(BlobStoreError):
    """More bytes were written than the writer allows; nothing was stored."""

    reason = "oversized"


class BlobHashMismatch(BlobStoreError):
    """The bytes written do not hash to the expected id; nothing was stored."""

    reason = "hash_mismatch"


class BlobWriter:
    """Streams bytes into a temporary file, hashing them; from `BlobStore.begin`.

    End with `commit()` (hash checked, renamed into place) or `discard()` (temp file
    removed); after a failed `write` or `commit` only `discard()` is left to do."""

    def __init__(
        self,
        tmp: Path,
        expected: str | None,
        max_bytes: int,
        durable: bool,
        final_path_for: Callable[[str], Path],
    ) -> None:
        self._tmp = tmp
        self._expected = expected
        self.max_bytes = max_bytes
        self._durable = durable
        self._final_path_for = final_path_for
        self._hash = hashlib.sha256()
        # 0600 from the first byte: a blob may be a job's private data or weights
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self.size = 0
        self._written_back = 0
        self._failed = False
        self._done = False
        self.sha256 = ""  # set once committed

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append `data`; raises `BlobTooLarge` (and the writer is then unusable) if the
        total would exceed `max_bytes`."""
        if self._failed or self._done:
            raise BlobStoreError("this blob writer is finished or failed; nothing more is taken")
        n = len(data)
        if self.size + n > self.max_bytes:
            self._failed = True
            raise BlobTooLarge(
                f"blob exceeds its limit of {self.max_bytes} bytes "
                f"({self.size + n} bytes written so far)"
            )
        self._hash.update(data)  # releases the GIL for large buffers
        self._file.write(data)
        self.size += n
        if self._durable and self.size - self._written_back >= WRITEBACK_EVERY:
            # start the disk writes now, so the fsync in commit() has little left to wait for
            self._file.flush()
            _start_writeback(self._file.fileno(), self._written_back, self.size)
            self._written_back = self.size

    def commit(self) -> Path:
        """Check the digest and move the blob into place; returns its path. Raises
        `BlobHashMismatch` (nothing stored; call `discard`)."""
        if self._failed or self._done:
            raise BlobStoreError("this blob writer is finished or failed; nothing was stored")
        digest = self._hash.hexdigest()
        if self._expected is not None and digest != self._expected:
            self._failed = True
            raise BlobHashMismatch(
                f"blob hashes to {digest}, expected {self._expected} ({self.size} bytes)"
            )
        self._file.flush()
        if self._durable:
            os.fsync(self._file.fileno())  # the rename must not land before the bytes
        self._file.close()
        final = self._final_path_for(digest)
        final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _move_into_place(self._tmp, final)
        self._done = True
        self.sha256 = digest
        return final

    def discard(self) -> None:
        """Drop whatever was written (a no-op after a successful `commit`)."""
        if self._done:
            return
        self._done = True
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Link, never replace: a blob already stored (the same bytes, by its name) keeps
    its file. A runner sandboxed to the blobs it was given (Landlock rules hold inodes)
    must not find another file under the name when two fetches of one blob land."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links
        os.replace(tmp, final)
    tmp.unlink(missing_ok=True)


class BlobStore:
    """Content-addressed blobs under `root/blobs/`. Safe for use from several threads:
    every write goes to its own temporary file and lands with one atomic rename."""

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = Path(root) / "blobs"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)  # a store made by an older version may be world-readable
        self._durable = durable

    # -- reading ---------------------------------------------------------------------

    def location(self, sha256: str) -> Path:
        """Where the blob `sha256` lives (or would live); `BadBlobId` for a bad id."""
        if not is_sha256_hex(sha256):
            raise BadBlobId(f"{str(sha256)[:80]!r} is not a lowercase sha256 hex digest")
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.location(sha256).is_file()

    def path(self, sha256: str) -> Path:
        """The file of a stored blob; `BlobNotFound` if it is not stored."""
        path = self.location(sha256)
        if not path.is_file():
            raise BlobNotFound(f"blob {sha256} is not stored")
        return path

    def size(self, sha256: str) -> int:
        try:
            return self.location(sha256).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"blob {sha256} is not stored") from None

    def open(self, sha256: str) -> BinaryIO:
        """The stored blob, open for binary reading (the caller closes it)."""
        try:
            return open(self.location(sha256), "rb")  # noqa: SIM115 - returned to the caller
        except FileNotFoundError:
            raise BlobNotFound(f"blob {sha256} is not stored") from None

    def remove(self, sha256: str) -> None:
        """Delete the blob `sha256` if it is stored (a reader that has it open keeps it)."""
        self.location(sha256).unlink(missing_ok=True)

    # -- writing ---------------------------------------------------------------------

    def begin(self, expected_sha256: str | None, max_bytes: int) -> BlobWriter:
        """Start writing a blob of at most `max_bytes`; `expected_sha256` None means
        "whatever it hashes to". The caller must `commit()` or `discard()` it."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if expected_sha256 is None:
            folder, name = self.root / _INCOMING, "blob"
        else:
            folder, name = self.location(expected_sha256).parent, expected_sha256
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".{name}.{secrets.token_hex(8)}.tmp"
        return BlobWriter(tmp, expected_sha256, max_bytes, self._durable, self.location)

    @contextmanager
    def writer(self, expected_sha256: str, max_bytes: int) -> Iterator[BlobWriter]:
        """Stream a blob in: ``with store.writer(sha, cap) as w: w.write(chunk)``.

        On a clean exit the digest is checked and the file renamed into place (the
        writer's `sha256` is then set); a mismatch raises `BlobHashMismatch`, more than
        `max_bytes` raises `BlobTooLarge`, and on any error nothing is stored."""
        writer = self.begin(expected_sha256, max_bytes)
        try:
            yield writer
            writer.commit()
        finally:
            writer.discard()

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; returns its sha256."""
        writer = self.begin(None, len(data))
        try:
            writer.write(data)
            writer.commit()
        finally:
            writer.discard()
        return writer.sha256

    def link_file(self, source: Path, sha256: str) -> None:
        """Store the file at `source`, which must hash to `sha256`, as a second name
        of the same file (no copy: a training state can be hundreds of MB); copied
        where the store is on another filesystem."""
        target = self.location(sha256)
        digest = hashlib.sha256()
        with open(source, "rb") as handle:
            while chunk := handle.read(COPY_CHUNK):
                digest.update(chunk)
        found = digest.hexdigest()
        if found != sha256:
            raise BlobHashMismatch(f"{source.name} hashes to {found}, not {sha256}")
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except FileExistsError:
            pass
        except OSError:  # another filesystem, or one without hard links
            self.put_file(source)

    def put_file(self, source: Path) -> str:
        """Copy the file at `source` into the store, hashing while copying."""
        with open(source, "rb") as src:
            # the file may grow while we copy: take what was there when we started
            size = os.fstat(src.fileno()).st_size
            writer = self.begin(None, size)
            try:
                remaining = size
                while remaining:
                    chunk = src.read(min(COPY_CHUNK, remaining))
                    if not chunk:
                        raise BlobStoreError(f"{source} shrank while it was being copied")
                    writer.write(chunk)
                    remaining -= len(chunk)
                writer.commit()
            finally:
                writer.discard()
        return writer.sha256
