"""Capacity discovery on real node processes, old design and new, beside the simulator.

    .venv/bin/python -m benchmarks.discovery [--nodes 10 25 50] [--design gossip directory]
        [--directories M] [--window S] [--settle S] [--rev COMMIT]

Why: the simulator (`benchmarks.simulate`) is what says how discovery behaves at 1,000
and 10,000 peers; these runs are what it must agree with where this machine can hold
the network. For each size and design a cluster of real `meshminer node run`
processes on loopback is measured (with `--rev`, from an export of that commit, so
that edits to the tree meanwhile are not measured), and the simulator is run with the
same parameters:

- *gossip* (the old all-ads design): every node publishes every P = max(5, N / 2) s
  (so the machine-wide load stays inside 2 cores) and drops a peer 3P after its last ad.
- *directory* (the new one): nodes 0..M-1 serve as directories (`--directories M`, 1
  by default); every other node registers its ad with min(2, M) of them (the node's
  `directory_peers`, by rendezvous hashing) every R = 5 s (the peer TTL 15 s, a third
  of it) and, the network being "large" (`--gossip-max-peers 2`), gossips nothing;
  only the directories' own ads are gossiped (`benchmarks.discovery_directories`).

Figures:
- CPU per volunteer: process CPU (psutil) per minute over `--window` s in which
  nothing polls the nodes, the mean over the volunteers (not the directories); and
  each directory's, compared as the busiest and the mean over the directories.
- time to find peers: *directory*: `GET /api/v1/peers/find?k=K` from several nodes in
  turn (the node's own timing: query the directory, probe 2K candidates, K answers);
  *gossip*: a node joins, and its log says how long after it started dialling ("up")
  it had taken in every peer (the first table it fetches holds them all).
- time to drop a dead peer: volunteers are SIGKILLed, each at its own random moment
  within one refresh (they started together, so their refresh phases are alike);
  until each directory that held it no longer does (`/api/v1/directory`; the mean over
  those, as the simulator's `drop_dead_node_mean_s`), or until 5 sampled nodes no
  longer list it (*gossip*).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import discovery_directories as dirs
from benchmarks.gossip import cpu_window, settle
from benchmarks.harness import Cluster, Node, Result, console, snapshot, wait_for
from benchmarks.simulate import Costs, Scenario, load_costs, simulate

STATUS = "/api/v1/status"
K = 8
DIRECTORY_TTL_S = 15.0
DROP_SAMPLE = 5
WAVE = 10  # nodes started at once


@dataclass
class Setup:
    """One real network: its design and size and the parameters the simulator gets too."""

    design: str  # "gossip" | "directory"
    nodes: int
    interval_s: float | None = None  # None: max(5, N / 2) for gossip, 5 for directory
    directories: int = 1  # M (design directory): nodes 0..M-1

    @property
    def publish_interval_s(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        return max(5.0, self.nodes / 2) if self.design == "gossip" else DIRECTORY_TTL_S / 3

    @property
    def ttl_s(self) -> float:
        return 3 * self.publish_interval_s

    @property
    def register_interval_s(self) -> float:
        return self.ttl_s / 3

    @property
    def m(self) -> int:
        """Directories: M in design directory, none in gossip."""
        return self.directories if self.design == "directory" else 0

    @property
    def directory_peers(self) -> int:
        """D: directories a volunteer registers with (the node's default, 2)."""
        return min(2, self.directories)

    @property
    def k(self) -> int:
        return min(K, self.nodes - 3)

    def args(self) -> list[str]:
        args = [
            "--publish-interval",
            f"{self.publish_interval_s:g}",
            "--peer-ttl",
            f"{self.ttl_s:g}",
        ]
        return args + (["--gossip-max-peers", "2"] if self.design == "directory" else [])


@dataclass
class Measured:
    setup: Setup
    cpu_ms_per_min: float  # volunteers' mean
    directory_cpu_ms_per_min: list[float]  # each directory's
    connections: float  # volunteers' mean open connections
    find_s: list[float] = field(default_factory=list)
    drop_s: list[float] = field(default_factory=list)
    others_cores: float = 0.0  # CPU the rest of the machine used meanwhile
    probe_connected: float | None = None  # share of probes that found a connection open
    start_s: float = 0.0
    speed_ms: float = 0.0  # the yardstick (`speed_ms`): mean of before and after the network
    per_volunteer: list[float] = field(default_factory=list)  # each one's CPU, ms/min
    # gossip: each joiner's log lines that say a dial failed before its first table
    join_warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            "cpu_ms_per_min": self.cpu_ms_per_min,
            "find_s": statistics.median(self.find_s) if self.find_s else float("nan"),
            "drop_s": statistics.median(self.drop_s) if self.drop_s else float("nan"),
        }

    def figures(self) -> dict[str, float]:
        """`summary` and, in design directory, the directories' CPU."""
        return self.summary() | dirs.real_cpu(self.directory_cpu_ms_per_min)


