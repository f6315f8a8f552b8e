"""Blob transfer over real sockets on 127.0.0.1: the direct data channel (a BlobServer
thread and the blocking client in one process), a lying server, and the libp2p
fallback between two MeshHosts in one trio run. Every refusal must name its reason and
leave nothing stored on the fetching side."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from nacl.signing import SigningKey

from node.demo.localnet import free_port
from node.identity import Identity
from node.net.host import MeshHost
from node.work import blobs as transfer
from node.work.blobs import (
    CHUNK_SIZE,
    MAX_CHUNK_FRAME,
    BlobServer,
    BlobStore,
    RateCap,
    TransferCorrupt,
    TransferError,
    TransferRefused,
    TransferUnreachable,
    fetch_blob_direct,
    fetch_blob_libp2p,
    make_request,
    mbit_s,
    serve_blobs_libp2p,
)
from node.work.blobs import server as blob_server
from node.work.blobs.auth import seal_request
from protocol import (
    BlobGrant,
    BlobRequest,
    StreamEncryptor,
    decode,
    encode,
    new_job_key,
    seal,
)

JOB, UNIT = "026ab639c21df8aa", "d1b608530bb248d3"
KEY = new_job_key()
BIG = 1 << 30
_LEN = struct.Struct(">I")


def identity() -> Identity:
    return Identity(SigningKey.generate())


def grant(
    owner: Identity,
    grantee: Identity,
    blobs: list[str],
    *,
    job: str = JOB,
    max_bytes: int = BIG,
    expires_in: float = 60.0,
) -> bytes:
    g = BlobGrant(
        job_id=job,
        unit_id=UNIT,
        owner=owner.peer_id,
        grantee=grantee.peer_id,
        blobs=blobs,
        max_bytes=max_bytes,
        expires_at=time.time() + expires_in,
    )
    return seal(g, owner.signing_key)


def stored(store: BlobStore) -> list[Path]:
    """Every file in a store, temporary files included."""
    return sorted(p for p in store.root.rglob("*") if p.is_file())


class Setup:
    """An owner serving blobs on the direct channel, and a worker with an empty store."""

    def __init__(self, tmp: Path) -> None:
        self.owner, self.worker = identity(), identity()
        self.owner_store = BlobStore(tmp / "owner", durable=False)
        self.worker_store = BlobStore(tmp / "worker", durable=False)
        self.data = os.urandom(3 * CHUNK_SIZE + 12345)  # a partial last chunk
        self.sha = self.owner_store.put_bytes(self.data)
        self.keys = {(JOB, UNIT): KEY}
        self.server = BlobServer(
            self.owner_store, self.owner, "127.0.0.1", 0, lambda j, u: self.keys.get((j, u))
        )
        self.port = self.server.start()

    def grant(self, **kwargs) -> bytes:
        return grant(self.owner, self.worker, [self.sha], **kwargs)

    def fetch(self, request: bytes | None = None, max_bytes: int = BIG, **kwargs) -> Path:
        request = request or make_request(self.worker, self.grant(), self.sha)
        return fetch_blob_direct(
            "127.0.0.1", self.port, request, KEY, self.worker_store, self.sha, max_bytes, **kwargs
        )

    def refused(self, request: bytes) -> str:
        with pytest.raises(TransferRefused) as info:
            self.fetch(request)
        assert stored(self.worker_store) == []
        return info.value.reason


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    try:
        yield s
    finally:
        s.server.stop()


# -- the direct channel -------------------------------------------------------------------


@pytest.mark.parametrize("pipeline", [True, False])
def test_direct_transfer(setup: Setup, pipeline: bool) -> None:
    path = setup.fetch(pipeline=pipeline)
    assert path == setup.worker_store.path(setup.sha)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == setup.sha
    assert path.read_bytes() == setup.data
    assert stored(setup.worker_store) == [path]


@pytest.mark.parametrize("size", [0, 1, CHUNK_SIZE, 2 * CHUNK_SIZE])
def test_direct_transfer_sizes_at_chunk_edges(setup: Setup, size: int) -> None:
    data = os.urandom(size)
    sha = setup.owner_store.put_bytes(data)
    g = grant(setup.owner, setup.worker, [sha])
    request = make_request(setup.worker, g, sha)
    path = fetch_blob_direct("127.0.0.1", setup.port, request, KEY, setup.worker_store, sha, BIG)
    assert path.read_bytes() == data


def test_serving_runs_both_ways(setup: Setup) -> None:
    """The worker serves its result weights to the owner the same way."""
    weights = b"safetensors weights" * 10_000
    sha = setup.worker_store.put_bytes(weights)
    server = BlobServer(setup.worker_store, setup.worker, "127.0.0.1", 0, lambda j, u: KEY)
    with server:
        g = grant(setup.worker, setup.owner, [sha])
        request = make_request(setup.owner, g, sha)
        path = fetch_blob_direct(
            "127.0.0.1", server.port, request, KEY, setup.owner_store, sha, BIG
        )
    assert path.read_bytes() == weights


def ask(setup: Setup, request: bytes, sealed: bool = True) -> dict:
    """Send a request the client would refuse to send (it checks its own grant),
    sealed to the server as the client seals it, and return the server's answer frame."""
    if sealed:
        request = seal_request(request, setup.owner.peer_id)
    with socket.create_connection(("127.0.0.1", setup.port), timeout=5) as sock:
        sock.sendall(frame(request))
        (n,) = _LEN.unpack(sock.recv(4, socket.MSG_WAITALL))
        return decode(sock.recv(n, socket.MSG_WAITALL))


