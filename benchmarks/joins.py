"""What nodes joining and restarting cost a large network: the capacity ads the nodes
already in it receive by gossip, in the code under test and in a baseline commit, one
after the other in one run.

    .venv/bin/python -m benchmarks.joins [--nodes 20] [--joins 4] [--baseline 6999d50]

A cluster of real node processes on loopback: node 0 a directory, the others
volunteers that count the network as large (`--gossip-max-peers 2`: no ad of theirs
should go to everyone). Once every volunteer is registered, the ads the settled nodes
accept by gossip are counted over a quiet window (the directory's own ad, its
refresh: the baseline rate), then while `--joins` new nodes join and as many
volunteers restart (each waited for until it is registered again). The figure is the
ads each settled node received per join or restart beyond the quiet rate; each of
them costs a node about 10 ms of CPU (docs/performance.md). Goal: 0 (a joiner's or a
restarted node's ad goes to the directories, not to everyone).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import STATUS, Cluster, Node, Result, run_parts, snapshot, total, wait_for

ARGS = ["--publish-interval", "5", "--peer-ttl", "15", "--gossip-max-peers", "2"]
ACCEPTED = 'meshminer_ads_accepted_total{via="gossip"}'


def _registered(node: Node) -> bool:
    discovery = node.get(STATUS)["discovery"]
    return bool(discovery.get("registered_with")) and not discovery.get("gossips_own_ad", True)


def _accepted(nodes: list[Node]) -> float:
    return sum(total(n.metrics(), ACCEPTED) for n in nodes)


def measure(nodes: int, joins: int, quiet_s: float, src: Path) -> dict[str, Any]:
    """One cluster from the code in `src`: ads per settled node per join or restart."""
    with Cluster(ARGS, src=src) as cluster:
        everyone = cluster.start(nodes, first=["--directory"])
        volunteers = everyone[1:]
        wait_for(lambda: all(_registered(n) for n in volunteers), 180, "every registration")
        restarting = volunteers[-joins:]
        settled = [everyone[0], *volunteers[:-joins]]
        before, began = _accepted(settled), time.monotonic()
        time.sleep(quiet_s)
        quiet = (_accepted(settled) - before) / (time.monotonic() - began)
        before, began = _accepted(settled), time.monotonic()
        joiners = [cluster.add() for _ in range(joins)]
        for node in restarting:
            node.proc.terminate()
            node.proc.wait(timeout=30)
            joiners.append(cluster.add(data_dir=node.data_dir))
        wait_for(lambda: all(_registered(n) for n in joiners), 180, "the joiners' registrations")
        time.sleep(5.0)  # an ad published at the end still travels
        span = time.monotonic() - began
        extra = _accepted(settled) - before - quiet * span
        published = sum(total(n.metrics(), "meshminer_ads_published_total") for n in joiners)
    return {
        "ads_per_node_per_event": extra / len(settled) / (2 * joins),
        "published_by_joiners": published,
        "quiet_ads_per_node_min": quiet / len(settled) * 60,
        "window_s": span,
    }


def joins(nodes: int, count: int, baseline: str, quiet_s: float) -> Result:
    result = Result(
        f"joins and restarts in a large network ({nodes} nodes, {count} of each)",
        ["code", "ads each node received per join or restart", "ads the joiners published"],
    )
    for name, rev in (("baseline", baseline), ("this commit", "HEAD")):
        src, sha = snapshot(rev)
        measured = measure(nodes, count, quiet_s, src)
        result.add(f"{name} ({sha[:7]})", measured["ads_per_node_per_event"],
                   measured["published_by_joiners"])  # fmt: skip
        result.meta[name] = {"commit": sha, **measured}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--joins", type=int, default=4)
    parser.add_argument("--baseline", default="6999d50", help="the commit to compare with")
    parser.add_argument("--quiet", type=float, default=20.0, help="s of the quiet window")
    args = parser.parse_args()
    run_parts(
        "joins",
        ["joins"],
        {"joins": lambda: joins(args.nodes, args.joins, args.baseline, args.quiet)},
    )


if __name__ == "__main__":
    main()
