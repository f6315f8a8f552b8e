"""One real directory node serving thousands of registered volunteers: its CPU and latency.

    .venv/bin/python -m benchmarks.directory_load [--registrants 2000] [--window 30] [--out FILE]

Why: directories are planned (docs/design/discovery.md) from per-request costs measured
at 5 registrants (`benchmarks.calibrate`); this measures one at the size it serves: a
`meshminer node run --directory` process alone (psutil's CPU is its own). (Before
`_room_for_many_peers` and a directory's `connection_options` in
node/net/libp2p_fixes.py, a directory held about 250 registrants and exited near 1,000.)
Each registrant is a real `MeshHost` with its own Ed25519 identity, held by load-generator
processes (`--worker`; ~0.3 MiB and ~0.2 ms of CPU a second per idle host). Like a
volunteer it subscribes to the node's three topics, serves probes and the ad exchange
(an empty table: a real one's own ad is join-time work for the directory, not the
steady state measured here), keeps one connection to the directory, and registers as
`Registration._register` does: every 30 s (`register_interval_s`) at a random phase of
its own, a fresh `CapacityAd` with the next sequence number, signed by its key (one
envelope resent would take the cheap `DuplicateAd` path). It never GRAFTs the directory
itself (degree_low 0): a volunteer's mesh is filled by its other peers, and 2,000
one-peer hosts would re-GRAFT it every prune backoff. A quarter advertise a CUDA GPU.
An owner asks for 2K = 16 peers (gpu "preferred") `--query-rate` times a second.

The table grows in steps (0, 1/4, 1/2, all of `--registrants`); at each size:
- *nominal* (`--window` s): registrations at their rate, queries at `--query-rate`:
  directory CPU (% of one core), client-side latency p50/p99;
- *quiet* (window/3): registrations and queries paused: the cost of N connections;
- *queries* (window/3): registrations paused, queries back to back: CPU per query.
No registration expires (TTL 90 s), nor does a connection sit idle the 60 s after which
the directory may close it. Per registration = (nominal - quiet - queries x CPU per
query) / registrations; size 0 is the baseline. Latencies are the *light* worker's (the
owner and 5% of the registrants, a process otherwise idle); the loaded workers' own and
their event-loop lag are kept beside them, with the load average and others' CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import trio
from nacl.signing import SigningKey

from benchmarks.gossip import settle
from benchmarks.harness import STATUS, Cluster, Node, Result, _die_with_parent, percentile, wait_for
from node import __version__
from node.identity import Identity
from node.net.discovery.directory import MAX_REGISTRATIONS
from node.net.discovery.listing import REQUEST_TIMEOUT_S
from node.net.host import HostError, MeshHost
from protocol import CapacityAd, GpuInfo, Policy, ProtocolError, encode, names, open_envelope, seal
from protocol.directory import DIRECTORY_LIMITS, DirectoryQuery, DirectoryReply

INTERVAL_S = 30.0  # the node's register_interval_s (a third of the 90 s peer TTL)
WANT = 16  # an owner asks for 2K candidates, K = 8
JOIN_GAP_S = 0.15  # between one worker's joins: ~20/s in all, so joins do not swamp it
LIGHT = 0.05  # share of the registrants on the light worker, whose latencies are reported
LINE = 25.0  # % of a core one directory may use: the line for the directory count
NETWORK, DIRECTORY_PEERS = 10_000, 2  # peers, and the directories each registers with


async def _answer(value: bytes) -> bytes:
    return value


async def _worker(directory_addr: str, owner: bool) -> None:
    """A load generator: registrants (and, with `owner`, the querying owner), driven by
    JSON lines on stdin (grow, set, take), one JSON answer line each on stdout."""
    out, sys.stdout = sys.stdout, sys.stderr  # only answers go to the controller
    directory = directory_addr.rsplit("/p2p/", 1)[1]
    state: dict[str, Any] = {"register": True, "query_rate": 0.0}
    stats: dict[str, Any] = {"hosts": 0}
    connecting = trio.Lock()
    started_send, started_recv = trio.open_memory_channel[bool](math.inf)

    def take() -> dict[str, Any]:
        taken = dict(stats, rss_mib=psutil.Process().memory_info().rss >> 20)
        stats.update(register_ms=[], query_ms=[], lag_ms=[], register_failed=0, query_failed=0)
        return taken

    async def ask(host: MeshHost, protocol: str, raw: bytes, kind: str) -> None:
        t0 = time.perf_counter()
        try:
            limit = DIRECTORY_LIMITS.max_bytes
            reply = await host.request(directory, protocol, raw, limit, REQUEST_TIMEOUT_S)
            took = (time.perf_counter() - t0) * 1000
            open_envelope(reply, DirectoryReply, expected_signer=directory, limits=DIRECTORY_LIMITS)
            stats[f"{kind}_ms"].append(took)
        except (HostError, ProtocolError) as exc:
            stats[f"{kind}_failed"] += 1
            print(f"{kind} failed: {exc}", file=sys.stderr)

    def start(identity: Identity) -> Any:
        return MeshHost.start(identity, "/ip4/127.0.0.1/tcp/0", reachability="public")

    async def registrant(gpu: bool) -> None:
        me, seq, started = Identity(SigningKey.generate()), 0, False
        device = GpuInfo("RTX 4090", "cuda", 24564, 24000, "8.9") if gpu else GpuInfo("cpu", "cpu")
        try:
            async with start(me) as host:
                host._gossipsub.degree_low = 0  # never GRAFTs (see above)

                def ad() -> bytes:  # a fresh one each time, as `Node.signed_ad` makes
                    nonlocal seq
                    seq += 1
                    fresh = CapacityAd(
                        me.peer_id, host.addrs()[:4], [device], 1.0, "2.5.1", "12.4" if gpu else "",
                        Policy(), 0, seq, time.time(), __version__, reachability="public",
                    )  # fmt: skip
                    return seal(fresh, me.signing_key)

                host.serve(names.ADS_PROTOCOL, lambda p, r: _answer(encode([])), 64)
                host.serve(names.PROBE_PROTOCOL, lambda p, r: _answer(ad()), 64)
                for topic in (names.CAPACITY_TOPIC, names.RECEIPTS_TOPIC, names.EVIDENCE_TOPIC):
                    await host.subscribe(topic, lambda sender, data: True)
                host.remember(directory, [directory_addr])  # as its ad does: redialled if closed
                async with connecting:
                    await host.connect(directory_addr)
                    await ask(host, names.REGISTER_PROTOCOL, ad(), "register")
                    await trio.sleep(JOIN_GAP_S)
                started = True
                started_send.send_nowait(True)
                due = trio.current_time() + random.uniform(0, INTERVAL_S)  # its own phase
                while True:
                    await trio.sleep_until(due)
                    due += INTERVAL_S
                    if state["register"]:
                        await ask(host, names.REGISTER_PROTOCOL, ad(), "register")
        except Exception as exc:  # one host's failure is counted, the worker goes on
            print(f"registrant failed: {exc!r}", file=sys.stderr)
            if not started:
                started_send.send_nowait(False)

    async def querying() -> None:
        me = Identity(SigningKey.generate())
        async with start(me) as host:
            await host.connect(directory_addr)
            while True:
                rate, t0 = state["query_rate"], trio.current_time()
                if rate:
                    query = seal(DirectoryQuery(want=WANT, timestamp=time.time()), me.signing_key)
                    await ask(host, names.QUERY_PROTOCOL, query, "query")
                if rate >= 0:  # < 0: back to back
                    await trio.sleep_until(t0 + (random.expovariate(rate) if rate else 0.1))

    async def lag() -> None:
        while True:
            t0 = trio.current_time()
            await trio.sleep(0.1)
            stats["lag_ms"].append((trio.current_time() - t0 - 0.1) * 1000)

    take()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lag)
        if owner:
            nursery.start_soon(querying)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            cmd, answer = json.loads(line), {}
            if cmd["cmd"] == "grow":
                for i in range(cmd["add"]):
                    nursery.start_soon(registrant, (stats["hosts"] + i) % 4 == 0)
                oks = [await started_recv.receive() for _ in range(cmd["add"])]
                stats["hosts"] += oks.count(True)
                answer = {"failed": oks.count(False)}
            elif cmd["cmd"] == "set":
                state.update(register=cmd["register"], query_rate=cmd["query_rate"])
            elif cmd["cmd"] == "take":
                answer = take()
            out.write(json.dumps(answer) + "\n")
            out.flush()
        os._exit(0)  # the controller is gone; closing hundreds of hosts one by one is slow


# -- the controller ---------------------------------------------------------------------


def _spawn(addr: str, owner: bool, log: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "benchmarks.directory_load", "--worker", addr]
    with open(log, "wb") as err:
        return subprocess.Popen(cmd + ["--owner"] * owner, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                preexec_fn=_die_with_parent)  # fmt: skip


def _ask(workers: list[subprocess.Popen[str]], cmds: list[dict]) -> list[dict[str, Any]]:
    """Send each worker its command (all at once), then read each one's answer."""
    for w, cmd in zip(workers, cmds, strict=True):
        assert w.stdin is not None
        w.stdin.write(json.dumps(cmd) + "\n")
        w.stdin.flush()
    answers = [w.stdout.readline() if w.stdout else "" for w in workers]
    if not all(answers):
        raise RuntimeError("a worker exited: see its log")
    return [json.loads(a) for a in answers]