def test_request_without_a_valid_grant(setup: Setup) -> None:
    garbage = make_request(setup.worker, b"\x81\xa1t\xa3xyz", setup.sha)
    assert ask(setup, garbage)["error"] == "bad_grant"
    forged = bytearray(setup.grant())
    forged[-1] ^= 1  # the owner's signature no longer verifies
    answer = ask(setup, make_request(setup.worker, bytes(forged), setup.sha))
    assert answer["error"] == "bad_grant"
    assert "signature" in answer["detail"]
    # and the client will not even send a request whose grant it cannot read
    with pytest.raises(ValueError, match="not a valid blob request"):
        setup.fetch(garbage)


def test_unsigned_or_garbage_requests(setup: Setup) -> None:
    assert ask(setup, b"\x00" * 50)["error"] == "malformed"
    # a request in the clear (or sealed to someone else) is not even read
    genuine = make_request(setup.worker, setup.grant(), setup.sha)
    assert ask(setup, genuine, sealed=False)["error"] == "undecryptable"
    to_another = seal_request(genuine, setup.worker.peer_id)
    assert ask(setup, to_another, sealed=False)["error"] == "undecryptable"
    request = bytearray(make_request(setup.worker, setup.grant(), setup.sha))
    request[-1] ^= 1
    assert ask(setup, bytes(request))["error"] == "bad_signature"


def test_grant_sealed_by_another_node(setup: Setup) -> None:
    other = identity()
    g = grant(other, setup.worker, [setup.sha])
    # sealed to the grant's owner, which this server is not: it cannot even read it
    assert setup.refused(make_request(setup.worker, g, setup.sha)) == "undecryptable"
    # claiming to be the owner inside a grant someone else signed changes nothing
    lie = BlobGrant(JOB, UNIT, setup.owner.peer_id, setup.worker.peer_id, [setup.sha], BIG, 2e9)
    g = seal(lie, other.signing_key)
    assert setup.refused(make_request(setup.worker, g, setup.sha)) == "foreign_grant"


def test_another_jobs_grant_or_another_blobs_sha(setup: Setup) -> None:
    other_sha = setup.owner_store.put_bytes(b"another job's data")
    g = grant(setup.owner, setup.worker, [other_sha], job="0e753487879fb8a9")
    # job-2's grant does not name this job's blob ...
    assert setup.refused(make_request(setup.worker, g, setup.sha)) == "not_granted"
    # ... and this node holds no key for job-2 (a finished or unknown job)
    request = make_request(setup.worker, g, other_sha)
    with pytest.raises(TransferRefused) as info:
        fetch_blob_direct("127.0.0.1", setup.port, request, KEY, setup.worker_store, other_sha, BIG)
    assert info.value.reason == "unknown_job"
    assert stored(setup.worker_store) == []


def test_expired_grant(setup: Setup) -> None:
    g = setup.grant(expires_in=-1)
    assert setup.refused(make_request(setup.worker, g, setup.sha)) == "expired"


def test_request_signed_by_someone_other_than_the_grantee(setup: Setup) -> None:
    thief = identity()
    assert setup.refused(make_request(thief, setup.grant(), setup.sha)) == "not_grantee"


