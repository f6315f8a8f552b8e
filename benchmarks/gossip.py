"""Capacity gossip: how long an ad takes to reach every node, and what it costs in CPU.

    .venv/bin/python -m benchmarks.gossip [--nodes 10 25] [--rounds 10] [--commit HEAD]

The nodes run from an export of one commit (`--commit`, default HEAD; `worktree` for
the working tree), so a run measures named code while others edit the tree. For each
node count, two clusters of real node processes run one after the other:

1. *idle* (the baseline): publish interval 3600 s, so after the start-up ads nothing is
   published. It gives the fixed CPU cost of a node (GossipSub heartbeats, HTTP thread,
   peer expiry) and shows what a joining node sees: an extra node is started and we
   time how soon it lists every peer (ads fetched on connect over /meshminer/ads/1) and
   how soon every peer lists it (its one publish after its first connection).
2. *active*: every node publishes every `--interval` s (default max(5, 0.5 x nodes), so
   each node receives ~2 ads/s at either size and the machine-wide load stays within
   2 cores). Every node's /api/v1/peers is polled every `--poll` s; each ad carries
   its creation time and each receiver its acceptance time (same clock), so per
   receiver delivery = last_seen - ad_timestamp, and per (publisher, seq) "reach all"
   = the max over the N-1 receivers. Sequence gaps (an ad superseded before a poll
   saw it) are counted, so an unseen delivery cannot hide.

CPU: process CPU time (psutil) over a window in which nothing polls the nodes (only
/metrics is read, just before and just after), in both clusters. The CPU a delivered
ad costs = (active CPU - idle CPU over the same wall time) / ads accepted in the window
(`meshminer_ads_accepted_total`); own publishes and forwarding are part of that cost.
Each window starts, where possible, on a quiet machine (others' jobs share it), and the
CPU used meanwhile by everything else on the machine is reported with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import platform
import shutil
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness import (
    Cluster,
    Node,
    Result,
    console,
    percentile,
    snapshot,
    total,
    wait_for,
)

DEFAULT_PUBLISH_INTERVAL_S = 30.0  # the node's default, for the extrapolation
IDLE_INTERVAL_S = 3600.0
ACCEPTED = "meshminer_ads_accepted_total"
PEERS = "/api/v1/peers"
VIA = ("exchange", "gossip")


def peer_counts(nodes: list[Node]) -> list[int]:
    return [len(n.get(PEERS)) for n in nodes]


def converge(nodes: list[Node], timeout: float, start_s: float) -> dict[str, Any]:
    """Seconds from the first spawn until every node lists all the others (`start_s`:
    until every API answered); on timeout, how far the slowest node got."""
    t0, want = time.monotonic() - start_s, len(nodes) - 1
    try:
        wait_for(lambda: min(peer_counts(nodes)) >= want, timeout, "every node lists all", 0.5)
        return {"converged": True, "seconds": time.monotonic() - t0, "start_s": start_s}
    except TimeoutError:
        low = min(peer_counts(nodes))
        return {"converged": False, "seconds": math.nan, "start_s": start_s, "min_listed": low}


def settle(nodes: list[Node], timeout: float = 60.0) -> bool:
    """Wait until the total number of connections is unchanged across 3 s (dials done)."""
    last: list[float] = [-1.0]

    def stable() -> bool:
        now = sum(total(n.metrics(), "meshminer_connections") for n in nodes)
        same, last[0] = now == last[0], now
        return same

    try:
        wait_for(stable, timeout, "connections stable", every=3.0)
        return True
    except TimeoutError:
        return False


class Machine:
    """CPU of each node, and of everything else on the machine (other processes, kernel
    work charged to none: others' jobs share it; their load is reported, not hidden),
    from construction to `done()`."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes, self.me = nodes, psutil.Process()
        self.t0, self.sys0 = time.monotonic(), psutil.cpu_times()
        self.cpu0, self.me0 = [n.cpu_s() for n in nodes], sum(self.me.cpu_times()[:2])

    def done(self) -> tuple[list[float], float, float]:
        """(CPU s per node, wall s, cores busy with other processes)."""
        cpu = [n.cpu_s() - c for n, c in zip(self.nodes, self.cpu0, strict=True)]
        wall, sys1 = time.monotonic() - self.t0, psutil.cpu_times()
        busy = _busy(sys1) - _busy(self.sys0)
        mine = sum(cpu) + sum(self.me.cpu_times()[:2]) - self.me0
        return cpu, wall, (busy - mine) / wall


def _busy(t: Any) -> float:
    return float(t.user + t.nice + t.system + t.irq + t.softirq)


def cpu_window(nodes: list[Node], seconds: float) -> dict[str, Any]:
    """CPU seconds and ads accepted per node over `seconds` with no polling inside."""
    before = [n.metrics() for n in nodes]
    machine = Machine(nodes)
    time.sleep(seconds)  # the measurement window itself, not a wait for some state
    cpu, wall, others = machine.done()
    after = [n.metrics() for n in nodes]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "others_cores": others,
        "accepted": [
            total(b, ACCEPTED) - total(a, ACCEPTED) for a, b in zip(before, after, strict=True)
        ],
    }