def _discovery(node: Node) -> dict[str, Any]:
    return node.get(STATUS)["discovery"]


def _start_in_waves(setup: Setup, cluster: Cluster, timeout: float, wave: int = WAVE) -> list[Node]:
    """`wave` nodes at a time, each wave registered (directory) before the next: 50
    nodes started at once on 2 cores gossip their ads until they learn the network is
    large, and that start-up storm kept a 50-node network from settling in 180 s."""
    m = setup.m
    if m > 1:  # the directories first, all known to node 0
        nodes = dirs.start_directories(cluster, m, timeout)
    else:
        nodes = cluster.start(min(wave, setup.nodes), timeout, ["--directory"] if m else [])
    while len(nodes) < setup.nodes:
        for _ in range(min(wave, setup.nodes - len(nodes))):
            cluster.add()
        for node in nodes[-wave:]:
            node.peer_id = wait_for(lambda n=node: n.get(STATUS)["peer_id"], timeout, "APIs")
        if m:
            dirs.wait_registered(nodes[:m], nodes[m:], setup.directory_peers, timeout, False)
    return nodes


def _wait_steady(setup: Setup, nodes: list[Node], timeout: float) -> None:
    """Every node lists every other (gossip) or is registered and quiet (directory)."""
    if setup.design == "gossip":
        want = setup.nodes - 1
        wait_for(lambda: all(len(n.get("/api/v1/peers")) >= want for n in nodes), timeout,
                 "all listed")  # fmt: skip
    else:
        m = setup.m
        volunteers = nodes[m:]
        dirs.wait_registered(nodes[:m], volunteers, setup.directory_peers, timeout, True)
        wait_for(lambda: all(not _discovery(n)["gossips_own_ad"] for n in volunteers), 120, "quiet")
        # the ads gossiped before the switch expire from every table (the directories' stay)
        wait_for(
            lambda: all(len(n.get("/api/v1/peers")) <= m for n in volunteers[:DROP_SAMPLE]),
            setup.ttl_s + 60,
            "gossiped ads to expire",
        )
    settle(nodes)


def _find(
    setup: Setup, cluster: Cluster, nodes: list[Node], count: int
) -> tuple[list[float], float | None]:
    """Seconds each search took, and (directory) the share of its probes that went over
    a connection already open: what the simulator is told, since which candidates an
    owner happens to be connected to is not something it models."""
    times = []
    if setup.design == "directory":
        probed = connected = 0
        for owner in nodes[setup.m : setup.m + count]:
            found = owner.get(f"/api/v1/peers/find?k={setup.k}")
            if len(found["peers"]) < setup.k:
                raise RuntimeError(f"found {len(found['peers'])} of {setup.k}: {found}")
            times.append(found["seconds"])
            probed += found["probed"]
            connected += found["connected"]
        return times, connected / probed if probed else None
    for _ in range(count):
        others = len(cluster.nodes)
        joiner = cluster.add()
        wait_for(lambda j=joiner, n=others: len(j.get("/api/v1/peers")) >= n, 60, "all listed")
        times.append(joined_after_up(joiner, others))  # its first table holds them all
    return times, None


def join_warnings(node: Node) -> list[str]:
    """The node's warnings up to the first peer that joined (a failed first dial of
    the bootstrap peer waits a second before the next): what a slow join looked like."""
    said = []
    for line in (node.data_dir / "stderr.log").read_text(errors="replace").splitlines():
        if "peer joined:" in line:
            break
        if " WARNING " in line and "data dir" not in line:
            said.append(line[11:200])
    return said


def joined_after_up(node: Node, k: int) -> float:
    """Seconds from the node's "up" log line (it starts dialling then) to the log line
    of the k-th peer it took in, by the log's own clock."""
    times = joined_times(node)
    if len(times) < k:
        raise RuntimeError(f"node {node.index}: fewer than {k} peers joined in its log")
    return times[k - 1]


def joined_times(node: Node) -> list[float]:
    """Seconds after the node's "up" log line at which it logged each peer joining."""
    stamps: list[datetime.datetime] = []
    up = None
    for line in (node.data_dir / "stderr.log").read_text(errors="replace").splitlines():
        if " up: libp2p " in line:
            up = _stamp(line)
        elif "peer joined:" in line and up is not None:
            stamps.append(_stamp(line))
    if up is None:
        raise RuntimeError(f"node {node.index}: no 'up' line in its log")
    return [(stamp - up).total_seconds() for stamp in stamps]


def _stamp(line: str) -> datetime.datetime:
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