def test_stale_and_replayed_requests(setup: Setup) -> None:
    old = BlobRequest(setup.grant(), setup.sha, time.time() - 3600, os.urandom(16))
    assert setup.refused(seal(old, setup.worker.signing_key)) == "stale"
    request = make_request(setup.worker, setup.grant(), setup.sha)
    setup.fetch(request)
    setup.worker_store.path(setup.sha).unlink()
    assert setup.refused(request) == "replay"


def test_request_from_the_future_is_stale(setup: Setup) -> None:
    request = make_request(setup.worker, setup.grant(), setup.sha)
    auth = partial(
        transfer.authorize,
        request,
        our_peer_id=setup.owner.peer_id,
        store=setup.owner_store,
        job_key_for=lambda j, u: KEY,
    )
    assert auth(now=time.time()).size == len(setup.data)
    with pytest.raises(transfer.Refusal) as info:
        auth(now=time.time() - transfer.CLOCK_SKEW_S - 5)  # our clock is behind theirs
    assert info.value.reason == "stale"


def test_replay_guard_forgets_old_nonces_and_stays_bounded() -> None:
    guard = transfer.ReplayGuard(max_entries=2)
    now = time.time()
    guard.remember(b"a" * 16, now, now)
    guard.remember(b"b" * 16, now, now)
    with pytest.raises(transfer.Refusal, match="replay"):
        guard.remember(b"a" * 16, now, now)
    with pytest.raises(transfer.Refusal, match="busy"):  # full of live nonces
        guard.remember(b"c" * 16, now, now)
    later = now + transfer.REQUEST_MAX_AGE_S + transfer.CLOCK_SKEW_S + 1
    guard.remember(b"c" * 16, later, later)  # the old ones are stale by now: dropped


def test_blob_not_stored_or_over_the_grant(setup: Setup) -> None:
    missing = hashlib.sha256(b"never stored").hexdigest()
    g = grant(setup.owner, setup.worker, [missing])
    with pytest.raises(TransferRefused) as info:
        fetch_blob_direct(
            "127.0.0.1",
            setup.port,
            make_request(setup.worker, g, missing),
            KEY,
            setup.worker_store,
            missing,
            BIG,
        )
    assert info.value.reason == "not_found"
    g = setup.grant(max_bytes=1000)
    assert setup.refused(make_request(setup.worker, g, setup.sha)) == "too_large"


def test_oversized_request_frame_is_refused(setup: Setup) -> None:
    with socket.create_connection(("127.0.0.1", setup.port), timeout=5) as sock:
        sock.sendall(_LEN.pack(10**9))  # refused from the length alone
        (n,) = _LEN.unpack(sock.recv(4, socket.MSG_WAITALL))
        assert decode(sock.recv(n, socket.MSG_WAITALL))["error"] == "oversized"


def test_a_trickled_request_is_cut_off(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blob_server, "REQUEST_TIMEOUT_S", 0.3)  # read where BlobServer uses it
    with socket.create_connection(("127.0.0.1", setup.port), timeout=5) as sock:
        sock.sendall(b"\x00\x00")  # half a length, then nothing
        t0 = time.monotonic()
        assert sock.recv(1) == b""  # the server hangs up once the whole-request deadline passes
        assert time.monotonic() - t0 < 4


def test_server_announcing_more_than_max_bytes(setup: Setup) -> None:
    with pytest.raises(TransferCorrupt) as info:
        setup.fetch(max_bytes=len(setup.data) - 1)
    assert info.value.reason == "oversized"
    assert stored(setup.worker_store) == []


def test_busy_server(setup: Setup) -> None:
    server = BlobServer(
        setup.owner_store, setup.owner, "127.0.0.1", 0, lambda j, u: KEY, max_connections=0
    )
    with server:
        request = make_request(setup.worker, setup.grant(), setup.sha)
        with pytest.raises(TransferError) as info:
            fetch_blob_direct(
                "127.0.0.1", server.port, request, KEY, setup.worker_store, setup.sha, BIG
            )
    # the refusal frame or, if the kernel resets first, a connection error
    assert info.value.reason in ("busy", "connection")
    assert stored(setup.worker_store) == []


