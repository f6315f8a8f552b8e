"""Kademlia DHT (py-libp2p 0.8.1): latency, CPU and bytes per operation, and idle cost.

    .venv/bin/python -m benchmarks.dht [--nodes 10 25] [--ops 50] [--idle-window 30]

Why: capacity discovery at 10,000 peers may put ads in a DHT instead of gossiping them;
that design needs measured costs of `libp2p.kad_dht.KadDHT`, not guesses.

How: each DHT node is an OS process (`--worker`: one libp2p host, Ed25519, TCP + Noise +
Yamux on 127.0.0.1, `KadDHT(host, DHTMode.SERVER)`): no shared GIL, CPU per node. Node i
dials `--bootstrap-peers` random earlier nodes and seeds its routing table with them;
then all nodes run `refresh_routing_table()` twice, as their 10-minute loop would. The
swarm's auto-connector (dials peerstore peers up to 200 connections) is off unless
`--autoconnect`: it is not the DHT and would redial what `lookup_cold` drops. The driver
runs one operation at a time (JSON over stdin/stdout), from a random node, random keys:

- lookup: `peer_routing.find_closest_peers_network(key)`, the walk under all the others;
  lookup_cold (--ops / 2 of them): the same after the issuer closed all its connections;
- put: `put_value("/mm/<hex>", 8-byte seq + payload)`, a validator registered for `mm`
  on every node (`SeqValidator`: highest seq wins);
- get: `get_value` of a key put above, from another node, after removing the issuer's
  local copy (with k=20 >= N every node holds every record: get would be a local hit);
- provide: `provider_store.provide(multihash)`; find1 / find20: `find_providers(key,
  count=1 | 20)` from another node, its local provider record removed first.

Latency: timed in the issuer around the awaited call. CPU: /proc/<pid>/task/*/schedstat
(ns, all threads) of every worker, just before an operation and `--settle` s after it
(ADD_PROVIDER is fire-and-forget: others work after the issuer returns), less each
node's idle rate; the issuer's share and the sum over the others. Idle CPU: per node
over `--idle-window` s; the 10-minute refresh is timed like an operation and amortised.
Bytes: `TrioTCPStream.write` wrapped (TCP payload with Noise/Yamux framing, all nodes);
KAD RPCs: inbound /ipfs/kad/1.0.0 streams. libp2p's logger goes to each worker's log so
its warnings are counted. Each batch waits (<= 30 s) for other jobs on the machine to
go quiet and reports their load. Loopback, 2 shared cores: latency includes waiting for
a core, so it bounds a LAN figure from above.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import os
import platform
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path
from typing import Any

import multiaddr
import psutil
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.io.trio import TrioTCPStream
from libp2p.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.common import PROTOCOL_ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service

from benchmarks.harness import Result, _die_with_parent, console, percentile

OPS = ("lookup", "put", "get", "provide", "find1", "find20", "lookup_cold")
NAMESPACE = "mm"

# -- worker: one host + KadDHT per process, driven by JSON lines on stdin ----------------


class SeqValidator(Validator):
    """Values are an 8-byte big-endian sequence number + payload; the highest wins. A
    validator whose select() keeps the first value makes holders refuse every update."""

    def validate(self, key: str, value: bytes) -> None:
        if len(value) < 8:
            raise ValueError("value shorter than its 8-byte sequence number")

    def select(self, key: str, values: list[bytes]) -> int:
        return max(range(len(values)), key=lambda i: values[i][:8])


def value_for(key: str, size: int) -> bytes:
    """The value put under `key` (seq 1): every node can check what get_value returns."""
    return (1).to_bytes(8, "big") + hashlib.shake_256(key.encode()).digest(max(1, size - 8))


async def _op(dht: KadDHT, cmd: dict[str, Any]) -> dict[str, Any]:
    """Run one operation; report success (a put: it returned; gets check it) and whether
    the issuer held the record before it was removed."""
    op, key, out = cmd["op"], cmd.get("key", ""), {"local": False, "ok": True}
    raw, host = bytes.fromhex(key), dht.host
    if op == "connect":  # dial bootstrap peers and seed the routing table with them
        for text in cmd["addrs"]:
            info = info_from_p2p_addr(multiaddr.Multiaddr(text))
            host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
            await host.connect(info)
            out["ok"] &= await dht.routing_table.add_peer(info.peer_id)
    elif op == "drop":  # close every connection: the next operation must dial
        out["dropped"] = len(peers := list(host.get_connected_peers()))
        async with trio.open_nursery() as nursery:  # ~0.2 s per close: all at once
            for peer in peers:
                nursery.start_soon(host.disconnect, peer)
    elif op == "refresh":
        await dht.refresh_routing_table()
    elif op in ("lookup", "lookup_cold"):
        out["ok"] = bool(await dht.peer_routing.find_closest_peers_network(raw))
    elif op == "put":
        await dht.put_value(f"/{NAMESPACE}/{key}", value_for(key, cmd["size"]))
    elif op == "get":
        name = f"/{NAMESPACE}/{key}".encode()
        out["local"] = dht.value_store.get(name) is not None
        dht.value_store.remove(name)
        got = await dht.get_value(f"/{NAMESPACE}/{key}")
        out["ok"] = got == value_for(key, cmd["size"])
    elif op == "provide":
        out["ok"] = await dht.provider_store.provide(raw)
    elif op in ("find1", "find20"):
        out["local"] = dht.provider_store.providers.pop(raw, None) is not None
        found = await dht.provider_store.find_providers(raw, 1 if op == "find1" else 20)
        ids = [p.peer_id.to_base58() for p in found]
        out["ok"], out["found"], out["distinct"] = cmd["provider"] in ids, len(ids), len(set(ids))
    return out


async def worker(autoconnect: bool) -> None:
    """Serve commands from the driver until it closes stdin."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("libp2p").propagate = True  # it has no handler: lastResort drops levels
    chan = os.fdopen(os.dup(1), "w", buffering=1)  # line-buffered JSON answers
    os.dup2(2, 1)  # stray prints must not corrupt the command channel
    commands = trio.wrap_file(sys.stdin)
    counts = {"sent": 0, "kad_in": 0}
    write = TrioTCPStream.write

    async def counted_write(self: TrioTCPStream, data: bytes) -> None:
        counts["sent"] += len(data)
        await write(self, data)

    TrioTCPStream.write = counted_write  # type: ignore[method-assign]
    listen = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    host = new_host(key_pair=create_new_key_pair(secrets.token_bytes(32)), listen_addrs=[listen])
    if not autoconnect:  # the swarm would redial peerstore peers up to 200 connections
        host.get_network().auto_connector.maybe_connect = trio.lowlevel.checkpoint  # type: ignore
    dht = KadDHT(host, DHTMode.SERVER)
    dht.register_validator(NAMESPACE, SeqValidator())

    async def handle(stream: Any) -> None:
        counts["kad_in"] += 1
        await dht.handle_stream(stream)

    host.set_stream_handler(PROTOCOL_ID, handle)

    def reply(obj: dict[str, Any]) -> None:
        chan.write(json.dumps(obj) + "\n")

    async with host.run(listen_addrs=[listen]), background_trio_service(dht):
        addr = str(host.get_addrs()[0])
        me = host.get_id().to_base58()
        reply({"addr": addr if "/p2p/" in addr else f"{addr}/p2p/{me}", "peer": me})
        while line := await commands.readline():
            cmd = json.loads(line)
            if cmd["cmd"] == "stats":
                conns = len(host.get_connected_peers())
                reply({**counts, "rt": dht.get_routing_table_size(), "conns": conns})
            else:
                t0, result = time.perf_counter(), {"ok": False, "timeout": True}
                with trio.move_on_after(cmd["timeout"]):
                    try:
                        result = {**await _op(dht, cmd), "timeout": False}
                    except Exception as exc:
                        result = {"ok": False, "timeout": False, "error": repr(exc)[:300]}
                reply({**result, "s": time.perf_counter() - t0})
        os._exit(0)  # the driver has gone; leaving host.run() may crash (see the notes)


