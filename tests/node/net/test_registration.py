"""Directories without a network: which ones a node registers with, how it reads the
network's size from their counts, and how long a directory's own ad lasts."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest
from factories import capacity_ad, peer_id_of
from nacl.signing import SigningKey

from node.net.discovery.gossip import check_ad
from node.net.discovery.memory import recall_answered, recall_size
from node.net.discovery.registration import Registration, rendezvous_order
from node.net.discovery.search import _in_turn
from node.net.finder import parse_find_query
from node.net.peers import DIRECTORY_TTL_FACTOR, PeerTable
from node.store import open_node_db
from protocol import StaleMessage, seal


def test_rendezvous_spreads_volunteers_evenly_and_a_leaving_directory_moves_only_its_own() -> None:
    directories = [f"dir{i}" for i in range(5)]
    volunteers = [f"vol{i}" for i in range(5000)]
    first = {v: rendezvous_order(v, directories)[:2] for v in volunteers}
    load = Counter(d for chosen in first.values() for d in chosen)
    assert max(load.values()) < 1.1 * min(load.values())  # 2000 each, give or take
    after = {v: rendezvous_order(v, directories[1:])[:2] for v in volunteers}
    moved = [v for v in volunteers if first[v] != after[v]]
    assert moved == [v for v in volunteers if "dir0" in first[v]]  # only dir0's volunteers


def _registration(
    peers: PeerTable, counts: dict[str, int], own: int = 0, db: object = None
) -> Registration:
    reg = Registration.__new__(Registration)  # no host: only the bookkeeping is tested
    reg.identity = type("I", (), {"peer_id": "me"})()
    reg.peers, reg.directory_peers, reg.gossip_max_peers = peers, 2, 100
    reg.is_directory, reg.own_count = False, lambda: own
    reg.registered, reg._heard_at, reg._good = {}, {}, recall_answered(db)
    reg._registered_at, reg._checked_at, reg.listed = {}, {}, set()
    reg._failed_until, reg._failures, reg._in_flight, reg._vouched = {}, {}, set(), {}
    reg._db, reg._remembered, reg.on_change = db, recall_size(db), lambda: None
    for directory, count in counts.items():
        reg.heard(directory, count)
    return reg


def test_a_directory_that_failed_is_skipped_briefly_then_for_longer(tmp_path: Path) -> None:
    peers = PeerTable(open_node_db(tmp_path), ttl_s=90)
    key = SigningKey.generate()
    ad = capacity_ad(peer_id_of(key), 1, directory=True)
    peers.accept(ad, seal(ad, key))
    directory = peer_id_of(key)
    reg = _registration(peers, {})
    assert [reg.failed(directory) for _ in range(7)] == [5, 10, 20, 40, 80, 120, 120]
    now = time.monotonic()
    assert reg.chosen(now) == [] and reg.chosen(now + 121) == [directory]
    reg.answered(directory)
    assert reg.failed(directory) == 5


def _directories(peers: PeerTable, n: int) -> list[str]:
    keys = [SigningKey.generate() for _ in range(n)]
    for key in keys:
        ad = capacity_ad(peer_id_of(key), 1, directory=True)
        peers.accept(ad, seal(ad, key))
    return [peer_id_of(k) for k in keys]


def test_the_size_estimate_is_the_largest_count_so_no_directory_can_make_it_small(
    tmp_path: Path,
) -> None:
    """Gossip to everyone is what a hostile directory would start: the estimate is the
    largest count heard, a count no directory could hold (or 0: it holds this node) is
    not heard, and gossip waits for every known directory's answer (two hostile ones
    may answer first)."""
    db = open_node_db(tmp_path)
    peers = PeerTable(db, ttl_s=90)
    ids = _directories(peers, 3)
    reg = _registration(peers, {ids[0]: 40}, db=db)
    assert not reg.gossip_own_ad()  # one of three answered
    reg.heard(ids[1], 44)
    # each holds about N x 2 / 3: N is about 44 x 3 / 2
    assert reg.network_size() == 66 and not reg.gossip_own_ad()  # two of three
    # a small network: all three are registered with, so that each one's count is heard
    assert sorted(reg.chosen(time.monotonic())) == sorted(ids)
    reg.heard(ids[2], 42)
    assert reg.gossip_own_ad()
    assert not reg.heard(ids[2], 10**9) and reg.network_size() == 66  # more than it can hold
    assert ids[2] not in reg.chosen(time.monotonic())  # and it rests, as one that failed
    assert not reg.gossip_own_ad()  # a known directory unheard: no gossip
    reg = _registration(peers, {ids[0]: 70, ids[1]: 80, ids[2]: 1}, db=db)  # one lies low
    assert reg.network_size() == 120 and not reg.gossip_own_ad()
    assert not reg.heard(ids[2], 0)  # it holds this node: 0 is a lie
    # every directory lies low now: the large network is remembered, also after a restart
    later = _registration(peers, {ids[0]: 1, ids[1]: 1}, db=db)
    assert later.network_size() == 2 and not later.gossip_own_ad()
    reg.is_directory = True  # a directory always gossips, slowly once the network is large
    assert reg.gossip_own_ad() and reg.slow_refresh()
    assert not reg.shares_all_ads()  # but hands on no volunteer's ad it was given
    assert not later.shares_all_ads()
    (tmp_path / "other").mkdir()
    fresh = _registration(PeerTable(open_node_db(tmp_path / "other"), ttl_s=90), {})
    assert fresh.gossip_own_ad()  # no directory known: a small network gossips
    assert fresh.shares_all_ads()


def test_directories_that_answered_are_preferred_and_untried_ones_tried_together(
    tmp_path: Path,
) -> None:
    """Signed directory ads are cheap to make: a node registers with those that answered
    before, and while fewer than two did, tries up to eight unknown ones at once (in
    a network of more than eight directories, which is large whatever they say)."""
    peers = PeerTable(open_node_db(tmp_path), ttl_s=90)
    ids = _directories(peers, 12)
    reg = _registration(peers, {})
    now = time.monotonic()
    assert len(reg.chosen(now)) == 8
    reg.heard(ids[5], 30)
    reg.heard(ids[9], 30)
    assert sorted(reg.chosen(now)) == sorted([ids[5], ids[9]])
    assert not reg.gossip_own_ad()  # twelve directories: never all heard


def test_a_restarted_node_registers_with_the_directories_that_answered_before(
    tmp_path: Path,
) -> None:
    """Not eight untried ones at once: after a network-wide restart that would load
    every directory fourfold. One that fails is forgotten as answering, also on disk."""
    db = open_node_db(tmp_path)
    peers = PeerTable(db, ttl_s=90)
    ids = _directories(peers, 12)
    _registration(peers, {ids[5]: 30, ids[9]: 30}, db=db)
    restarted = _registration(peers, {}, db=db)
    assert sorted(restarted.chosen(time.monotonic())) == sorted([ids[5], ids[9]])
    restarted.failed(ids[9])
    assert recall_answered(db) == {ids[5]}


def test_answers_are_taken_in_turn_so_no_directory_fills_the_list() -> None:
    first = [("d1", b"a"), ("d1", b"b"), ("d1", b"c")]
    second = [("d2", b"x"), ("d2", b"a")]
    assert _in_turn([first, second]) == [("d1", b"a"), ("d2", b"x"), ("d1", b"b"), ("d1", b"c")]
    assert _in_turn([]) == []


def test_a_directory_whose_peers_do_not_answer_rests(tmp_path: Path) -> None:
    """Rated by what its answers lead to: after 8 probed peers, fewer than half alive
    and the directory rests as one that failed; an honest one's few dead peers (that
    left since) do not."""
    peers = PeerTable(open_node_db(tmp_path), ttl_s=90)
    honest, liar = _directories(peers, 2)
    reg = _registration(peers, {honest: 30, liar: 30})
    for n in range(12):
        reg.vouched(honest, live=n % 4 != 0)  # a quarter left since
    for n in range(7):
        reg.vouched(liar, live=n == 0)
    now = time.monotonic()
    assert set(reg.chosen(now)) == {honest, liar}
    reg.vouched(liar, live=False)  # the eighth
    assert reg.chosen(now) == [honest] and liar not in reg.registered


def test_a_directory_that_hides_this_node_is_left_for_hours_and_listing_ones_are_asked_first(
    tmp_path: Path,
) -> None:
    peers = PeerTable(open_node_db(tmp_path), ttl_s=90)
    hider, lister, answered, untried = _directories(peers, 4)
    reg = _registration(peers, {hider: 10, lister: 10, answered: 10})
    reg.listed.add(lister)
    now = time.monotonic()
    for _ in range(20):  # random within a group, never across groups
        assert reg.ask_order(now)[0] == lister
        assert set(reg.ask_order(now)[1:3]) == {hider, answered}
        assert reg.ask_order(now)[3] == untried
    reg._registered_at[hider] = now
    reg.hiding(hider)
    assert hider not in reg._registered_at and hider not in reg.registered
    assert hider not in reg.ask_order(now) and hider not in reg.chosen(now)
    assert hider not in reg.chosen(now + 5 * 3600)  # a failure would rest 5 s; this, hours
    assert hider in reg.usable(now + 6 * 3600 + 1)


def test_a_directorys_ad_lasts_longer_and_may_be_that_much_older(tmp_path: Path) -> None:
    peers = PeerTable(open_node_db(tmp_path), ttl_s=10)
    key, other = SigningKey.generate(), SigningKey.generate()
    old = 5 * 10 + 60  # older than a peer's TTL + clock skew, within a directory's
    directory = seal(capacity_ad(peer_id_of(key), 1, directory=True, age_s=old), key)
    ad, _ = check_ad(directory, None, peers, time.time())
    assert peers.ttl_for(ad) == 10 * DIRECTORY_TTL_FACTOR
    with pytest.raises(StaleMessage):
        check_ad(
            seal(capacity_ad(peer_id_of(other), 1, age_s=old), other), None, peers, time.time()
        )


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"k": "0"}, "k must be 1..64"),
        ({"k": "2.5"}, "k must be a whole number"),
        ({"k": "eight"}, "k must be a number, not 'eight'"),
        ({"max_hours": "nan"}, "max_hours must be"),
        ({"min_gpu_memory_gb": "-1"}, "min_gpu_memory_gb must be 0..1e+06"),
        ({"gpu": "lots"}, "gpu must be one of preferred, required, none"),
        ({"k": "3", "colour": "blue"}, "unknown parameter 'colour'"),
    ],
)
def test_a_bad_find_query_is_refused_naming_the_parameter(query: dict, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_find_query(query)


def test_a_find_query_defaults_to_eight_peers_for_a_one_hour_job() -> None:
    assert parse_find_query({}) == (
        8,
        {"gpu": "preferred", "min_gpu_memory_gb": 0.0, "max_hours": 1.0},
    )