def test_one_address_cannot_take_every_transfer_slot(setup: Setup) -> None:
    """Idle connections from one address hold at most MAX_CONNECTIONS_PER_ADDRESS
    slots; the next is refused as busy while the server still has room."""
    held = [socket.create_connection(("127.0.0.1", setup.port)) for _ in range(4)]
    try:
        request = make_request(setup.worker, setup.grant(), setup.sha)
        deadline = time.monotonic() + 10
        while True:  # the accept loop registers the held connections as it gets to them
            try:
                setup.fetch(request)
            except TransferError as exc:
                assert exc.reason in ("busy", "connection")
                break
            assert time.monotonic() < deadline, "a fifth connection was served"
            setup.worker_store.remove(setup.sha)
            request = make_request(setup.worker, setup.grant(), setup.sha)
    finally:
        for conn in held:
            conn.close()


def test_stopped_server_cannot_be_dialled(setup: Setup) -> None:
    setup.server.stop()
    with pytest.raises(TransferUnreachable):
        setup.fetch()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", setup.port)) != 0


def test_a_blob_already_stored_is_not_fetched_again(setup: Setup) -> None:
    setup.worker_store.put_bytes(setup.data)
    setup.server.stop()  # no server needed
    assert setup.fetch().read_bytes() == setup.data


# -- a lying server ---------------------------------------------------------------------