def _count(node: Node, kind: str) -> float:
    key = f'meshminer_discovery_messages_total{{direction="in",kind="{kind}"}}'
    return node.metrics().get(key, 0.0)


def _pcts(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}


def window(directory: Node, workers: list, seconds: float, register: bool, rate: float) -> dict:
    """Directory CPU, requests served, latencies and the machine's load over `seconds`."""
    _ask(workers, [{"cmd": "set", "register": register, "query_rate": rate}] * len(workers))
    _ask(workers, [{"cmd": "take"}] * len(workers))
    pids = [directory.proc.pid] + [w.pid for w in workers]
    regs, queries = _count(directory, "register"), _count(directory, "query")
    procs = [psutil.Process(pid) for pid in pids]
    cpu, busy, t0 = [sum(p.cpu_times()[:2]) for p in procs], psutil.cpu_times(), time.monotonic()
    time.sleep(seconds)
    cpu = [sum(p.cpu_times()[:2]) - c for p, c in zip(procs, cpu, strict=True)]
    busy = sum(psutil.cpu_times()[:3]) - sum(busy[:3])  # user, nice, system
    wall = time.monotonic() - t0
    regs, queries = _count(directory, "register") - regs, _count(directory, "query") - queries
    light, *loaded = _ask(workers, [{"cmd": "take"}] * len(workers))
    every = [light, *loaded]
    return {
        "seconds": wall, "cpu_pct": cpu[0] / wall * 100, "loadavg": os.getloadavg(),
        "registrations_per_s": regs / wall, "queries_per_s": queries / wall,
        "register_ms": _pcts(light["register_ms"]), "query_ms": _pcts(light["query_ms"]),
        "register_ms_loaded_workers": _pcts([ms for t in loaded for ms in t["register_ms"]]),
        "lag_ms_loaded_workers": _pcts([ms for t in loaded for ms in t["lag_ms"]]),
        "failed": sum(t["register_failed"] + t["query_failed"] for t in every),
        "workers": [{"hosts": t["hosts"], "rss_mib": t["rss_mib"], "cpu_pct": c / wall * 100}
                    for t, c in zip(every, cpu[1:], strict=True)],  # the load generators
        "others_cores": (busy - sum(cpu)) / wall,  # the controller's few ms included
    }  # fmt: skip