def log_time(node: Node, text: str) -> float:
    """time.time() of the first line of the node's log containing `text` (NaN if none)."""
    for line in (node.data_dir / "stderr.log").read_text(errors="replace").splitlines():
        if text in line:
            return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return math.nan


def join(cluster: Cluster, timeout: float = 60.0) -> dict[str, Any]:
    """Start one more node into the idle cluster (no refresh due for an hour). Times run
    from the joiner's "up" log line (just before it dials its bootstrap peer) to each
    acceptance."""
    old = list(cluster.nodes)
    before = [n.metrics() for n in old]
    spawned, node = time.time(), cluster.add()
    node.peer_id = wait_for(lambda: node.get("/api/v1/status")["peer_id"], 120, "joiner API")

    def tables() -> list[list[dict[str, Any]]]:
        return [n.get(PEERS) for n in old]

    def done() -> bool:
        listed = all(node.peer_id in {p["peer_id"] for p in t} for t in tables())
        return listed and len(node.get(PEERS)) >= len(old)

    with contextlib.suppress(TimeoutError):
        wait_for(done, timeout, "joiner and every node list each other", 0.2)
    up = log_time(node, " up: libp2p ")
    mine = [p["last_seen"] for p in node.get(PEERS)]
    theirs = [p["last_seen"] for t in tables() for p in t if p["peer_id"] == node.peer_id]
    m, after = node.metrics(), [n.metrics() for n in old]
    return {
        "up_after_spawn_s": up - spawned,
        "joiner_lists": f"{len(mine)}/{len(old)}",
        "joiner_lists_all_s": max(mine) - up if len(mine) == len(old) else math.nan,
        "listed_by": f"{len(theirs)}/{len(old)}",
        "all_list_joiner_s": max(theirs) - up if len(theirs) == len(old) else math.nan,
        "joiner_accepted_via": {v: m.get(f'{ACCEPTED}{{via="{v}"}}', 0.0) for v in VIA},
        "others_accepted_via": {v: via_delta(before, after, v) for v in VIA},
        "slowest_s": sorted(t - up for t in theirs)[-3:],
    }


def via_delta(before: list[dict[str, float]], after: list[dict[str, float]], via: str) -> float:
    key = f'{ACCEPTED}{{via="{via}"}}'
    return sum(a.get(key, 0.0) - b.get(key, 0.0) for b, a in zip(before, after, strict=True))


def wait_quiet(nodes: list[Node], timeout: float = 120.0, max_cores: float = 0.25) -> float:
    """Wait (bounded) until other processes use < `max_cores` over 2 s, so that windows
    start on a quiet machine where possible; returns the last load seen."""
    seen = [math.inf]

    def quiet() -> bool:
        machine = Machine(nodes)
        time.sleep(2.0)  # the sampling window
        seen[0] = machine.done()[2]
        return seen[0] < max_cores

    with contextlib.suppress(TimeoutError):
        wait_for(quiet, timeout, "machine quiet", every=0.0)
    return seen[0]


