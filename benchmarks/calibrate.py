"""Measure, on real nodes, what each discovery message costs: the simulator's inputs.

    .venv/bin/python -m benchmarks.calibrate [--window 30] [--out benchmarks/simulate/costs.json]

Why: `benchmarks.simulate` answers for 10,000 peers only as well as its per-message
costs are true. Each figure here comes from a real cluster on loopback, as the
difference in process CPU (psutil) between a busy and a quiet window, divided by the
messages counted on the nodes' own `/metrics` (`meshminer_discovery_messages_total`):

1. one lone node, nothing to discover: `idle_ms_per_min`;
2. 10 nodes that never publish (interval 3600 s): `conn_ms_per_min` per open connection;
   then three nodes join it one by one, and each one's log says how soon after "up"
   it took in its first peer and how long each further ad of the table took:
   `table_ad_check_ms`, and `join_connect_ms` (the first, less a round trip and one
   ad);
3. 10 publishing every 3 s: `ad_ms` per ad received (GossipSub included);
4. a directory and 5 volunteers registering every second: `register_client_ms` and
   `register_server_ms`; then, with one node running searches (`/api/v1/peers/find`)
   back to back, `probe_client_ms` (its CPU per probe) and `probe_server_ms`. A query
   is taken to cost what a registration costs on each side (one signed request, one
   signed answer): after its first search an owner has enough candidates in hand and
   asks the directory too rarely to measure;
5. in this process, a libp2p host of ours: `connect_ms` (a request to a peer not yet
   connected), `dial_ms` (this process's CPU for that new connection, the handshakes
   and what follows them within 0.3 s: identify, GossipSub's hello, the ad exchange;
   the work an owner does in turn when it probes many peers it is not connected to),
   `rtt_ms` (a probe on an open one), `dial_timeout_s` (a dial to a port nobody
   listens on), and `ad_check_ms` (checking one signed ad and storing it in a peer
   table on disk);
6. in this process too, `receipt_ms`: `ad_ms` plus what a receipt's checks and audit
   insert take beyond an ad's (`receipt_costs`), and `receipt_bytes`.

Two figures come from the NAT lab, not from here, and are kept as found in the file:
`relayed_probe_ms` (an owner's probe to a peer behind a NAT over a new connection,
which goes through a relay: `tests/netlab/test_nat.py` prints it) and
`relay_circuit_ms` (a relay's CPU per circuit, estimated as two new connections'
`dial_ms`: the HOP and STOP streams and the piping of the handshakes through it).

It also records the machine's yardstick, `speed_ms` (`benchmarks.discovery.speed_ms`,
the median of its readings before and between the phases), so that a real network
measured on a faster or slower machine is compared with these costs scaled to it.

The directory cluster is 6 nodes and the gossip ones publish every 3 s, so that the
simulator's check against 10, 25 and 50 nodes (`benchmarks.discovery`, every 5 s and
more) is not a check against its own calibration.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.discovery import (
    STATUS,
    _discovery,
    check_and_store_ms,
    joined_times,
    speed_ms,
)
from benchmarks.gossip import cpu_window, settle
from benchmarks.harness import Cluster, Node, console, wait_for
from node.demo.localnet import free_port

COSTS = Path(__file__).parent / "simulate" / "costs.json"
MESSAGES = "meshminer_discovery_messages_total"
SIZE = 6  # nodes in the directory cluster: not a size the simulator is checked at
GOSSIP_SIZE = 10  # gossip costs depend on the mesh, full from about 10 nodes on
DIAL_SETTLE_S = 0.3  # after a dial: long enough for what follows the handshakes


def messages(node: Node, direction: str, kind: str) -> float:
    key = f'{MESSAGES}{{direction="{direction}",kind="{kind}"}}'
    return node.metrics().get(key, 0.0)


def window(nodes: list[Node], seconds: float, counted: list[tuple[str, str]]) -> dict[str, Any]:
    """CPU ms per minute of each node, and per minute of each counted message kind."""
    before = [{c: messages(n, *c) for c in counted} for n in nodes]
    w = cpu_window(nodes, seconds)
    after = [{c: messages(n, *c) for c in counted} for n in nodes]
    scale = 60 / w["wall_s"]
    return {
        "cpu": [c * scale * 1000 for c in w["cpu_s"]],
        "counts": [
            {c: (a[c] - b[c]) * scale for c in counted} for a, b in zip(after, before, strict=True)
        ],
        "others_cores": w["others_cores"],
    }


def lone(seconds: float) -> float:
    with Cluster(["--publish-interval", "3600"]) as cluster:
        nodes = cluster.start(1)
        time.sleep(5)  # start-up work (capacity, first ad) is over
        return window(nodes, seconds, [])["cpu"][0]


def quiet_and_ads(seconds: float, idle: float) -> dict[str, float]:
    """Connections and ads at GOSSIP_SIZE nodes (GossipSub's mesh is full there), and how
    soon a joining node takes in its first peer (its log: "up" to "peer joined")."""
    out: dict[str, float] = {}
    with Cluster(["--publish-interval", "3600"]) as cluster:
        nodes = cluster.start(GOSSIP_SIZE)
        _all_listed(nodes)
        settle(nodes)
        conns = statistics.mean(n.get(STATUS)["connections"] for n in nodes)
        quiet = statistics.mean(window(nodes, seconds, [])["cpu"])
        out["conn_ms_per_min"] = max(0.0, (quiet - idle) / conns)
        firsts, per_ad = [], []
        for _ in range(3):
            joiner = cluster.add()
            wait_for(lambda j=joiner: len(j.get("/api/v1/peers")) >= GOSSIP_SIZE, 60, "joined")
            times = joined_times(joiner)[:GOSSIP_SIZE]  # the first table: one per node
            firsts.append(times[0])
            per_ad.append((times[-1] - times[0]) / (len(times) - 1))
        out["join_s"] = statistics.median(firsts)
        # what a real node spends on each ad of a table (check, peer table in node.db,
        # peerstore, log): more than the in-process check, it decides a joiner's wait
        out["table_ad_check_ms"] = statistics.median(per_ad) * 1000
    with Cluster(["--publish-interval", "3", "--peer-ttl", "9"]) as cluster:
        nodes = cluster.start(GOSSIP_SIZE)
        _all_listed(nodes)
        settle(nodes)
        w = window(nodes, seconds, [("in", "ad")])
        ads = statistics.mean(c[("in", "ad")] for c in w["counts"])
        out["ad_ms"] = (statistics.mean(w["cpu"]) - quiet) / ads
    return out


def _all_listed(nodes: list[Node]) -> None:
    want = len(nodes) - 1
    wait_for(lambda: all(len(n.get("/api/v1/peers")) >= want for n in nodes), 120, "all listed")


def directory_costs(seconds: float, idle: float, per_conn: float, ad_ms: float) -> dict[str, float]:
    args = ["--publish-interval", "1", "--peer-ttl", "3", "--gossip-max-peers", "2"]
    with Cluster(args) as cluster:
        nodes = cluster.start(SIZE, first=["--directory"])
        directory, volunteers = nodes[0], nodes[1:]
        want = SIZE - 1
        wait_for(lambda: _discovery(directory).get("directory_holds") == want, 120, "registered")
        wait_for(lambda: all(not _discovery(n)["gossips_own_ad"] for n in volunteers), 60, "quiet")
        wait_for(  # the ads gossiped before the switch expire (TTL 3 s)
            lambda: all(len(n.get("/api/v1/peers")) <= 1 for n in volunteers), 60, "expired"
        )
        settle(nodes)
        conns = [n.get(STATUS)["connections"] for n in nodes]
        base = [idle + per_conn * c for c in conns]
        counted = [("out", "register"), ("in", "register"), ("in", "ad"), ("out", "ad")]
        w = window(nodes, seconds, counted)
        ads = [c[("in", "ad")] * ad_ms for c in w["counts"]]
        client = [
            (cpu - b - a) / c[("out", "register")]
            for cpu, b, a, c in zip(w["cpu"][1:], base[1:], ads[1:], w["counts"][1:], strict=True)
        ]
        server = (w["cpu"][0] - base[0] - w["counts"][0][("out", "ad")] * ad_ms) / w["counts"][0][
            ("in", "register")
        ]
        # searches back to back from volunteer 1, in a thread-free loop over HTTP
        owner = volunteers[0]
        counted = [("out", "probe")]
        before = [{c: messages(n, *c) for c in counted} for n in nodes]
        t0, cpu0 = time.monotonic(), [n.cpu_s() for n in nodes]
        while time.monotonic() - t0 < seconds:
            owner.get("/api/v1/peers/find?k=8")
        wall = time.monotonic() - t0
        cpu = [(n.cpu_s() - c) * 60 / wall * 1000 for n, c in zip(nodes, cpu0, strict=True)]
        after = [{c: messages(n, *c) for c in counted} for n in nodes]
        sent = [
            (a[("out", "probe")] - b[("out", "probe")]) * 60 / wall
            for a, b in zip(after, before, strict=True)
        ]
        probes_made = sum(sent)  # each probe answered is one "out:probe" on the probed node
        idle_w = w["cpu"]
        served = [(cpu[i] - idle_w[i]) / sent[i] for i in range(2, len(nodes)) if sent[i] > 0]
        register_client = statistics.median(client)
        return {
            "register_client_ms": register_client,
            # a query is a registration's twin on the owner's side (one request, one
            # signed answer); each ad in the answer is then checked
            "query_client_ms": register_client,
            "query_server_ms": server,
            "register_server_ms": server,
            "probe_client_ms": (cpu[1] - idle_w[1]) / probes_made,
            "probe_server_ms": statistics.median(served),
        }


def host_costs() -> dict[str, float]:
    """Connect, probe round trip, dead dial and ad check, timed in this process."""
    import trio
    from nacl.signing import SigningKey

    from node.identity import Identity
    from node.net.host import HostError, MeshHost
    from protocol import AD_LIMITS
    from protocol.names import PROBE_PROTOCOL

    out: dict[str, float] = {}
    connects: list[float] = []
    dial_cpu: list[float] = []
    rtts: list[float] = []
    ads: list[bytes] = []

    async def session(addr: str, first: bool) -> None:
        """A fresh host (no connection yet): one connect, then probes on it."""
        port = free_port()
        listen = f"/ip4/127.0.0.1/tcp/{port}"
        async with MeshHost.start(Identity(SigningKey.generate()), listen) as host:
            cpu0 = time.process_time()
            await trio.sleep(DIAL_SETTLE_S)
            idle = time.process_time() - cpu0
            t0, cpu0 = time.perf_counter(), time.process_time()
            peer = await host.connect(addr)
            connects.append(time.perf_counter() - t0)
            # identify, GossipSub's hello and the ad exchange follow the handshakes
            await trio.sleep(DIAL_SETTLE_S)
            dial_cpu.append(time.process_time() - cpu0 - idle)
            for _ in range(10):
                t0 = time.perf_counter()
                ads.append(await host.request(peer, PROBE_PROTOCOL, b"", AD_LIMITS.max_bytes))
                rtts.append(time.perf_counter() - t0)
            if first:
                dead = free_port()
                t0 = time.perf_counter()
                with contextlib.suppress(HostError):
                    await host.connect(f"/ip4/127.0.0.1/tcp/{dead}/p2p/{peer}")
                out["dial_timeout_s"] = time.perf_counter() - t0

    with Cluster(["--publish-interval", "3600"]) as cluster:
        (node,) = cluster.start(1)
        addr = node.get(STATUS)["addrs"][0]
        for i in range(5):
            trio.run(session, addr, i == 0)
    out["connect_ms"] = statistics.median(connects) * 1000
    out["dial_ms"] = statistics.median(dial_cpu) * 1000
    out["rtt_ms"] = statistics.median(rtts) * 1000
    store = statistics.median(check_and_store_ms() for _ in range(5))
    out["ad_check_ms"] = store
    # bytes on the wire, framing aside: one ad each way (a probe, a registration)
    out["ad_bytes"] = out["probe_bytes"] = out["register_bytes"] = len(ads[-1])
    return out


def receipt_costs(ad_ms: float) -> dict[str, float]:
    """A receipt travels the GossipSub path an ad does, so it costs `ad_ms` plus what
    its own checks take beyond an ad's: two signatures, checked twice (the validator,
    then the audit table), and the audit table's insert. Timed here, both on disk."""
    extra = statistics.median(receipt_check_ms() - check_and_store_ms() for _ in range(5))
    return {"receipt_ms": ad_ms + extra, "receipt_bytes": len(_cosigned_receipts(1)[0][0])}