def grow(directory: Node, workers: list, held: list[int], size: int) -> dict[str, int]:
    """Bring the registrants to `size`, LIGHT of them (at least one) on the light worker;
    returns how many could not join, and the registrations that failed meanwhile."""
    light, loaded = (max(1, round(size * LIGHT)) if size else 0), len(workers) - 1
    rest = size - light
    want = [light] + [rest * (i + 1) // loaded - rest * i // loaded for i in range(loaded)]
    growing = [i for i, n in enumerate(want) if n > held[i]]
    cmds = [{"cmd": "grow", "add": want[i] - held[i]} for i in growing]
    failed = sum(a["failed"] for a in _ask([workers[i] for i in growing], cmds))
    held[:] = want

    def holds() -> bool:
        return directory.get(STATUS)["discovery"].get("directory_holds", 0) >= size - failed

    wait_for(holds, 300, f"{size} registered")
    time.sleep(5)  # the connections' one-time work (ad exchanges, identify) ends
    settle([directory])
    growing_failed = sum(
        t["register_failed"] for t in _ask(workers, [{"cmd": "take"}] * len(workers))
    )
    return {"failed_to_join": failed, "registrations_failed_while_growing": growing_failed}


def per(pct: float, rate: float) -> float:
    """ms of CPU per event: `pct` % of a core spent on `rate` events a second."""
    return pct * 10 / rate if rate > 0 else math.nan


def derive(run: dict[str, Any], empty: dict[str, Any]) -> None:
    """CPU per query, per registration, and per open connection a minute (`empty`: the
    size-0 run)."""
    nom, quiet, burst = run["nominal"], run["quiet"], run["queries"]
    run["query_cpu_ms"] = per(burst["cpu_pct"] - quiet["cpu_pct"], burst["queries_per_s"])
    extra = nom["cpu_pct"] - quiet["cpu_pct"] - nom["queries_per_s"] * run["query_cpu_ms"] / 10
    run["register_cpu_ms"] = per(extra, nom["registrations_per_s"])
    extra = quiet["cpu_pct"] - empty["quiet"]["cpu_pct"]
    run["connection_ms_per_min"] = extra * 600 / max(run["registrants"], 1)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """At each table size: grow, then the nominal, quiet and queries windows."""
    sizes = sorted({0, args.registrants // 4, args.registrants // 2, args.registrants})
    runs: list[dict[str, Any]] = []
    with Cluster([], keep=args.keep) as cluster:
        (directory,) = cluster.start(1, first=["--directory"])
        addr, logs = directory.get(STATUS)["addrs"][0], cluster.root / "worker{}.log"
        workers = [_spawn(addr, i == 0, Path(str(logs).format(i))) for i in range(args.workers + 1)]
        held = [0] * len(workers)
        try:
            for size in sizes:
                run: dict[str, Any] = {"registrants": size}
                run.update(grow(directory, workers, held, size))
                run["nominal"] = window(directory, workers, args.window, True, args.query_rate)
                run["quiet"] = window(directory, workers, args.window / 3, False, 0.0)
                run["queries"] = window(directory, workers, args.window / 3, False, -1.0)
                _ask(workers, [{"cmd": "set", "register": True, "query_rate": 0.0}] * len(workers))
                derive(run, runs[0] if runs else run)
                metrics = directory.metrics()  # connections open, and closed as idle (none)
                run["connections"] = metrics.get("meshminer_connections", 0.0)
                run["trimmed"] = metrics.get("meshminer_connections_trimmed_total", 0.0)
                rss = psutil.Process(directory.proc.pid).memory_info().rss
                run["directory_rss_mib"] = rss >> 20
                runs.append(run)
                print(json.dumps(run, default=str), file=sys.stderr)
        finally:
            for w in workers:
                w.kill()
    return runs


def plan(points: list[tuple[int, float]]) -> dict[str, Any]:
    """Directories a NETWORK-peer network needs, each at most LINE % of a core: CPU as a
    least-squares line in registrants through the nominal windows."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    fixed = my - slope * mx
    held = min(MAX_REGISTRATIONS, int((LINE - fixed) / slope)) if slope > 0 else MAX_REGISTRATIONS
    need = math.ceil(DIRECTORY_PEERS * NETWORK / max(held, 1))
    return {"line_pct": LINE, "fixed_pct": fixed, "pct_per_1000_registrants": slope * 1000,
            "registrants_at_line": held, "directories_for_10000": need}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registrants", type=int, default=2000)
    parser.add_argument("--window", type=float, default=INTERVAL_S)
    parser.add_argument("--query-rate", type=float, default=1.0, help="owner queries per second")
    parser.add_argument("--workers", type=int, default=3, help="load-generator processes")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--owner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return trio.run(_worker, args.worker, args.owner)
    t0 = time.monotonic()
    runs = measure(args)
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(), "runs": runs}
    meta.update(args={k: str(v) for k, v in vars(args).items()}, wall_s=time.monotonic() - t0)
    git = "git rev-parse --short HEAD; git status -s node protocol"  # the tree is what ran
    meta["code"] = subprocess.run(git, shell=True, capture_output=True, text=True).stdout
    meta["plan"] = plan([(r["registrants"], r["nominal"]["cpu_pct"]) for r in runs])
    columns = ["N", "CPU %", "reg/s", "reg p50/p99", "q/s", "q p50/p99", "quiet %", "ms/reg"]
    result = Result("directory_load", columns + ["ms/query", "load"], meta=meta)
    for r in runs:
        nom, reg, query = r["nominal"], r["nominal"]["register_ms"], r["nominal"]["query_ms"]
        result.add(r["registrants"], nom["cpu_pct"], nom["registrations_per_s"],
                   f"{reg['p50']:.3g}/{reg['p99']:.3g}", nom["queries_per_s"],
                   f"{query['p50']:.3g}/{query['p99']:.3g}", r["quiet"]["cpu_pct"],
                   r["register_cpu_ms"], r["query_cpu_ms"],
                   round(nom["loadavg"][0], 2))  # fmt: skip
    result.show()
    print("N registrants; CPU: the directory's, % of one core; latencies: ms, light worker's")
    print(json.dumps(meta["plan"]))
    path = result.save()
    if args.out:
        args.out.write_text(path.read_text())
    print(f"saved {args.out or path}")


if __name__ == "__main__":
    main()
