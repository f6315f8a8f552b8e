"""Blob transfer: the direct data channel and the libp2p fallback against raw TCP.

    .venv/bin/python -m benchmarks.transfer [--mib 256] [--runs 3] [--sweep]

One blob of `--mib` MiB of random bytes moves between two processes on 127.0.0.1,
`--runs` times per path (the libp2p connection is opened before timing, as a node
has it open before it fetches):

- **raw TCP**, the baseline: the server reads the blob file in 1 MiB pieces and
  `sendall`s them; the client `recv_into`s one buffer and drops the bytes.
- **direct**: `BlobServer` in one process, `fetch_blob_direct` in the other: request
  signing and checks, secretstream encryption and decryption, sha256, the write into
  the fetcher's `BlobStore` and its fsync + atomic rename (as a node does it).
- **libp2p**: one `MeshHost` per process, `serve_blobs_libp2p` / `fetch_blob_libp2p`
  over `/meshminer/blob/1` (Noise + Yamux), same encryption, hashing and store.

Time is the fetcher's wall time for one blob; CPU is user + system seconds of each
process over that transfer (all threads). Each round runs every path once, back to
back, each with fresh processes; the ratio is the median of the per-round ratios, so
load from other work on the machine skews it less; each run also waits (up to
`--quiet-wait` s) for the machine to be `--quiet` idle first, and records what it saw.
`--sweep` adds the direct channel with other chunk sizes, without the pipelining
threads, without fsync, and each side alone: the fetcher against a server replaying a
stream encrypted in advance, the server against a client that drops the bytes (what
each side reaches when it does not share the cores with the other, as between two
machines). Before the transfers, single-thread rates of each stage
(encrypt, decrypt, sha256, page-cache write, fsync) are measured in this process:
they bound what any pipeline can reach.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import multiprocessing as mp
import os
import platform
import resource
import shutil
import socket
import statistics
import tempfile
import threading
import time
from importlib.metadata import version
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from benchmarks.harness import Result, console
from node.demo.localnet import free_port
from node.identity import Identity
from node.work.blobs import (
    CHUNK_SIZE,
    BlobServer,
    BlobStore,
    fetch_blob_direct,
    fetch_blob_libp2p,
    make_request,
    serve_blobs_libp2p,
)
from protocol import (
    REQUEST_LIMITS,
    BlobGrant,
    StreamDecryptor,
    StreamEncryptor,
    encode,
    new_job_key,
    seal,
)

MB = 1e6
BASELINE = "raw TCP (baseline)"
JOB, UNIT = "bench-job", "bench-unit"
_SPAWN = mp.get_context("spawn")  # clean processes: one libp2p host per process


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _answer(conn: Connection, stop: threading.Event | None = None) -> None:
    """Serve the parent's questions ("cpu", "stop") until told to stop."""
    while True:
        message = conn.recv()
        if message == "cpu":
            conn.send(cpu_s())
        else:
            conn.send("bye")
            if stop is not None:
                stop.set()
            return


# -- servers (each in its own process) -------------------------------------------------------