def latency(nodes: list[Node], interval: float, rounds: int, poll: float) -> dict[str, Any]:
    """Poll every node's peer table; collect delivery latency per (publisher, seq)."""
    index = {n.peer_id: n.index for n in nodes}
    start = time.time()
    last_ad, stop_at = start + rounds * interval, start + rounds * interval + interval + 5
    seen: dict[tuple[str, int], dict[int, float]] = {}
    seqs: dict[tuple[int, str], set[int]] = {}  # (receiver, publisher) -> seqs observed
    sweeps, errors = [], 0
    m0 = [n.metrics() for n in nodes]
    machine = Machine(nodes)
    while time.time() < stop_at:
        tick = time.monotonic()
        for node in nodes:
            try:
                rows = node.get(PEERS)
            except Exception:
                errors += 1
                continue
            for row in rows:
                if start <= row["ad_timestamp"] <= last_ad and row["peer_id"] in index:
                    key = (row["peer_id"], row["seq"])
                    seen.setdefault(key, {})[node.index] = row["last_seen"] - row["ad_timestamp"]
                    seqs.setdefault((node.index, row["peer_id"]), set()).add(row["seq"])
        sweeps.append(time.monotonic() - tick)
        time.sleep(max(0.0, poll - sweeps[-1]))  # pacing of the poll loop
    cpu, wall, others = machine.done()
    pub, replay = "meshminer_ads_published_total", 'meshminer_ads_rejected_total{reason="replay"}'
    m1 = [n.metrics() for n in nodes]
    pairs = list(zip(m0, m1, strict=True))
    published = sum(total(b, pub) - total(a, pub) for a, b in pairs)
    want = len(nodes) - 1
    complete = [max(v.values()) for v in seen.values() if len(v) == want]
    gaps = sum(max(s) - min(s) + 1 - len(s) for s in seqs.values())
    return {
        "per_node": [x for v in seen.values() for x in v.values()],
        "reach_all": complete,
        "ads_seen": len(seen),
        "ads_complete": len(complete),
        "published_in_phase": published,
        "replays_in_phase": sum(b.get(replay, 0.0) - a.get(replay, 0.0) for a, b in pairs),
        "accepted_via_in_phase": {v: via_delta(m0, m1, v) for v in VIA},
        "seq_gaps": gaps,
        "poll_errors": errors,
        "sweep_p50_s": percentile(sweeps, 50),
        "sweep_max_s": max(sweeps),
        "cpu_share_with_polling": [c / wall for c in cpu],
        "others_cores": others,
    }


def rejected(nodes: list[Node]) -> dict[str, float]:
    """Ads rejected before delivery, summed over nodes, by reason."""
    out: dict[str, float] = {}
    for node in nodes:
        for key, value in node.metrics().items():
            if key.startswith("meshminer_ads_rejected_total{"):
                reason = key.split('"')[1]
                out[reason] = out.get(reason, 0.0) + value
    return out


def measure(n: int, args: argparse.Namespace, src: Path | None) -> dict[str, Any]:
    """Both clusters of one size; the raw figures (see the module docstring)."""
    out: dict[str, Any] = {"nodes": n}
    timeout = 60 + 6 * n
    interval = args.interval or max(5.0, 0.5 * n)
    out["interval_s"] = interval
    with Cluster(["--publish-interval", str(IDLE_INTERVAL_S)], args.keep_logs, src) as c:
        console.log(f"[bold]{n} nodes, idle baseline[/bold]: starting")
        c.start(n)
        out["idle_converge"] = converge(c.nodes, timeout, c.start_s)
        out["idle_settled"] = settle(c.nodes)
        out["idle_quiet"] = wait_quiet(c.nodes)
        console.log(f"  {out['idle_converge']}; CPU window {args.cpu_window} s")
        out["idle"] = cpu_window(c.nodes, args.cpu_window)
        out["join"] = join(c)
        console.log(f"  join: {out['join']}")
        out["idle_rejected"] = rejected(c.nodes)
        out["idle_problems"] = {x.index: x.problems() for x in c.nodes if x.problems()}
    out["idle_sigkilled"] = c.killed
    with Cluster(["--publish-interval", str(interval)], args.keep_logs, src) as c:
        console.log(f"[bold]{n} nodes, publishing every {interval} s[/bold]: starting")
        c.start(n)
        out["converge"] = converge(c.nodes, timeout, c.start_s)
        out["settled"] = settle(c.nodes)
        out["latency_quiet"] = wait_quiet(c.nodes)
        console.log(f"  {out['converge']}; {args.rounds} rounds of latency")
        out["latency"] = latency(c.nodes, interval, args.rounds, args.poll)
        out["active_quiet"] = wait_quiet(c.nodes)
        console.log(f"  CPU window {args.cpu_window} s")
        out["active"] = cpu_window(c.nodes, args.cpu_window)
        out["rejected"] = rejected(c.nodes)
        out["problems"] = {x.index: x.problems() for x in c.nodes if x.problems()}
    out["sigkilled"] = c.killed
    return out