def _drop(setup: Setup, nodes: list[Node], victims: list[Node]) -> list[float]:
    """Kill each victim at its own random moment within one refresh; seconds from each
    death until the directories that held it forgot it (the mean over them), or until
    5 sampled nodes did (the last of them)."""
    rng = random.Random(7)
    alive = [n for n in nodes if n not in victims]
    watchers = nodes[: setup.m] or alive[:DROP_SAMPLE]
    path = "/api/v1/directory" if setup.m else "/api/v1/peers"

    def holders() -> list[set[str]]:
        return [{e["peer_id"] for e in n.get(path)} for n in watchers]

    pending = {
        (v.peer_id, i) for i, ids in enumerate(holders()) for v in victims if v.peer_id in ids
    }
    offsets = sorted(rng.uniform(0, setup.register_interval_s) for _ in victims)
    t0, died, gone = time.monotonic(), {}, {}
    for victim, offset in zip(victims, offsets, strict=True):
        wait_for(lambda o=offset: time.monotonic() - t0 >= o, offset + 5, "the moment", 0.02)
        victim.proc.send_signal(signal.SIGKILL)
        died[victim.peer_id] = time.monotonic()

    def forgotten() -> bool:
        held = holders()
        now = time.monotonic()
        for peer, i in pending - gone.keys():
            if peer not in held[i]:
                gone[peer, i] = now - died[peer]
        return len(gone) == len(pending)

    wait_for(forgotten, setup.ttl_s + 30, "every dead peer to be forgotten", 0.1)
    per_victim = [[s for (p, _), s in gone.items() if p == peer] for peer in died]
    combine = statistics.mean if setup.m else max
    return sorted(combine(times) for times in per_victim if times)


def measure(
    setup: Setup,
    window_s: float = 30.0,
    finds: int = 3,
    kills: int = 5,
    settle_s: float = 180.0,
    src: Path | None = None,
) -> Measured:
    """Start the network (from the code in `src`, if given), let it settle, measure
    CPU, then finds, then deaths."""
    before, m = speed_ms(), setup.m
    with Cluster(setup.args(), src=src) as cluster:
        t0 = time.monotonic()
        nodes = _start_in_waves(setup, cluster, settle_s)
        start_s = time.monotonic() - t0
        _wait_steady(setup, nodes, settle_s)
        volunteers = nodes[m:]
        connections = statistics.mean(n.get(STATUS)["connections"] for n in volunteers)
        window = cpu_window(nodes, window_s)
        per_min = [c * 60 / window["wall_s"] * 1000 for c in window["cpu_s"]]
        measured = Measured(
            setup,
            cpu_ms_per_min=statistics.mean(per_min[m:]),
            directory_cpu_ms_per_min=per_min[:m],
            connections=connections,
            others_cores=window["others_cores"],
            start_s=start_s,
            per_volunteer=per_min[m:],
        )
        measured.find_s, measured.probe_connected = _find(setup, cluster, nodes, finds)
        for joiner in cluster.nodes[len(nodes) :]:
            measured.join_warnings += join_warnings(joiner)
        measured.drop_s = _drop(setup, nodes, nodes[max(m, setup.nodes - kills) :])
    measured.speed_ms = (before + speed_ms()) / 2  # the machine's speed moves in minutes
    return measured


def scenario_for(measured: Measured, seed: int) -> Scenario:
    """The simulator's twin of a measured network: same size, intervals, TTLs, K and
    connections; as many deaths at once as were killed, and a little churn so that
    joins are timed too."""
    setup = measured.setup
    kills = len(measured.drop_s) or 1
    return Scenario(
        design=setup.design,
        peers=setup.nodes,
        duration_s=3600.0,
        seed=seed,
        publish_interval_s=setup.publish_interval_s,
        peer_ttl_s=setup.ttl_s,
        connections=max(1, round(measured.connections)),
        probe_connected=measured.probe_connected,
        directories=setup.directories,
        directory_peers=setup.directory_peers,
        register_interval_s=setup.register_interval_s,
        registration_ttl_s=setup.ttl_s,
        k=setup.k,
        owners=1,
        churn_per_hour=5 / setup.nodes,  # about five joins (and deaths) an hour
        shared_cores=len(os.sched_getaffinity(0)),  # every node runs on this machine
        burst_fraction=kills / setup.nodes,
        cold_start=True,  # fresh data dirs: no node remembers a directory
        receipt_gossip=False,  # searches only: no unit ends, no receipt
    )