def raw_server(conn: Connection, cfg: dict[str, Any]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    path = Path(cfg["blob_path"])

    def serve() -> None:
        buf = bytearray(CHUNK_SIZE)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with client, open(path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    client.sendall(memoryview(buf)[:n])

    threading.Thread(target=serve, daemon=True).start()
    conn.send(listener.getsockname()[1])
    _answer(conn)
    listener.close()


def direct_server(conn: Connection, cfg: dict[str, Any]) -> None:
    owner = Identity(SigningKey(cfg["owner_seed"]))
    store = BlobStore(Path(cfg["owner_dir"]))
    key = cfg["job_key"]
    server = BlobServer(
        store,
        owner,
        "127.0.0.1",
        0,
        lambda j, u: key,
        chunk_size=cfg.get("chunk_size", CHUNK_SIZE),
        pipeline=cfg.get("server_pipeline", cfg.get("pipeline", True)),
    )
    conn.send(server.start())
    _answer(conn)
    server.stop()


def replay_server(conn: Connection, cfg: dict[str, Any]) -> None:
    """Answers every request with one stream encrypted in advance: the fetcher's side of
    the direct channel alone, with (almost) no CPU spent by the server."""
    store = BlobStore(Path(cfg["owner_dir"]))
    enc = StreamEncryptor(cfg["job_key"])
    ad, frames = bytes.fromhex(cfg["sha"]), []
    with store.open(cfg["sha"]) as f:
        remaining = cfg["size"]
        while True:
            piece = f.read(min(CHUNK_SIZE, remaining))
            remaining -= len(piece)
            frames.append(_frame(enc.push(piece, final=remaining == 0, ad=ad)))
            if remaining == 0:
                break
    header = _frame(encode({"size": cfg["size"], "stream": enc.header}))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with client:
                # read the whole request (unread bytes would turn our close into a reset)
                length = int.from_bytes(client.recv(4, socket.MSG_WAITALL), "big")
                client.recv(min(length, REQUEST_LIMITS.max_bytes), socket.MSG_WAITALL)
                client.sendall(header)
                for frame in frames:
                    client.sendall(frame)

    threading.Thread(target=serve, daemon=True).start()
    conn.send(listener.getsockname()[1])
    _answer(conn)
    listener.close()


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def libp2p_server(conn: Connection, cfg: dict[str, Any]) -> None:
    import trio

    from node.net.host import MeshHost

    owner = Identity(SigningKey(cfg["owner_seed"]))
    store = BlobStore(Path(cfg["owner_dir"]))
    key = cfg["job_key"]

    async def main() -> None:
        async with MeshHost.start(owner, f"/ip4/127.0.0.1/tcp/{free_port()}") as mesh:
            serve_blobs_libp2p(mesh, store, lambda j, u: key)
            conn.send(mesh.addrs()[0])
            await trio.to_thread.run_sync(_answer, conn)

    trio.run(main)


# -- clients (each in its own process; one fetch per "go") ------------------------------------


def _timed(fetch, conn: Connection, store: BlobStore, sha: str) -> None:
    while conn.recv() == "go":
        c0, t0 = cpu_s(), time.perf_counter()
        fetch()
        seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
        if store is not None:
            ok = hashlib.sha256(store.path(sha).read_bytes()).hexdigest() == sha
            store.path(sha).unlink()
        else:
            ok = True
        conn.send({"seconds": seconds, "client_cpu_s": cpu, "ok": ok})


def raw_client(conn: Connection, cfg: dict[str, Any]) -> None:
    port, size = cfg["address"], cfg["size"]

    def fetch() -> None:
        buf = bytearray(CHUNK_SIZE)
        got = 0
        with socket.create_connection(("127.0.0.1", port)) as sock:
            while n := sock.recv_into(buf):
                got += n
        assert got == size, f"raw TCP moved {got} of {size} bytes"

    _timed(fetch, conn, None, "")  # type: ignore[arg-type]


def direct_client(conn: Connection, cfg: dict[str, Any]) -> None:
    worker = Identity(SigningKey(cfg["worker_seed"]))
    store = BlobStore(Path(cfg["worker_dir"]), durable=cfg.get("durable", True))
    sha, grant, key, port = cfg["sha"], cfg["grant"], cfg["job_key"], cfg["address"]

    def fetch() -> None:
        request = make_request(worker, grant, sha)
        fetch_blob_direct(
            "127.0.0.1", port, request, key, store, sha, 1 << 40, pipeline=cfg["pipeline"]
        )

    _timed(fetch, conn, store, sha)


def discard_client(conn: Connection, cfg: dict[str, Any]) -> None:
    """Requests the blob from a real BlobServer and drops the encrypted bytes: the
    serving side of the direct channel alone, with (almost) no CPU spent by the client."""
    worker = Identity(SigningKey(cfg["worker_seed"]))
    sha, grant, port = cfg["sha"], cfg["grant"], cfg["address"]

    def fetch() -> None:
        buf = bytearray(CHUNK_SIZE + 64)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(_frame(make_request(worker, grant, sha)))
            got = 0
            while n := sock.recv_into(buf):
                got += n
        assert got > cfg["size"], f"the server sent only {got} bytes"

    _timed(fetch, conn, None, "")  # type: ignore[arg-type]


def libp2p_client(conn: Connection, cfg: dict[str, Any]) -> None:
    import trio

    from node.net.host import MeshHost

    worker = Identity(SigningKey(cfg["worker_seed"]))
    store = BlobStore(Path(cfg["worker_dir"]))
    sha, grant, key, addr = cfg["sha"], cfg["grant"], cfg["job_key"], cfg["address"]

    async def main() -> None:
        async with MeshHost.start(worker, f"/ip4/127.0.0.1/tcp/{free_port()}") as mesh:
            owner = await mesh.connect(addr)
            while await trio.to_thread.run_sync(conn.recv) == "go":
                c0, t0 = cpu_s(), time.perf_counter()
                request = make_request(worker, grant, sha)
                await fetch_blob_libp2p(mesh, owner, request, key, store, sha, 1 << 40)
                seconds, cpu = time.perf_counter() - t0, cpu_s() - c0
                ok = hashlib.sha256(store.path(sha).read_bytes()).hexdigest() == sha
                store.path(sha).unlink()
                conn.send({"seconds": seconds, "client_cpu_s": cpu, "ok": ok})

    trio.run(main)


# -- orchestration ----------------------------------------------------------------------------


def measure(server_fn, client_fn, cfg: dict[str, Any], runs: int) -> list[dict[str, float]]:
    """Start the server process, then a client process; time `runs` fetches."""
    s_parent, s_child = _SPAWN.Pipe()
    c_parent, c_child = _SPAWN.Pipe()
    server = _SPAWN.Process(target=server_fn, args=(s_child, cfg), daemon=True)
    server.start()
    client = None
    try:
        if not s_parent.poll(60):
            raise TimeoutError(f"{server_fn.__name__} did not start within 60 s")
        address = s_parent.recv()
        client = _SPAWN.Process(
            target=client_fn, args=(c_child, {**cfg, "address": address}), daemon=True
        )
        client.start()
        out = []
        for _ in range(runs):
            s_parent.send("cpu")
            before = s_parent.recv()
            c_parent.send("go")
            if not c_parent.poll(300):
                raise TimeoutError(f"{client_fn.__name__} did not finish within 300 s")
            result = c_parent.recv()
            s_parent.send("cpu")
            result["server_cpu_s"] = s_parent.recv() - before
            if not result["ok"]:
                raise RuntimeError(f"{client_fn.__name__}: the fetched blob does not hash right")
            out.append(result)
        return out
    finally:
        for conn in (c_parent, s_parent):
            with contextlib.suppress(OSError, ValueError):
                conn.send("stop")
        for proc in (client, server):
            if proc is not None:
                proc.join(15)
                if proc.is_alive():
                    proc.kill()


def idle_fraction(interval: float = 1.0) -> float:
    """Share of the machine's CPU time that was idle over `interval` (Linux; 1.0 elsewhere)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except OSError:
        return 1.0
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet(threshold: float, max_wait: float) -> float:
    """Wait (at most `max_wait` s) until the machine is at least `threshold` idle, so
    other work on a shared machine skews a round less; returns the idle share seen."""
    deadline = time.monotonic() + max_wait
    while True:
        idle = idle_fraction()
        if idle >= threshold or time.monotonic() >= deadline:
            return idle


def stage_rates(size: int) -> dict[str, float]:
    """Single-thread MB/s of each stage the direct channel chains, on 1 MiB chunks."""
    chunk = os.urandom(CHUNK_SIZE)
    n = max(1, size // CHUNK_SIZE)
    key = new_job_key()
    rates: dict[str, float] = {}

    enc = StreamEncryptor(key)
    t0 = time.perf_counter()
    for _ in range(n):  # each result dropped at once, as the server does
        enc.push(chunk)
    rates["secretstream encrypt"] = n * CHUNK_SIZE / (time.perf_counter() - t0) / MB

    enc = StreamEncryptor(key)
    sealed = [enc.push(chunk) for _ in range(min(n, 128))]  # made untimed, kept in order
    dec = StreamDecryptor(key, enc.header)
    t0 = time.perf_counter()
    for c in sealed:
        dec.pull(c)
    rates["secretstream decrypt"] = len(sealed) * CHUNK_SIZE / (time.perf_counter() - t0) / MB
    del sealed

    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(n):
        h.update(chunk)
    rates["sha256"] = n * CHUNK_SIZE / (time.perf_counter() - t0) / MB

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w"
        with open(path, "wb") as f:
            t0 = time.perf_counter()
            for _ in range(n):
                f.write(chunk)
            f.flush()
            rates["file write (page cache)"] = n * CHUNK_SIZE / (time.perf_counter() - t0) / MB
            t0 = time.perf_counter()
            os.fsync(f.fileno())
            rates["fsync of that file"] = n * CHUNK_SIZE / (time.perf_counter() - t0) / MB
    return rates


def summarise(runs: list[dict[str, float]], size: int) -> dict[str, float]:
    seconds = [r["seconds"] for r in runs]
    return {
        "MB/s": size / statistics.median(seconds) / MB,
        "best MB/s": size / min(seconds) / MB,
        "client CPU s": statistics.median(r["client_cpu_s"] for r in runs),
        "server CPU s": statistics.median(r["server_cpu_s"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="blob size in MiB")
    parser.add_argument("--runs", type=int, default=3, help="fetches per path")
    parser.add_argument("--sweep", action="store_true", help="also other direct-channel settings")
    parser.add_argument("--no-libp2p", action="store_true", help="skip the libp2p fallback")
    parser.add_argument("--only", default="", help="run only the paths whose name has this")
    parser.add_argument(
        "--quiet",
        type=float,
        default=0.9,
        help="before each run, wait until this share of the CPU is idle (0: don't wait)",
    )
    parser.add_argument("--quiet-wait", type=float, default=60.0, help="at most this long, s")
    args = parser.parse_args()
    size = args.mib * 1024 * 1024

    root = Path(tempfile.mkdtemp(prefix="meshminer-transfer-"))
    try:
        owner, worker = Identity(SigningKey.generate()), Identity(SigningKey.generate())
        owner_store = BlobStore(root / "owner", durable=False)
        with console.status(f"writing a {args.mib} MiB blob"):
            sha = owner_store.put_bytes(os.urandom(size))
        grant = seal(
            BlobGrant(JOB, UNIT, owner.peer_id, worker.peer_id, [sha], size, time.time() + 3600),
            owner.signing_key,
        )
        cfg: dict[str, Any] = {
            "size": size,
            "sha": sha,
            "grant": grant,
            "job_key": new_job_key(),
            "owner_seed": owner.seed,
            "worker_seed": worker.seed,
            "owner_dir": str(root / "owner"),
            "worker_dir": str(root / "worker"),
            "blob_path": str(owner_store.path(sha)),
            "pipeline": True,
        }
        with console.status("single-thread stage rates (best of 3)"):
            stages: dict[str, float] = {}
            for _ in range(3):
                if args.quiet:
                    wait_for_quiet(args.quiet, args.quiet_wait)
                for stage, rate in stage_rates(size).items():
                    stages[stage] = max(rate, stages.get(stage, 0.0))

        cases: list[tuple[str, Any, Any, dict[str, Any]]] = [
            (BASELINE, raw_server, raw_client, {}),
            ("direct channel", direct_server, direct_client, {}),
        ]
        if not args.no_libp2p:
            cases.append(("libp2p /meshminer/blob/1", libp2p_server, libp2p_client, {}))
        if args.sweep:
            cases += [
                (
                    "direct, no pipelining threads",
                    direct_server,
                    direct_client,
                    {"pipeline": False},
                ),
                ("direct, 256 KiB chunks", direct_server, direct_client, {"chunk_size": 256 << 10}),
                ("direct, 64 KiB chunks", direct_server, direct_client, {"chunk_size": 64 << 10}),
                ("direct, no fsync", direct_server, direct_client, {"durable": False}),
                ("direct, fetcher alone (replayed server)", replay_server, direct_client, {}),
                (
                    "direct, fetcher alone, no pipelining threads",
                    replay_server,
                    direct_client,
                    {"pipeline": False},
                ),
                ("direct, server alone (discarding client)", direct_server, discard_client, {}),
            ]
        # rounds interleave the paths, so a change in machine load hits all of them alike
        # and each ratio compares runs made back to back
        if args.only:
            cases = [c for c in cases if c[0] == BASELINE or args.only in c[0]]
        raw: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in cases}
        load_before = os.getloadavg()
        for round_ in range(args.runs):
            for name, server_fn, client_fn, changes in cases:
                with console.status(f"round {round_ + 1}/{args.runs}: {name}"):
                    idle = wait_for_quiet(args.quiet, args.quiet_wait) if args.quiet else 1.0
                    run = measure(server_fn, client_fn, {**cfg, **changes}, 1)[0]
                    run["idle_before"] = idle
                raw[name].append(run)
                console.log(f"round {round_ + 1}: {name}: {size / run['seconds'] / MB:.0f} MB/s")
        load_after = os.getloadavg()

        base = [size / r["seconds"] / MB for r in raw[BASELINE]]
        columns = ["path", "MB/s", "best MB/s", "ratio to raw TCP", "client CPU s", "server CPU s"]
        result = Result("transfer", columns)
        for name, runs in raw.items():
            s = summarise(runs, size)
            ratios = [size / r["seconds"] / MB / b for r, b in zip(runs, base, strict=True)]
            result.add(
                name,
                s["MB/s"],
                s["best MB/s"],
                statistics.median(ratios),
                s["client CPU s"],
                s["server CPU s"],
            )
        stage_table = Result("transfer-stages", ["stage (one thread, 1 MiB pieces)", "MB/s"])
        for name, rate in stages.items():
            stage_table.add(name, rate)
        result.meta = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
            "python": platform.python_version(),
            "pynacl": version("pynacl"),
            "py-libp2p": version("libp2p"),
            "blob_mib": args.mib,
            "runs": args.runs,
            "chunk_size": CHUNK_SIZE,
            "stage_rates_mb_s": stages,
            "load_avg_before": load_before,
            "load_avg_after": load_after,
            "raw": raw,
        }
        stage_table.show()
        result.show()
        console.log(f"written {result.save()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
