"""The discovery simulator (benchmarks/simulate): its figures agree with what can be
worked out by hand for simple cases, so its answers at sizes we cannot run are worth
reading. Small networks and short runs only: the whole file takes a few seconds."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from benchmarks.simulate import Scenario, load_costs, simulate
from benchmarks.simulate.costs import COST_KEYS, DEFAULT_PATH, costs_from_dict
from benchmarks.simulate.directory import DirectoryNetwork
from benchmarks.simulate.engine import Engine, sweep_after
from benchmarks.simulate.network import DIRECTORY

# round figures, so that expectations can be worked out by hand (the measured ones are
# in costs.json); every probe here needs a new connection (probe_connected=0)
COSTS = costs_from_dict(
    {
        "idle_ms_per_min": 300, "conn_ms_per_min": 4, "ad_ms": 11, "ad_bytes": 900,
        "table_ad_check_ms": 1.0, "register_client_ms": 2.0, "register_server_ms": 2.5,
        "register_bytes": 1000, "query_client_ms": 2.0, "query_server_ms": 2.0,
        "query_per_ad_ms": 0.05, "ad_check_ms": 1.0, "probe_client_ms": 2.0,
        "probe_server_ms": 2.0, "probe_bytes": 1000, "rtt_ms": 3.0, "connect_ms": 280,
        "dial_ms": 30, "join_connect_ms": 60, "dial_timeout_s": 2.0, "gossip_hop_ms": 5.0,
        "sweep_s": 1.0, "receipt_ms": 12, "receipt_bytes": 1500, "relayed_probe_ms": 700,
        "relay_circuit_ms": 20,
    }
)  # fmt: skip
QUIET = {"churn_per_hour": 0.0, "burst_at_s": None, "receipt_gossip": False}  # no one leaves
# every node asks three peers to dial it back every 5 minutes, and is asked as often
DIAL_BACKS = 3 * (COSTS.probe_client_ms + COSTS.probe_server_ms + 2 * COSTS.dial_ms) / 5


def per_min(ms_per_interval: float, interval_s: float) -> float:
    return ms_per_interval * 60 / interval_s


def test_the_measured_costs_load() -> None:
    measured = load_costs()
    assert measured.measured != "placeholder" and "benchmarks.calibrate" in measured.meta["notes"]
    assert 0 < measured.ad_check_ms < measured.ad_ms and measured.connect_ms > 0


def test_costs_file_with_unknown_or_missing_keys_is_refused(tmp_path) -> None:
    data = json.loads(DEFAULT_PATH.read_text())
    data["ad_msec"] = data.pop("ad_ms")
    data["date"] = "2026-11-23"  # metadata: allowed
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="missing keys: ad_ms") as err:
        load_costs(path)
    assert "unknown keys: ad_msec" in str(err.value)
    data["ad_ms"] = -1
    del data["ad_msec"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="ad_ms must be a finite number >= 0"):
        load_costs(path)


def test_costs_measured_on_another_machine_scale_by_its_yardstick() -> None:
    data = {f: getattr(COSTS, f) for f in COST_KEYS}
    assert COSTS.on_machine(2.0) == COSTS  # no yardstick in the file: as measured
    costs = costs_from_dict({**data, "speed_ms": 0.1})
    slower = costs.on_machine(0.2)  # a machine half as fast
    assert slower.ad_ms == 2 * costs.ad_ms and slower.dial_ms == 2 * costs.dial_ms
    assert slower.rtt_ms == 2 * costs.rtt_ms  # on loopback a round trip is CPU
    assert slower.ad_bytes == costs.ad_bytes and slower.dial_timeout_s == costs.dial_timeout_s
    for bad in (0, -1, "fast", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="speed_ms must be a number > 0"):
            costs_from_dict({**data, "speed_ms": bad})


def test_engine_runs_in_time_order_and_ties_in_schedule_order() -> None:
    engine, seen = Engine(), []
    for time, name in ((2.0, "c"), (1.0, "a"), (1.0, "b")):
        engine.at(time, seen.append, name)
    engine.run(1.5)
    assert seen == ["a", "b"] and engine.now == 1.5
    engine.run(5.0)
    assert seen == ["a", "b", "c"] and engine.events == 3
    assert sweep_after(10.2, 90.0, 1.0) == 101.0 and sweep_after(10.0, 90.0, 1.0) == 101.0


def test_gossip_cpu_is_every_other_nodes_ad() -> None:
    """(N-1) ads per interval at ad_ms each, on top of idle and connections: linear in N."""
    base = COSTS.idle_ms_per_min + 8 * COSTS.conn_ms_per_min + DIAL_BACKS
    for peers in (100, 400):
        sc = Scenario(design="gossip", peers=peers, duration_s=600, **QUIET)
        result = simulate(sc, COSTS)
        expected = base + per_min((peers - 1) * COSTS.ad_ms, sc.publish_interval_s)
        assert result.volunteer_cpu_ms_per_min_mean == pytest.approx(expected, rel=0.05)
        assert result.volunteer_bytes_per_min_mean == pytest.approx(
            per_min(peers * COSTS.ad_bytes, sc.publish_interval_s), rel=0.05
        )
        assert math.isnan(result.directory_cpu_ms_per_min_mean)
        assert result.find_k_s_max == 0 and result.offers_to_dead == 0


def test_directory_volunteer_cpu_does_not_grow_with_n() -> None:
    small, large = (
        simulate(Scenario(design="directory", peers=n, duration_s=600, burst_at_s=None), COSTS)
        for n in (200, 2000)
    )
    assert (small.directories, large.directories) == (1, 2)
    assert large.volunteer_cpu_ms_per_min_mean == pytest.approx(
        small.volunteer_cpu_ms_per_min_mean, rel=0.10
    )
    # a directory pays for its registrants: N*D/M registrations per interval, one
    # connection each
    registrants = 2000 * 2 / 2
    floor = per_min(registrants * COSTS.register_server_ms, 30) + registrants * 4
    assert large.directory_cpu_ms_per_min_mean > floor


def test_directory_drop_time_lies_within_one_refresh_of_the_ttl() -> None:
    sc = Scenario(design="directory", peers=300, duration_s=900, churn_per_hour=3.0)
    network = DirectoryNetwork(sc, COSTS)
    network.run()
    drops = network.drop_dead
    assert len(drops) > 100
    low = sc.registration_ttl_s - sc.register_interval_s
    assert low <= min(drops) and max(drops) <= sc.registration_ttl_s + COSTS.sweep_s + 0.01


def test_find_k_without_dead_peers_is_one_query_and_one_probe() -> None:
    sc = Scenario(design="directory", peers=300, duration_s=600, probe_connected=0.0, **QUIET)
    result = simulate(sc, COSTS)
    c, n = COSTS, 2 * sc.k
    # the query's round trip; checking its 2K ads and sending 2K probes, in turn; every
    # probe needs a new connection, whose handshakes the owner does in turn (the peer's
    # side at once, on its own machine): each answer comes when the last is done
    query = c.rtt_ms + c.query_server_ms + n * c.query_per_ad_ms  # (the directory is idle)
    sending = c.query_client_ms + n * c.ad_check_ms + n * c.probe_client_ms
    dialling = n * c.dial_ms + c.dial_ms + c.connect_ms
    expected = (query + sending + c.rtt_ms + c.probe_server_ms + dialling) / 1000
    # (its idling and connections take 2.5% of its core: each request 2.5% slower)
    assert result.find_k_s_p50 == pytest.approx(expected, rel=2e-4)
    assert result.find_k_s_max == pytest.approx(expected, rel=2e-4)
    assert result.query_rounds_mean == 1 and result.dead_candidates_probed == 0
    assert result.placements == 10 * 8 and result.placements_failed == 0


def test_after_a_burst_dead_candidates_are_probed_and_k_live_still_found() -> None:
    calm = Scenario(design="directory", peers=300, duration_s=600, churn_per_hour=0.0)
    burst = dataclasses.replace(calm, burst_at_s=300.0, burst_fraction=0.6)
    before, after = simulate(calm, COSTS), simulate(burst, COSTS)
    assert after.dead_candidates_probed > 0 and after.offers_to_dead == 0
    assert after.find_k_s_max >= COSTS.dial_timeout_s > before.find_k_s_max
    assert after.query_rounds_mean > 1
    assert after.placements_failed == 0
    # the gossip design offers to dead peers instead
    gossip = simulate(dataclasses.replace(burst, design="gossip"), COSTS)
    assert gossip.offers_to_dead > 0


def test_gossip_joiner_copies_keep_dead_peers_longer_but_bounded() -> None:
    sc = Scenario(design="gossip", peers=300, duration_s=900, churn_per_hour=3.0, burst_at_s=None)
    result = simulate(sc, COSTS)
    assert result.dead_measured > 100
    assert result.drop_dead_s_p50 >= sc.peer_ttl_s - sc.publish_interval_s
    # a joiner accepts ads up to ttl + skew old, and keeps them one more ttl
    assert result.drop_dead_s_max <= 2 * sc.peer_ttl_s + sc.clock_skew_s + COSTS.sweep_s
    checks = 299 * COSTS.table_ad_check_ms
    expected_first_peer = (COSTS.join_connect_ms + COSTS.rtt_ms + checks) / 1000
    assert result.first_peer_s_p50 == pytest.approx(expected_first_peer, rel=0.02)


def test_directory_deaths_move_their_volunteers() -> None:
    sc = Scenario(
        design="directory",
        peers=300,
        directories=4,
        duration_s=900,
        churn_per_hour=4.0,
        directory_churn=True,
    )
    network = DirectoryNetwork(sc, COSTS)
    network.run()
    dead = [d for d in network.directory_ids if not network.alive[d]]
    settled = sc.duration_s - 2 * sc.register_interval_s  # joined in time to be chosen
    new = [d for d in network.directory_ids if 0 < network.born[d] < settled and network.alive[d]]
    assert dead and new and all(network.reg[d] for d in new)  # the newcomers took some
    volunteers = [
        v
        for v in network.live.items
        if network.role[v] != DIRECTORY and network.born[v] < sc.duration_s - 10
    ]
    held = [len(network.held_by[v]) for v in volunteers]
    # a volunteer whose directory died re-registers within one interval + a dial timeout
    assert min(held) >= 1 and sum(h >= 2 for h in held) >= 0.9 * len(held)
    assert all(d not in dead for v in volunteers for d in network.choice[v])


def test_same_seed_same_result() -> None:
    def run(design: str, seed: int) -> dict:
        sc = Scenario(design=design, peers=200, duration_s=400, churn_per_hour=2.0, seed=seed)
        figures = simulate(sc, COSTS).to_dict()
        return {k: v for k, v in figures.items() if k not in ("wall_s", "cpu_s")}

    for design in ("gossip", "directory"):
        first = run(design, 1)
        assert json.dumps(first) == json.dumps(run(design, 1))
        assert json.dumps(first) != json.dumps(run(design, 2))
