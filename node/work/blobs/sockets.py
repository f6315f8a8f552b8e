"""Blocking I/O for the direct data channel, shared by `BlobServer` and
`fetch_blob_direct`: frames over plain sockets, and `_Ahead`, which runs one stage of a
transfer in a helper thread so that stages overlap."""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO, Generic, TypeVar

from node.work.blobs.auth import TransferCorrupt
from node.work.blobs.frames import _LEN
from protocol import TooLarge

#: chunks a pipeline stage may run ahead of the next one
PIPELINE_DEPTH = 4

T = TypeVar("T")


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