# -- driver -------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU seconds of all threads of `pid`, ns resolution (psutil's ticks are 10 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


class Node:
    """One worker process and its command channel."""

    def __init__(self, index: int, logdir: Path, autoconnect: bool) -> None:
        self.index, self.log = index, logdir / f"node{index}.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.dht", "--worker"]
                + ["--autoconnect"] * autoconnect,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=Path(__file__).resolve().parent.parent,
                preexec_fn=_die_with_parent,
            )
        self.addr, self.peer = "", ""

    def send(self, **cmd: Any) -> Node:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return self

    def recv(self) -> dict[str, Any]:
        """The next answer (every operation has its own deadline in the worker)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"node {self.index} exited: {self.problems()[-3:]}")
        return json.loads(line)

    def call(self, **cmd: Any) -> dict[str, Any]:
        return self.send(**cmd).recv()

    def problems(self) -> list[str]:
        """WARNING+ log lines (libp2p logs one per served KAD RPC: see the results)."""
        text = self.log.read_text(errors="replace")
        return [ln for ln in text.splitlines() if " WARNING " in ln or " ERROR " in ln]


def tally(nodes: list[Node]) -> Counter[str]:
    """Warnings and errors logged so far, by message with peer ids masked."""
    lines = (ln.split(" ", 3)[-1] for x in nodes for ln in x.problems())
    return Counter(re.sub(r"12D3KooW\w+", "<peer>", ln)[:100] for ln in lines)


def all_call(nodes: list[Node], **cmd: Any) -> list[dict[str, Any]]:
    """The same command to every node at once; their answers in node order."""
    for node in nodes:
        node.send(**cmd)
    return [node.recv() for node in nodes]


def snapshot(nodes: list[Node]) -> tuple[float, list[float]]:
    return time.monotonic(), [cpu_s(n.proc.pid) for n in nodes]


def mark(nodes: list[Node]) -> tuple[float, float]:
    """(now, CPU s the machine spent outside our processes): other jobs share it."""
    t = psutil.cpu_times()
    mine = sum(cpu_s(n.proc.pid) for n in nodes) + time.process_time()
    return time.monotonic(), t.user + t.nice + t.system + t.irq + t.softirq - mine


def other_cores(nodes: list[Node], since: tuple[float, float]) -> float:
    now = mark(nodes)
    return (now[1] - since[1]) / (now[0] - since[0])


def wait_quiet(nodes: list[Node], limit: float = 30.0) -> float:
    """Wait (at most `limit` s) until other jobs use < 0.3 cores over 1 s; their load."""
    deadline, load = time.monotonic() + limit, float("inf")
    while load >= 0.3 and time.monotonic() < deadline:
        since = mark(nodes)
        time.sleep(1.0)  # the sampling window
        load = other_cores(nodes, since)
    return load


def batch(
    nodes: list[Node], jobs: list[tuple[int, dict[str, Any]]], idle: list[float], args: Any
) -> dict[str, Any]:
    """Run (issuer, command) jobs one at a time; per-op latency and CPU split issuer/rest."""
    quiet = wait_quiet(nodes)
    s0, logged = all_call(nodes, cmd="stats"), sum(len(x.problems()) for x in nodes)
    rows, since = [], mark(nodes)
    for issuer, cmd in jobs:
        cold = cmd.pop("cold", False)
        dropped = (
            nodes[issuer].call(cmd="op", op="drop", timeout=10).get("dropped", 0) if cold else 0
        )
        time.sleep(args.settle if dropped else 0.0)  # the disconnects' tail
        t0, c0 = snapshot(nodes)
        answer = nodes[issuer].call(cmd="op", timeout=args.op_timeout, **cmd)
        time.sleep(args.settle)  # the others' work after the issuer returns
        t1, c1 = snapshot(nodes)
        busy = [b - a - rate * (t1 - t0) for a, b, rate in zip(c0, c1, idle, strict=True)]
        rows.append({**answer, "dropped": dropped, "issuer_cpu": busy[issuer]})
        rows[-1]["others_cpu"] = sum(busy) - busy[issuer]
    s1 = all_call(nodes, cmd="stats")
    n = max(1, len(jobs))
    return {
        "ops": rows,
        "bytes_per_op": sum(b["sent"] - a["sent"] for a, b in zip(s0, s1, strict=True)) / n,
        "rpcs_per_op": sum(b["kad_in"] - a["kad_in"] for a, b in zip(s0, s1, strict=True)) / n,
        "log_lines_per_op": (sum(len(x.problems()) for x in nodes) - logged) / n,
        "conns_after": statistics.mean(s["conns"] for s in s1),
        "other_cores": other_cores(nodes, since),  # other jobs' load meanwhile, and just before
        "other_cores_before": quiet,
    }


def measure(n: int, args: Any) -> dict[str, Any]:
    """Start n nodes, fill their tables, measure idle cost, then every operation type."""
    rng = random.Random(args.seed + n)
    logdir = Path(tempfile.mkdtemp(prefix=f"dht-{n}-"))
    nodes = [Node(i, logdir, args.autoconnect) for i in range(n)]
    out: dict[str, Any] = {"nodes": n, "logs": str(logdir)}
    try:
        t0 = time.monotonic()
        for node, hello in zip(nodes, [x.recv() for x in nodes], strict=True):
            node.addr, node.peer = hello["addr"], hello["peer"]
        for i, node in enumerate(nodes[1:], 1):
            earlier = rng.sample(nodes[:i], min(i, args.bootstrap_peers))
            node.send(cmd="op", op="connect", addrs=[e.addr for e in earlier], timeout=30)
        out["connected"] = [x.recv()["ok"] for x in nodes[1:]]
        for _ in range(2):  # each node's startup refresh, twice, everyone at once
            all_call(nodes, cmd="op", op="refresh", timeout=240)
        stats = all_call(nodes, cmd="stats")
        out["setup_s"], out["rt_sizes"] = time.monotonic() - t0, [x["rt"] for x in stats]
        out["conns"], out["setup_problems"] = [x["conns"] for x in stats], tally(nodes)
        console.log(f"{n} nodes up in {out['setup_s']:.0f} s; tables {sorted(out['rt_sizes'])}")
        out["idle_other_cores_before"] = wait_quiet(nodes)  # also the refresh tail's end
        s0, since = all_call(nodes, cmd="stats"), mark(nodes)
        w0, c0 = snapshot(nodes)
        time.sleep(args.idle_window)  # the idle window itself
        w1, c1 = snapshot(nodes)
        out["idle_other_cores"] = other_cores(nodes, since)
        s1 = all_call(nodes, cmd="stats")
        idle = [(b - a) / (w1 - w0) for a, b in zip(c0, c1, strict=True)]
        out["idle_cpu_s_per_node_min"] = [60 * x for x in idle]
        sent = [b["sent"] - a["sent"] for a, b in zip(s0, s1, strict=True)]
        out["idle_bytes_per_node_min"] = [60 * x / (w1 - w0) for x in sent]
        refresh = [(i, {"op": "refresh"}) for i in rng.sample(range(n), min(n, 5))]
        out["refresh"] = batch(nodes, refresh, idle, args)

        def other(i: int) -> int:  # a random node that is not i
            return (i + rng.randrange(1, n)) % n

        m, keys = args.ops, [secrets.token_hex(16) for _ in range(2 * args.ops + args.ops // 2)]
        put = [(rng.randrange(n), {"key": k}) for k in keys[:m]]
        prov = [(rng.randrange(n), {"key": "1220" + secrets.token_hex(32)}) for _ in range(m)]
        jobs = {"lookup": [(rng.randrange(n), {"key": k}) for k in keys[m : 2 * m]], "put": put}
        jobs["get"], jobs["provide"] = [(other(i), c) for i, c in put], prov
        for op in ("find1", "find20"):
            jobs[op] = [(other(i), {**c, "provider": nodes[i].peer}) for i, c in prov]
        jobs["lookup_cold"] = [(rng.randrange(n), {"key": k, "cold": 1}) for k in keys[2 * m :]]
        for op in OPS:
            todo = [(i, {**cmd, "op": op, "size": args.value_size}) for i, cmd in jobs[op]]
            console.log(f"  {n} nodes: {len(todo)} x {op}")
            out[op] = batch(nodes, todo, idle, args)
        kinds = tally(nodes) - out["setup_problems"]
        out["problems"], out["problem_lines"] = kinds.most_common(12), sum(kinds.values())
        out["setup_problems"] = out["setup_problems"].most_common(12)
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()  # results are in; workers hold nothing worth a clean stop
            node.proc.wait()
    return out


def ms(values: list[float], q: float | None = None) -> float:
    """Mean (q None) or percentile q (NaN for none) of seconds, in ms."""
    return 1000 * (statistics.mean(values) if q is None else percentile(values, q))


def summarise(r: dict[str, Any]) -> tuple[list[list[Any]], list[Any]]:
    """Rows per operation type, and the per-size idle row."""
    rows = []
    for op in (*OPS, "refresh"):
        ops, b = r[op]["ops"], r[op]
        lat = [o["s"] for o in ops if o["ok"]]
        rows.append([r["nodes"], op, f"{len(lat)}/{len(ops)}", sum(o["timeout"] for o in ops)])
        rows[-1] += [ms(lat, 50), ms(lat, 90), ms([o["issuer_cpu"] for o in ops])]
        rows[-1] += [ms([o["others_cpu"] for o in ops]), b["rpcs_per_op"], b["bytes_per_op"] / 1024]
        rows[-1].append(b["other_cores"])
    idle_ms, cpu = ms(r["idle_cpu_s_per_node_min"], 50), r["idle_cpu_s_per_node_min"]
    per_conn = [1000 * c / max(1, k) for c, k in zip(cpu, r["conns"], strict=True)]
    # the maintenance loop refreshes every 600 s: per node and minute, a tenth of one
    # refresh (its own share plus what the others spend answering it)
    with_refresh = idle_ms + (rows[-1][6] + rows[-1][7]) / 10
    rt = sorted(r["rt_sizes"])
    idle = [r["nodes"], f"{rt[0]}/{rt[len(rt) // 2]}/{rt[-1]}", statistics.mean(r["conns"])]
    idle += [idle_ms, 1000 * max(cpu), statistics.median(per_conn), with_refresh]
    idle += [statistics.median(r["idle_bytes_per_node_min"]) / 1024, r["setup_s"]]
    return rows, [*idle, r["problem_lines"], r["idle_other_cores"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 25])
    parser.add_argument("--ops", type=int, default=50, help="operations per type and size")
    parser.add_argument("--value-size", type=int, default=256, help="put_value bytes")
    parser.add_argument("--bootstrap-peers", type=int, default=3, help="dials per joiner")
    parser.add_argument("--idle-window", type=float, default=30.0, help="idle CPU window, s")
    parser.add_argument("--settle", type=float, default=0.25, help="s after each op")
    parser.add_argument("--op-timeout", type=float, default=30.0, help="s per operation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--autoconnect", action="store_true", help="keep the swarm's dialer")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        trio.run(worker, args.autoconnect)
        return
    raw: dict[int, dict[str, Any]] = {}
    for n in args.nodes:
        try:
            raw[n] = measure(n, args)
        except Exception as exc:  # one size failing must not lose the others' figures
            console.print_exception()
            raw[n] = {"nodes": n, "error": f"{type(exc).__name__}: {exc}"}
    result = Result("dht", ["nodes", "operation", "ok", "timeouts", "p50 ms", "p90 ms"])
    result.columns += ["issuer CPU ms/op", "others CPU ms/op", "KAD RPCs/op", "KiB sent/op"]
    result.columns.append("other jobs, cores")
    idle = Result("dht-idle", ["nodes", "table min/med/max", "conns/node", "idle CPU ms/node/min"])
    idle.columns += ["max", "per connection", "with 10-min refresh", "idle KiB/node/min"]
    idle.columns += ["setup s", "warning lines", "other jobs, cores"]
    for n in (n for n in args.nodes if "error" not in raw[n]):
        rows, idle_row = summarise(raw[n])
        result.rows += rows
        idle.add(*idle_row)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    result.meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{psutil.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "py-libp2p": version("libp2p"),
        "commit": sha.strip(),
        "args": vars(args),
        "idle": {"columns": idle.columns, "rows": idle.rows},
        "raw": raw,
    }
    result.show()
    idle.show()
    console.log(f"written {result.save()}")


if __name__ == "__main__":
    main()
