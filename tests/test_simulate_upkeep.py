"""The simulator's model of what the node does beside finding peers (upkeep.py) and of a
directory's one thread (saturation): each figure against what it must be by hand."""

from __future__ import annotations

import dataclasses

import pytest
from test_simulate import COSTS, QUIET  # round figures, worked out by hand there

from benchmarks.simulate import Scenario, simulate
from benchmarks.simulate.directory import DirectoryNetwork
from benchmarks.simulate.registration import REQUEST_TIMEOUT_S

CORE = 60_000.0


def test_every_unit_ends_in_a_receipt_that_every_node_of_a_small_network_pays_for() -> None:
    """10 owners place K = 8 units a minute from the end of warm-up on: 80 receipts a
    minute once the first units (1 minute long here) ended, each `receipt_ms` on every
    volunteer (12 of the 13 minutes measured). In a large network only directories take
    them."""
    quiet = {**QUIET, "receipt_gossip": True}
    small = Scenario(peers=300, gossip_max_peers=1000, unit_minutes=1.0, duration_s=900, **quiet)
    with_receipts = simulate(small, COSTS)
    without = simulate(dataclasses.replace(small, receipt_gossip=False), COSTS)
    expected = 80 * COSTS.receipt_ms / CORE * 100 * 12 / 13
    assert with_receipts.volunteer_receipts_pct_mean == pytest.approx(expected, rel=0.05)
    assert without.volunteer_receipts_pct_mean == 0
    extra = with_receipts.volunteer_cpu_pct_mean - without.volunteer_cpu_pct_mean
    assert extra == pytest.approx(expected, rel=0.05)

    large = dataclasses.replace(small, gossip_max_peers=100)
    with_receipts = simulate(large, COSTS)
    without = simulate(dataclasses.replace(large, receipt_gossip=False), COSTS)
    assert with_receipts.volunteer_receipts_pct_mean == 0
    extra = with_receipts.directory_cpu_pct_mean - without.directory_cpu_pct_mean
    assert extra == pytest.approx(expected, rel=0.05)


def test_volunteers_behind_nats_hold_relay_slots_and_answer_probes_through_them() -> None:
    """With 90% of volunteers behind NATs nearly every probe over a new connection goes
    through a relay (700 ms longer here), so the K-th answer takes that much longer,
    and no relay holds over 64 slots."""
    sc = Scenario(peers=400, duration_s=900, probe_connected=0.0, **QUIET)
    public = simulate(sc, COSTS)
    natted = simulate(dataclasses.replace(sc, nat_share=0.9), COSTS)
    relayed = COSTS.relayed_probe_ms / 1000
    assert natted.find_k_s_p50 == pytest.approx(public.find_k_s_p50 + relayed, rel=0.01)
    assert natted.placements_failed == 0
    assert 2 <= natted.relay_slots_max <= 64 and public.relay_slots_max == 0


def test_a_directory_past_its_core_answers_too_late_and_its_volunteers_go_elsewhere() -> None:
    """A directory is one thread. At 120 ms a registration, its 500 volunteers, each
    every 30 s, ask for twice its core: requests queue past the 3 s timeout, and the
    volunteers rest it and try the other. Unsaturated, answers take milliseconds."""
    slow = dataclasses.replace(COSTS, register_server_ms=120.0)
    sc = Scenario(peers=1000, directories=2, duration_s=900, directory_peers=1, **QUIET)
    calm = simulate(sc, COSTS)
    assert calm.directory_timeouts == 0 and calm.directory_wait_s_p99 < 0.05
    loaded = simulate(sc, slow)
    assert loaded.directory_wait_s_p99 > REQUEST_TIMEOUT_S and loaded.directory_timeouts > 100
    unlimited = simulate(dataclasses.replace(sc, saturation=False), slow)
    assert unlimited.directory_timeouts == 0
    assert unlimited.directory_wait_s_p99 == pytest.approx(0.120)


def test_a_nat_d_volunteer_keeps_two_relay_slots_through_churn() -> None:
    """Relays die and volunteers come and go: every NAT'd volunteer there for a few
    minutes holds two slots, on live public volunteers, with room for each."""
    sc = Scenario(peers=400, duration_s=900, churn_per_hour=2.0, nat_share=0.6)
    net = DirectoryNetwork(sc, COSTS)
    net.run()
    settled = [v for v in net.live.items if net.behind_nat[v] and net.born[v] < sc.duration_s - 180]
    assert len(settled) > 100
    for v in settled:
        relays = net.relays_of[v]
        assert len(relays) == 2 and all(net.alive[r] and not net.behind_nat[r] for r in relays)
        assert all(v in net.reserved_on[r] for r in relays)
    assert max(len(slots) for slots in net.reserved_on.values()) <= 64
