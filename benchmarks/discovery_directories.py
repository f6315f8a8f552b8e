"""Several directories in `benchmarks.discovery` (`--directories M`): starting them,
waiting until every volunteer is registered with its D of them, and their CPU.

Nodes 0..M-1 serve as directories; node 0 is every node's bootstrap peer and hands a
joiner the directories' ads it holds, so the other M-1 start first and node 0 knows
them all before any volunteer starts. Each volunteer registers with D = min(2, M) of
them (the node's default `directory_peers`, 2), chosen by rendezvous hashing; the
network counting as large at once (`--gossip-max-peers 2`), it drops any others after
its first counts, and their copies expire within the TTL.
"""

from __future__ import annotations

import statistics
from collections import Counter

from benchmarks.harness import STATUS, Cluster, Node, wait_for

DIRECTORY = "/api/v1/directory"


def start_directories(cluster: Cluster, m: int, timeout: float) -> list[Node]:
    """Node 0 and M-1 more directories, once node 0 holds the others' ads."""
    nodes = cluster.start(1, timeout, ["--directory"])
    for _ in range(m - 1):
        cluster.add(["--directory"])
    for node in nodes[1:]:
        node.peer_id = wait_for(lambda n=node: n.get(STATUS)["peer_id"], timeout, "APIs")
    wait_for(
        lambda: nodes[0].get(STATUS)["discovery"].get("directories") == m - 1,
        timeout,
        "node 0 to know every directory",
    )
    return nodes


def held(directories: list[Node]) -> list[set[str]]:
    """The peer ids each directory holds a registration of."""
    return [{e["peer_id"] for e in d.get(DIRECTORY)} for d in directories]


def wait_registered(
    directories: list[Node], volunteers: list[Node], per: int, timeout: float, exact: bool
) -> None:
    """Every volunteer held by a directory; with `exact`, each by exactly `per` of them
    (the copies it left at others expired)."""

    def done() -> bool:
        counts = Counter(p for ids in held(directories) for p in ids)
        if exact:
            return all(counts[v.peer_id] == per for v in volunteers)
        return all(counts[v.peer_id] for v in volunteers)

    what = f"every volunteer held by {per} directories" if exact else "a wave registered"
    wait_for(done, timeout, what, every=0.5)


def real_cpu(per_directory: list[float]) -> dict[str, float]:
    """The directories' CPU (ms a minute): the busiest and the mean."""
    if not per_directory:
        return {}
    return {
        "directory_cpu_max": max(per_directory),
        "directory_cpu_mean": statistics.mean(per_directory),
    }