def receipt_check_ms(count: int = 200) -> float:
    """A node taking one gossiped receipt: `check_receipt`, then `AuditLog.add`."""
    import tempfile

    from ledger.audit import AuditLog
    from node.net.receipts_gossip import check_receipt

    receipts = _cosigned_receipts(count)
    with tempfile.TemporaryDirectory() as tmp, AuditLog.open(Path(tmp)) as audit:
        t0 = time.perf_counter()
        for raw, publisher in receipts:
            check_receipt(raw, publisher)
            audit.add(raw)
        return (time.perf_counter() - t0) / count * 1000


def _cosigned_receipts(count: int) -> list[tuple[bytes, str]]:
    """`count` receipts of one owner and worker, co-signed, each with its owner's id."""
    from nacl.signing import SigningKey

    from protocol import peer_id_from_public_key, seal
    from protocol.receipts import countersign, issue
    from protocol.work import Receipt

    owner, worker = SigningKey.generate(), SigningKey.generate()
    ids = [peer_id_from_public_key(bytes(k.verify_key)) for k in (owner, worker)]
    out = []
    for i in range(count):
        receipt = Receipt(
            f"{i:016x}", f"{i:016x}", ids[0], ids[1], "ab" * 32, 500, 32_000,
            {"val_loss": 0.12}, time.time(),
        )  # fmt: skip
        out.append((countersign(issue(seal(receipt, owner), 1.0, owner), worker, 1.0), ids[0]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=float, default=45.0)
    parser.add_argument("--out", type=Path, default=COSTS)
    args = parser.parse_args()
    # the yardstick between the phases, their median: the machine's speed moves in minutes
    speeds = [speed_ms()]
    costs: dict[str, Any] = host_costs()
    console.print(costs)
    costs["idle_ms_per_min"] = idle = lone(args.window)
    speeds.append(speed_ms())
    gossip = quiet_and_ads(args.window, idle)
    speeds.append(speed_ms())
    # a joiner's first peer comes a connection, a round trip and a table's checks after "up"
    join_s = gossip.pop("join_s")
    first_check = gossip["table_ad_check_ms"] / 1000
    costs["join_connect_ms"] = max(0.0, join_s - costs["rtt_ms"] / 1000 - first_check) * 1000
    costs.update(gossip)
    costs.update(receipt_costs(costs["ad_ms"]))
    console.print(costs)
    costs.update(directory_costs(args.window, idle, costs["conn_ms_per_min"], costs["ad_ms"]))
    speeds.append(speed_ms())
    costs["speed_ms"] = statistics.median(speeds)
    console.print(f"yardstick between the phases: {', '.join(f'{v:.3f}' for v in speeds)} ms")
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged = {**old, **{k: round(v, 4) for k, v in costs.items()}}
    merged.update(
        measured=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        commit=sha.stdout.strip(),
        notes=f"benchmarks.calibrate on {platform.processor() or platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores, window {args.window:g} s; "
        "gossip_hop_ms from benchmarks.gossip (reach-all p50 26 ms at 10 nodes over 2 hops), "
        "not re-measured",
    )
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    console.print(merged)


if __name__ == "__main__":
    main()
