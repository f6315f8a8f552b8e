"""Five real nodes on loopback: discovery, departures (SIGTERM, SIGKILL), restarts."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request

import pytest

from node.demo.localnet import LocalNetwork, wait_for

pytestmark = pytest.mark.slow

TTL_S = 3.0


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_five_nodes_find_each_other_and_notice_departures(localnet: LocalNetwork) -> None:
    nodes = localnet.start(5)
    started = time.monotonic()
    localnet.wait_all_see_each_other(timeout=15)
    discovery_s = time.monotonic() - started
    print(f"5 nodes discovered each other {discovery_s:.1f} s after all were up")

    # every peer entry carries the measured figures from the peer's own ad
    for node in nodes:
        for peer in node.get("/api/v1/peers"):
            assert peer["tflops"] > 0
            assert peer["gpus"] and peer["gpus"][0]["kind"] in ("cpu", "cuda")
            assert peer["policy"]["accepting"] is True
            assert all(a.endswith("/p2p/" + peer["peer_id"]) for a in peer["addrs"])
            assert peer["stale"] is False

    # SIGTERM: clean exit, listener closed, others drop it within the TTL
    leaver = nodes[4]
    assert leaver.stop(signal.SIGTERM) == 0, leaver.log_tail()
    assert _refused(leaver.p2p_port), "libp2p port still accepts dials after shutdown"
    gone = time.monotonic()
    wait_for(
        lambda: all(leaver.peer_id not in n.peer_ids() for n in nodes[:4]),
        TTL_S + 4,
        "SIGTERMed node to leave every peer table",
    )
    print(f"SIGTERM'd node dropped after {time.monotonic() - gone:.1f} s (TTL {TTL_S} s)")

    # SIGKILL: no goodbye at all; the TTL still removes it
    victim = nodes[3]
    victim.stop(signal.SIGKILL)
    gone = time.monotonic()
    wait_for(
        lambda: all(victim.peer_id not in n.peer_ids() for n in nodes[:3]),
        TTL_S + 4,
        "SIGKILLed node to leave every peer table",
    )
    print(f"SIGKILL'd node dropped after {time.monotonic() - gone:.1f} s")

    # restart: same data dir, same peer id; it rejoins and is seen again
    old_id = leaver.peer_id
    leaver.start()
    assert leaver.peer_id == old_id
    wait_for(lambda: all(old_id in n.peer_ids() for n in nodes[:3]), 15, "restarted node to rejoin")


def test_restarted_node_shows_what_it_knew_marked_stale(localnet: LocalNetwork) -> None:
    first, second = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=15)
    second.stop(signal.SIGTERM)
    first.stop(signal.SIGTERM)
    # restart the first alone (its bootstrap peer is gone): it remembers the second, stale.
    # A long TTL keeps the stale entry listed while we look.
    first.args += ["--peer-ttl", "60"]
    first.start()
    peers = first.get("/api/v1/peers")
    assert [p["peer_id"] for p in peers] == [second.peer_id]
    assert peers[0]["stale"] is True
    assert peers[0]["tflops"] > 0


def test_sigint_stops_a_node_cleanly(localnet: LocalNetwork) -> None:
    """The node bounds its own stop (node.shutdown; tests/node/test_shutdown.py stops one on
    a busy machine): here it must exit by itself, with code 0, its ports closed."""
    node = localnet.add()
    started = time.monotonic()
    assert node.stop(signal.SIGINT) == 0, node.log_tail()
    print(f"SIGINT to exit: {time.monotonic() - started:.2f} s")
    assert _refused(node.p2p_port) and _refused(node.http_port)
    assert "node stopped" in node.log_tail()


def test_mdns_finds_lan_peers_without_bootstrap(localnet: LocalNetwork) -> None:
    localnet.add(["--mdns"], bootstrap=False)
    localnet.add(["--mdns"], bootstrap=False)
    localnet.wait_all_see_each_other(timeout=30)


def _metric(node, name: str) -> float:  # noqa: ANN001
    with urllib.request.urlopen(f"{node.api}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in {node.name}'s /metrics")


def test_a_node_with_too_many_connections_closes_the_idle_ones(localnet: LocalNetwork) -> None:
    hub = localnet.add(["--target-peers", "1", "--max-connections", "2", "--connection-idle", "1"])
    others = localnet.add_many(4, ["--target-peers", "3"])  # each dials the hub, its bootstrap
    localnet.wait_all_see_each_other(timeout=30)
    wait_for(
        lambda: _metric(hub, "meshminer_connections_trimmed_total") >= 2,
        30,
        "the hub to close idle connections",
    )
    # the others find their three connections among themselves, not by dialling the hub
    # back (a peer that closed on them waits a minute)
    wait_for(
        lambda: (
            hub.get("/api/v1/status")["connections"] <= 2
            and all(n.get("/api/v1/status")["connections"] >= 3 for n in others)
        ),
        30,
        "the hub to keep at most 2 connections and every other node 3",
    )
    # gossip still carries every ad over what is left, the hub's own included
    localnet.wait_all_see_each_other(timeout=15)


def test_a_restarted_bootstrap_node_dials_the_peers_it_knew(localnet: LocalNetwork) -> None:
    nodes = localnet.start(4)
    localnet.wait_all_see_each_other(timeout=20)
    hub = nodes[0]  # everybody's bootstrap; it has none of its own
    # every node's dialler has seen its connection to the hub (it looks every 2 s)
    wait_for(
        lambda: (
            all(n.get("/api/v1/status")["uptime_s"] > 5 for n in nodes)
            and hub.get("/api/v1/status")["connections"] == 3
        ),
        20,
        "a settled network",
    )
    assert hub.stop(signal.SIGTERM) == 0
    hub.start()
    # the others still hold connections among themselves, so they wait a minute before
    # redialling it; the hub dials them from the peer table it kept
    wait_for(lambda: hub.get("/api/v1/status")["connections"] >= 3, 20, "the hub to reconnect")

    def hub_fresh_everywhere() -> bool:
        listed = [
            [p for p in n.get("/api/v1/peers") if p["peer_id"] == hub.peer_id] for n in nodes[1:]
        ]
        return all(entry and not entry[0]["stale"] for entry in listed)

    wait_for(hub_fresh_everywhere, 15, "every node to hear the restarted hub's ads")
