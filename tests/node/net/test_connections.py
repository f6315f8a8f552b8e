"""Which idle connections a node closes, without a network (the trimming of a real
node's connections is in tests/node/net/test_network.py)."""

from __future__ import annotations

from node.net.connections import ConnectionLimits, connections_to_close

LIMITS = ConnectionLimits(low=2, high=4, idle_s=60.0)


def test_nothing_is_closed_up_to_the_high_water_mark() -> None:
    idle = {f"p{i}": 1000.0 for i in range(4)}
    assert connections_to_close(idle, set(), LIMITS) == []


def test_above_it_the_longest_idle_go_first_until_the_low_mark_remains() -> None:
    idle = {"a": 100.0, "b": 900.0, "c": 70.0, "d": 300.0, "e": 500.0}
    assert connections_to_close(idle, set(), LIMITS) == ["b", "e", "d"]


def test_protected_and_recently_used_connections_stay_even_if_the_mark_is_missed() -> None:
    idle = {"a": 100.0, "b": 900.0, "c": 5.0, "d": 59.0, "e": 500.0, "f": 200.0}
    closing = connections_to_close(idle, {"b", "e"}, LIMITS)
    assert closing == ["f", "a"]  # c and d were used within idle_s; 4 stay open, not 2


def test_defaults_follow_target_peers_and_the_registration_interval() -> None:
    assert ConnectionLimits.for_node(8, 30.0) == ConnectionLimits(8, 16, 60.0)
    assert ConnectionLimits.for_node(12, 30.0) == ConnectionLimits(12, 24, 60.0)
    assert ConnectionLimits.for_node(8, 100.0).idle_s == 200.0
    assert ConnectionLimits.for_node(8, 30.0, high=3, idle_s=1.0) == ConnectionLimits(3, 3, 1.0)