def summarise(r: dict[str, Any]) -> dict[str, float]:
    """The reported figures for one node count."""
    lat, idle, act, n = r["latency"], r["idle"], r["active"], r["nodes"]
    wall = act["wall_s"]
    idle_share = [c / idle["wall_s"] for c in idle["cpu_s"]]
    extra = [c - s * wall for c, s in zip(act["cpu_s"], idle_share, strict=True)]
    per_node_ms = [1000 * e / a for e, a in zip(extra, act["accepted"], strict=True) if a > 0]
    ms = 1000 * sum(extra) / max(1.0, sum(act["accepted"]))
    reach = [1000 * x for x in lat["reach_all"]]
    return {
        "publish interval, s": r["interval_s"],
        "ads received per node per s": sum(act["accepted"]) / n / wall,
        "start: all APIs answer, s": r["converge"]["start_s"],
        "start: every node lists all, s": r["converge"]["seconds"],
        "reach all p50, ms": percentile(reach, 50),
        "reach all p99, ms": percentile(reach, 99),
        "reach all p99/p50": percentile(reach, 99) / percentile(reach, 50),
        "per-node delivery p50, ms": 1000 * percentile(lat["per_node"], 50),
        "per-node delivery p99, ms": 1000 * percentile(lat["per_node"], 99),
        "ads that reached all": lat["ads_complete"] / max(1, lat["ads_seen"]),
        "CPU per delivered ad, ms": ms,
        "  per node p50, ms": percentile(per_node_ms, 50),
        "  per node max, ms": max(per_node_ms, default=math.nan),
        "idle CPU share/node p50": percentile(idle_share, 50),
        "active CPU share/node p50": percentile([c / wall for c in act["cpu_s"]], 50),
        "  same, while polled": percentile(lat["cpu_share_with_polling"], 50),
        "all nodes, cores (active)": sum(act["cpu_s"]) / wall,
        "other processes, cores": max(act["others_cores"], idle["others_cores"]),
        "core share @100 peers/30 s": 100 / DEFAULT_PUBLISH_INTERVAL_S * ms / 1000,
        "core share @1000 peers/30 s": 1000 / DEFAULT_PUBLISH_INTERVAL_S * ms / 1000,
        "joiner lists all, ms": 1000 * r["join"]["joiner_lists_all_s"],
        "all list joiner, ms": 1000 * r["join"]["all_list_joiner_s"],
        "replayed ads rejected (active)": r["rejected"].get("replay", 0.0),
        "  of which while measuring": lat["replays_in_phase"],
        "nodes SIGKILLed after 5 s": len(r["sigkilled"]) + len(r["idle_sigkilled"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 25])
    parser.add_argument("--rounds", type=int, default=10, help="publishes per node measured")
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="publish interval, s [default max(5, 0.5 x nodes): ~2 ads/s reach each node]",
    )
    parser.add_argument("--poll", type=float, default=0.4, help="peer-table poll period, s")
    parser.add_argument("--cpu-window", type=float, default=30.0, help="CPU window, s")
    parser.add_argument("--keep-logs", action="store_true", help="keep node data dirs")
    parser.add_argument(
        "--commit",
        default="HEAD",
        help="run the nodes from this commit (exported), or 'worktree' for the working tree",
    )
    args = parser.parse_args()
    src, sha = (None, "worktree") if args.commit == "worktree" else snapshot(args.commit)
    raw: dict[int, dict[str, Any]] = {}
    try:
        for n in args.nodes:
            try:
                raw[n] = measure(n, args, src)
            except Exception as exc:  # one size failing must not lose the other's figures
                console.print_exception()
                raw[n] = {"nodes": n, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if src is not None:
            shutil.rmtree(src, ignore_errors=True)
    sizes = [n for n in args.nodes if "error" not in raw[n]]
    figures = {n: summarise(raw[n]) for n in sizes}
    columns = ["figure", *(f"{n} nodes" for n in sizes)]
    if len(sizes) == 2:
        columns.append(f"{sizes[1]}/{sizes[0]}")
    result = Result("gossip", columns)
    for key in figures[sizes[0]] if sizes else []:
        row = [figures[n][key] for n in sizes]
        result.add(key, *row, *([row[1] / row[0] if row[0] else None] if len(row) == 2 else []))
    result.meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{psutil.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "py-libp2p": version("libp2p"),
        "commit": sha,
        "args": vars(args),
        "raw": raw,
    }
    result.show()
    console.log(f"written {result.save()}")


if __name__ == "__main__":
    main()
