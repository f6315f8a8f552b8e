"""A trickling blob server: a peer that accepts a fetch and then sends a byte now and
then is cut off at the fetch's deadline (a minimum rate over the whole blob), and a
cancelled fetch ends at once although it runs in a thread; nothing half-fetched is
kept. And a flood of streams on our protocols is refused past a cap."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from factories import peer_id_of
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.inbound import InboundLimiter
from node.work.blobs import BlobStore, TransferError, make_request
from node.work.blobs.grants import FIXED_S, MIN_RATE, _direct, fetch_deadline_s
from protocol import seal
from protocol.blobs import BlobGrant

SHA = "ab" * 32


class Trickler:
    """Accepts a fetch, announces a 1,000-byte response header, then sends it one byte
    every `every` seconds: alive, never done."""

    def __init__(self, every: float = 0.2) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.every = every
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.sendall(struct.pack(">I", 1000))
            while not self.stop.is_set():
                try:
                    conn.sendall(b" ")
                except OSError:
                    return
                time.sleep(self.every)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _request(port: int) -> bytes:
    owner, worker = SigningKey(b"o" * 32), SigningKey(b"w" * 32)
    grant = BlobGrant(
        "0123456789abcdef", "fedcba9876543210", peer_id_of(owner), peer_id_of(worker), [SHA],
        1 << 20, time.time() + 60, data_port=port,
    )  # fmt: skip
    return make_request(Identity(worker), seal(grant, owner), SHA)


def _fetch(trickler: Trickler, store: BlobStore, deadline_s: float) -> None:
    ctx = SimpleNamespace(blobs=store, download_cap=None)  # no cap: the deadline alone
    return _direct(
        "127.0.0.1", trickler.port, _request(trickler.port), b"k" * 32, ctx, SHA, 1 << 20,
        deadline_s, "too slow (test)",
    )  # fmt: skip


def test_the_deadline_follows_the_minimum_rate() -> None:
    assert fetch_deadline_s(0) == FIXED_S
    assert fetch_deadline_s(100 * MIN_RATE) == FIXED_S + 100


def test_a_trickling_peer_is_cut_off_at_the_deadline(tmp_path: Path) -> None:
    trickler, store = Trickler(), BlobStore(tmp_path, durable=False)
    started = time.monotonic()
    try:
        with pytest.raises(TransferError, match="too slow") as err:
            trio.run(_fetch, trickler, store, 2.0)
    finally:
        trickler.close()
    assert err.value.reason == "cut_off"
    assert 1.5 < time.monotonic() - started < 10
    assert not store.has(SHA)
    assert not any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))


def test_a_cancelled_fetch_ends_at_once(tmp_path: Path) -> None:
    trickler, store = Trickler(), BlobStore(tmp_path, durable=False)

    async def cancelled() -> float:
        started = trio.current_time()
        with trio.move_on_after(1.0):
            await _fetch(trickler, store, 600.0)
        return trio.current_time() - started

    try:
        took = trio.run(cancelled)
    finally:
        trickler.close()
    assert took < 5, f"the cancelled fetch took {took:.1f} s to end"
    assert not store.has(SHA)


def test_streams_past_the_caps_are_refused() -> None:
    limiter = InboundLimiter(per_peer=2, total=3)
    with limiter.slot("a", "/p") as one, limiter.slot("a", "/p") as two:
        with limiter.slot("a", "/p") as three:
            assert (one, two, three) == (True, True, False)
        with limiter.slot("b", "/p") as other, limiter.slot("c", "/p") as full:
            assert (other, full) == (True, False)
    assert limiter.open_streams == 0 and limiter.refused["/p"] == 2
    with limiter.slot("a", "/p") as again:
        assert again