def simulated(measured: Measured, costs: Costs, seeds: int = 3) -> dict[str, float]:
    """The simulator's figures for the same network, the median over `seeds` runs,
    with the costs as they would be on the machine the network ran on."""
    costs = costs.on_machine(measured.speed_ms)
    runs = [simulate(scenario_for(measured, seed), costs) for seed in range(1, seeds + 1)]
    find = "find_k_s_p50" if measured.setup.design == "directory" else "first_peer_s_p50"
    return {
        "cpu_ms_per_min": statistics.median(r.volunteer_cpu_ms_per_min_mean for r in runs),
        "find_s": statistics.median(getattr(r, find) for r in runs),
        # per holder, as the real run times it (no joiner copies a dead peer's entry there)
        "drop_s": statistics.median(r.drop_dead_node_mean_s for r in runs),
        "directory_cpu_max": statistics.median(r.directory_cpu_ms_per_min_max for r in runs),
        "directory_cpu_mean": statistics.median(r.directory_cpu_ms_per_min_mean for r in runs),
    }


def speed_ms(count: int = 300, passes: int = 7) -> float:
    """This machine's yardstick: ms to open one signed ad (decode, schema checks,
    signature), the median of `passes`. `benchmarks.calibrate` records it beside the
    costs, and a real network on another machine (this VM's speed has moved 4x between
    sessions) is compared with the costs scaled by the ratio (`Costs.on_machine`).

    The median, not the fastest pass: the nodes' costs are means over a window, and
    on this VM the fastest of 5 passes read 0.21-0.37 ms in three calls a minute apart,
    which moved the simulated CPU of a gossip volunteer by 1.6x between two runs."""
    from protocol import AD_LIMITS, CapacityAd
    from protocol.envelope import open_envelope

    envelopes = [_signed_ad() for _ in range(count)]
    took = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for raw in envelopes:
            open_envelope(raw, CapacityAd, limits=AD_LIMITS)
        took.append(time.perf_counter() - t0)
    return statistics.median(took) / count * 1000


def check_and_store_ms(count: int = 200) -> float:
    """Checking a signed ad and storing it in a peer table written through to SQLite
    on disk, as an owner does with each ad a directory or a table hands it."""
    from node.net.discovery import check_ad
    from node.net.peers import PeerTable
    from node.store import open_node_db

    envelopes = [_signed_ad() for _ in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        table = PeerTable(open_node_db(Path(tmp)), 3600)
        t0 = time.perf_counter()
        for raw in envelopes:
            ad, env = check_ad(raw, None, table, time.time())
            table.accept(ad, env)
        return (time.perf_counter() - t0) / count * 1000


def _signed_ad() -> bytes:
    """A CPU node's ad, sealed by a fresh identity."""
    from nacl.signing import SigningKey

    from protocol import CapacityAd, GpuInfo, Policy, peer_id_from_public_key, seal

    key = SigningKey.generate()
    peer = peer_id_from_public_key(bytes(key.verify_key))
    ad = CapacityAd(peer, [], [GpuInfo("cpu", "cpu")], 1.0, "2", "", Policy(), 0, 1, time.time())
    return seal(ad, key)


def compare(measured: Measured, sim: dict[str, float], every: bool = False) -> dict[str, float]:
    """sim / real for each figure of `summary` (`every`: of `figures`): 1.0 is perfect
    agreement."""
    real = measured.figures() if every else measured.summary()
    return {key: sim[key] / real[key] if real[key] else float("nan") for key in real}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--design", nargs="+", default=["gossip", "directory"])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--costs", default=None, help="the simulator's costs file")
    parser.add_argument(
        "--interval", type=float, default=None, help="publish (gossip) or register interval, s"
    )
    parser.add_argument("--settle", type=float, default=180.0, help="s for a network to settle")
    parser.add_argument("--directories", type=int, default=1, help="M, in design directory")
    parser.add_argument("--rev", default=None, help="run the nodes from this commit's export")
    args = parser.parse_args()
    src, sha = snapshot(args.rev) if args.rev else (None, "working tree")
    result = Result(
        "discovery",
        ["design", "nodes", "figure", "real", "simulated", "sim / real"],
        meta={
            "date": datetime.datetime.now(datetime.UTC).isoformat(),
            "nodes_from": sha,
            "runs": [],
        },
    )
    for design in args.design:
        for n in args.nodes:
            try:
                setup = Setup(design, n, args.interval, args.directories)
                measured = measure(setup, args.window, settle_s=args.settle, src=src)
            except TimeoutError as exc:  # a network this machine cannot hold: say so, go on
                result.add(design, n, "did not settle", str(exc), "", "")
                result.show()
                continue
            sim = simulated(measured, load_costs(args.costs))
            ratios = compare(measured, sim, every=True)
            for key, real in measured.figures().items():
                result.add(
                    design, n, key, round(real, 3), round(sim[key], 3), round(ratios[key], 2)
                )
            run = {**asdict(measured), "simulated": sim, "ratios": ratios}
            result.meta["runs"].append(run)
            result.show()
            result.save()
    console.print(f"saved {result.save()}")


if __name__ == "__main__":
    main()