def lying_server(script: Callable[[socket.socket], None]) -> tuple[int, threading.Thread]:
    """Accepts one connection, reads the request frame, then runs `script`."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def run() -> None:
        with listener, contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                (n,) = _LEN.unpack(conn.recv(4, socket.MSG_WAITALL))
                conn.recv(n, socket.MSG_WAITALL)
                script(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def sends(
    data: bytes,
    announce: int | None = None,
    key: bytes = KEY,
    final: bool = True,
    ad: bytes | None = None,
) -> Callable[[socket.socket], None]:
    """A script that announces `announce` bytes and sends `data` in 64 KiB chunks,
    encrypted under `key` for the blob id `ad` (default: the sha256 of `data`)."""
    ad = ad or hashlib.sha256(data).digest()

    def script(conn: socket.socket) -> None:
        enc = StreamEncryptor(key)
        size = len(data) if announce is None else announce
        conn.sendall(frame(encode({"size": size, "stream": enc.header})))
        pieces = [data[i : i + 65536] for i in range(0, len(data), 65536)] or [b""]
        for i, piece in enumerate(pieces):
            last = final and i == len(pieces) - 1
            conn.sendall(frame(enc.push(piece, final=last, ad=ad)))

    return script


def fetch_from_liar(
    tmp_path: Path,
    script: Callable[[socket.socket], None],
    sha: str,
    timeout: float = 10.0,
    release: threading.Event | None = None,
) -> TransferError:
    """Fetch `sha` from a lying server; returns the error. `release` is set once the
    client has given up (for scripts that hold the connection open)."""
    worker, owner = identity(), identity()
    store = BlobStore(tmp_path / "w", durable=False)
    port, thread = lying_server(script)
    request = make_request(worker, grant(owner, worker, [sha]), sha)
    try:
        with pytest.raises(TransferError) as info:
            fetch_blob_direct("127.0.0.1", port, request, KEY, store, sha, BIG, timeout=timeout)
    finally:
        if release is not None:
            release.set()
        thread.join(10)
    assert stored(store) == []
    return info.value


def test_liar_sends_more_than_it_announced(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    error = fetch_from_liar(tmp_path, sends(data, announce=200_000), _sha(data))
    assert isinstance(error, TransferCorrupt) and error.reason == "oversized"


def test_liar_stops_before_the_final_chunk(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    error = fetch_from_liar(tmp_path, sends(data, final=False), _sha(data))
    assert error.reason == "truncated"


def test_liar_sends_other_bytes(tmp_path: Path) -> None:
    wanted, other = os.urandom(1000), os.urandom(1000)
    # correctly encrypted under the job key, for the wanted blob's id, but other bytes
    script = sends(other, ad=hashlib.sha256(wanted).digest())
    error = fetch_from_liar(tmp_path, script, _sha(wanted))
    assert error.reason == "hash_mismatch"


def test_liar_without_the_job_key(tmp_path: Path) -> None:
    data = os.urandom(1000)
    error = fetch_from_liar(tmp_path, sends(data, key=new_job_key()), _sha(data))
    assert error.reason == "undecryptable"


def test_liar_sends_a_huge_chunk_frame(tmp_path: Path) -> None:
    def script(conn: socket.socket) -> None:
        enc = StreamEncryptor(KEY)
        conn.sendall(frame(encode({"size": 10, "stream": enc.header})))
        conn.sendall(_LEN.pack(MAX_CHUNK_FRAME + 1))

    error = fetch_from_liar(tmp_path, script, _sha(b"x"))
    assert error.reason == "oversized"


def test_liar_refuses_with_an_unknown_reason(tmp_path: Path) -> None:
    def script(conn: socket.socket) -> None:
        conn.sendall(frame(encode({"error": "x" * 300, "detail": "made up"})))

    error = fetch_from_liar(tmp_path, script, _sha(b"x"))
    assert isinstance(error, TransferRefused)
    assert error.reason == "refused"  # a peer's words never become a metrics label


def test_silent_server_times_out(tmp_path: Path) -> None:
    release = threading.Event()
    error = fetch_from_liar(tmp_path, lambda conn: release.wait(10), _sha(b"x"), 0.3, release)
    assert error.reason == "timeout"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the libp2p fallback -----------------------------------------------------------------


@pytest.mark.process
def test_libp2p_fallback(tmp_path: Path) -> None:
    """Two hosts in one trio run (one start/stop cycle for all the cases: py-libp2p
    leaks a little per host cycle)."""
    owner, worker = identity(), identity()
    owner_store = BlobStore(tmp_path / "owner", durable=False)
    worker_store = BlobStore(tmp_path / "worker", durable=False)
    data = os.urandom(2 * CHUNK_SIZE + 777)
    sha = owner_store.put_bytes(data)
    stranger = identity()

    async def main() -> dict[str, str]:
        reasons: dict[str, str] = {}
        async with (
            MeshHost.start(owner, f"/ip4/127.0.0.1/tcp/{free_port()}") as a,
            MeshHost.start(worker, f"/ip4/127.0.0.1/tcp/{free_port()}") as b,
        ):
            serve_blobs_libp2p(a, owner_store, lambda j, u: KEY if (j, u) == (JOB, UNIT) else None)
            await b.connect(a.addrs()[0])

            async def fetch(request: bytes, max_bytes: int = BIG) -> Path:
                return await fetch_blob_libp2p(
                    b, owner.peer_id, request, KEY, worker_store, sha, max_bytes, timeout=10
                )

            good = grant(owner, worker, [sha])
            path = await fetch(make_request(worker, good, sha))
            reasons["ok"] = _sha(path.read_bytes())
            path.unlink()

            for name, request in (
                # a grant for someone else, asked for by the worker under its own name
                ("wrong_grantee", make_request(worker, grant(owner, stranger, [sha]), sha)),
                # the stranger's own request, sent over the worker's connection
                ("stolen_request", make_request(stranger, grant(owner, stranger, [sha]), sha)),
                ("foreign", make_request(worker, grant(stranger, worker, [sha]), sha)),
            ):
                try:
                    await fetch(request)
                except TransferRefused as exc:
                    reasons[name] = exc.reason
            try:
                await fetch(make_request(worker, good, sha), max_bytes=100)
            except TransferCorrupt as exc:
                reasons["small_cap"] = exc.reason
            try:
                await fetch_blob_libp2p(
                    b, stranger.peer_id, make_request(worker, good, sha), KEY, worker_store, sha,
                    BIG, timeout=2,
                )  # fmt: skip
            except TransferUnreachable:
                reasons["unknown_peer"] = "unreachable"
        return reasons

    reasons = trio.run(main)
    assert reasons == {
        "ok": sha,
        "wrong_grantee": "not_grantee",
        "stolen_request": "signer_mismatch",
        "foreign": "foreign_grant",
        "small_cap": "oversized",
        "unknown_peer": "unreachable",
    }
    assert stored(worker_store) == []


def test_fetch_slots_cap_fetches_per_peer_and_in_all() -> None:
    from node.work.blobs import MAX_FETCHES, MAX_FETCHES_PER_PEER, fetch_slots

    peak: dict[str, int] = {}
    now: dict[str, int] = {}

    async def fetch(peer: str, release: trio.Event) -> None:
        async with fetch_slots().hold(peer):
            for key in (peer, "all"):
                now[key] = now.get(key, 0) + 1
                peak[key] = max(peak.get(key, 0), now[key])
            await release.wait()
            for key in (peer, "all"):
                now[key] -= 1

    async def main() -> None:
        release = trio.Event()
        async with trio.open_nursery() as nursery:
            # the hog asks first (trio may run tasks started together in any order)
            for _ in range(3 * MAX_FETCHES):
                nursery.start_soon(fetch, "hog", release)
            await trio.testing.wait_all_tasks_blocked()
            assert now == {"hog": MAX_FETCHES_PER_PEER, "all": MAX_FETCHES_PER_PEER}
            for i in range(3 * MAX_FETCHES):
                nursery.start_soon(fetch, f"peer{i}", release)
            await trio.testing.wait_all_tasks_blocked()
            assert now["all"] == MAX_FETCHES and now["hog"] == MAX_FETCHES_PER_PEER
            release.set()
        assert fetch_slots()._per_peer == {}  # nothing left behind once all are done

    trio.run(main)
    assert peak["hog"] == MAX_FETCHES_PER_PEER and peak["all"] == MAX_FETCHES


# -- the volunteer's rate caps ------------------------------------------------------------


def test_a_rate_cap_books_bytes_at_its_rate_after_a_quarter_second_burst() -> None:
    clock = [100.0]
    rate = [1000.0]
    cap = RateCap(lambda: rate[0], clock=lambda: clock[0])
    assert cap._wait_s(250) == 0  # a quarter second's bytes pass at once
    assert cap._wait_s(500) == pytest.approx(0.5)  # then at the rate
    clock[0] += 10  # idle: no credit beyond the burst piles up
    assert cap._wait_s(1250) == pytest.approx(1.0)
    rate[0] = 0  # the volunteer lifted the cap: applies at once
    assert cap._wait_s(10**9) == 0


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_real_transfer_keeps_to_the_cap(tmp_path: Path, direction: str) -> None:
    """2 MiB over real TCP at a 4 Mbit/s cap, on the server's side (upload) or the
    fetcher's (download): within 10% of the cap above (a quarter second's burst is 6%
    of this blob), and not far below it."""
    cap_bytes = mbit_s(4)
    owner, worker = identity(), identity()
    owner_store = BlobStore(tmp_path / "owner", durable=False)
    worker_store = BlobStore(tmp_path / "worker", durable=False)
    data = os.urandom(2 * 2**20)
    sha = owner_store.put_bytes(data)
    up = RateCap(lambda: cap_bytes) if direction == "upload" else None
    down = RateCap(lambda: cap_bytes) if direction == "download" else None
    server = BlobServer(owner_store, owner, "127.0.0.1", 0, lambda j, u: KEY, rate=up)
    with server:
        request = make_request(worker, grant(owner, worker, [sha]), sha)
        started = time.monotonic()
        path = fetch_blob_direct(
            "127.0.0.1", server.port, request, KEY, worker_store, sha, BIG, rate=down
        )
        rate = len(data) / (time.monotonic() - started)
    assert path.read_bytes() == data
    print(f"{direction}: {rate / cap_bytes:.3f} of the cap")
    assert 0.75 * cap_bytes <= rate <= 1.1 * cap_bytes


def test_an_owner_that_cannot_be_dialled_is_unreachable_not_a_failure(tmp_path: Path) -> None:
    """An owner killed while its worker fetches a unit's data: the dial's `HostError`
    is `TransferUnreachable`, which the worker waits out (the owner may be restarting),
    not an error that fails the unit (seen when an owner was SIGKILLed mid-fetch)."""
    from types import SimpleNamespace

    from node.net.host import HostError
    from node.work.blobs.grants import fetch_granted

    class Gone:
        def path_to(self, peer_id: str) -> str:
            return "none"

        async def reach(self, peer_id: str) -> None:
            raise HostError(f"could not connect to {peer_id}: SwarmDialAllFailedError")

    party = SimpleNamespace(
        peer_id="worker",
        data_port=0,
        identity=Identity(SigningKey.generate()),
        blobs=BlobStore(tmp_path),
        host=Gone(),
        download_cap=None,
        path_to=lambda peer_id: "none",
        peer_ip=lambda peer_id: None,
    )
    grant = SimpleNamespace(data_port=0)
    sha = hashlib.sha256(b"data").hexdigest()
    fetch = partial(fetch_granted, party, "owner", grant, b"grant", b"k" * 32, [sha], 1024, 1024)
    with pytest.raises(TransferUnreachable, match="could not connect to owner"):
        trio.run(fetch)
