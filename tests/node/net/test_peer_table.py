"""The peer table: newer ads win, silence expires, a restart restores entries as stale."""

from __future__ import annotations

from pathlib import Path

from factories import capacity_ad, peer_id_of
from nacl.signing import SigningKey

from node.net.peers import PeerTable
from node.store import next_counter, open_node_db
from protocol import CapacityAd, seal


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _ad(key: SigningKey, seq: int, tflops: float = 1.0) -> tuple[CapacityAd, bytes]:
    ad = capacity_ad(peer_id_of(key), seq, tflops=tflops)
    return ad, seal(ad, key)


def test_only_newer_ads_replace_older(tmp_path: Path) -> None:
    table = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=Clock())
    key = SigningKey.generate()
    assert table.accept(*_ad(key, 2, tflops=2.0)) == "joined"
    assert table.accept(*_ad(key, 1, tflops=9.0)) is None
    assert table.accept(*_ad(key, 2, tflops=9.0)) is None
    assert table.accept(*_ad(key, 3, tflops=3.0)) == "updated"
    (entry,) = table.entries()
    assert (entry.ad.seq, entry.ad.tflops) == (3, 3.0)


def test_silent_peers_expire_after_the_ttl(tmp_path: Path) -> None:
    clock = Clock()
    table = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock)
    quiet, chatty = SigningKey.generate(), SigningKey.generate()
    table.accept(*_ad(quiet, 1))
    table.accept(*_ad(chatty, 1))
    clock.now += 8
    table.accept(*_ad(chatty, 2))
    clock.now += 3  # quiet: 11 s silent; chatty: 3 s
    gone = table.expire()
    assert gone == [peer_id_of(quiet)]
    assert [e.ad.peer_id for e in table.entries()] == [peer_id_of(chatty)]


def test_a_peers_class_outlives_its_expired_entry_within_a_bound(tmp_path: Path) -> None:
    """A spot check of a result whose worker's ad lapsed compares within its class."""
    clock = Clock()
    table = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock, max_peers=2)
    keys = [SigningKey.generate() for _ in range(6)]
    for i, key in enumerate(keys):
        ad = capacity_ad(peer_id_of(key), 1, determinism=f"class {i}")
        table.accept(ad, seal(ad, key))
    clock.now += 11
    assert len(table.expire()) == 2 and not table.entries()
    assert table.determinism_of(peer_id_of(keys[-1])) == "class 5"
    assert table.determinism_of(peer_id_of(keys[0])) == ""  # beyond 2 x max_peers
    assert table.determinism_of("never heard of") == ""


def test_restart_restores_entries_marked_stale_until_heard_from(tmp_path: Path) -> None:
    clock = Clock()
    key = SigningKey.generate()
    first = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock)
    first.accept(*_ad(key, 4, tflops=4.0))

    restarted = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock)
    (entry,) = restarted.entries()
    assert entry.stale and entry.ad.tflops == 4.0
    assert restarted.envelopes() == []  # stale ads are not handed to other peers
    assert restarted.accept(*_ad(key, 5)) == "joined"
    assert not restarted.entries()[0].stale

    # never heard from again: dropped one TTL after the restart
    again = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock)
    clock.now += 11
    assert len(again.expire()) == 1
    assert PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock).entries() == []


def test_corrupt_stored_ad_is_dropped_not_trusted(tmp_path: Path) -> None:
    db = open_node_db(tmp_path)
    db["peers"].insert({"peer_id": "x", "seq": 1, "envelope": b"garbage", "last_seen": 1.0})
    assert PeerTable(db, ttl_s=10).entries() == []
    assert db["peers"].count == 0


def test_ad_sequence_counter_persists(tmp_path: Path) -> None:
    assert [next_counter(open_node_db(tmp_path), "ad_seq") for _ in range(3)] == [1, 2, 3]


def test_a_flood_of_fresh_identities_cannot_push_out_established_peers(tmp_path: Path) -> None:
    clock = Clock()
    table = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=clock, max_peers=5)
    established = [SigningKey.generate() for _ in range(3)]
    for key in established:
        table.accept(*_ad(key, 1))
        clock.now += 1
    for _ in range(200):  # one person, two hundred identities
        table.accept(*_ad(SigningKey.generate(), 1))
        clock.now += 0.01
    kept = {e.ad.peer_id for e in table.entries()}
    assert len(table) == 5 and table.evicted == 198
    assert {peer_id_of(k) for k in established} <= kept
    # an established peer's update is an update, not a newcomer: nothing is evicted for it
    assert table.accept(*_ad(established[0], 2)) == "updated" and table.evicted == 198
    assert len(list(open_node_db(tmp_path)["peers"].rows)) == 5


def test_discovery_cost_is_counted_per_minute_over_its_window() -> None:
    from node.metrics import NodeMetrics
    from node.net.discovery.cost import DiscoveryCost

    now = {"t": 100.0}
    cost = DiscoveryCost(NodeMetrics(), clock=lambda: now["t"])
    cost.sample()
    for _ in range(10):
        cost.received(b"x" * 300)
    cost.received(b"y" * 5000, "table")
    cost.sent(b"z" * 300)
    now["t"] += 30  # ten ads and a table in 30 s: 20 ads a minute
    figures = cost.per_minute()
    assert figures["window_s"] == 30 and figures["ads_in"] == 20 and figures["tables_in"] == 2
    assert figures["bytes_in"] == (3000 + 5000) * 2 and figures["ads_out"] == 2
    now["t"] += 120  # a quiet two minutes: the old burst leaves the window
    cost.sample()
    now["t"] += 10
    assert cost.per_minute()["ads_in"] == 0


def test_a_large_network_hands_on_only_the_directories_ads(tmp_path: Path) -> None:
    table = PeerTable(open_node_db(tmp_path), ttl_s=10, clock=Clock())
    volunteer, directory = SigningKey.generate(), SigningKey.generate()
    table.accept(*_ad(volunteer, 1))
    ad = capacity_ad(peer_id_of(directory), 1, directory=True)
    table.accept(ad, seal(ad, directory))
    assert len(table.envelopes()) == 2
    assert table.envelopes(directories_only=True) == [seal(ad, directory)]
