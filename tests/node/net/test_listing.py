"""A volunteer's check that a directory lists it: the answer's order under a seed,
and the seed a volunteer grinds to stand near the front of it."""

from __future__ import annotations

import dataclasses
import os
import statistics

import pytest
from factories import capacity_ad
from nacl.signing import SigningKey

from node.net.discovery.listing import check_query, ground_seed, rank_key
from protocol import DecodeError, Policy, open_envelope, seal
from protocol.capacity import GpuInfo
from protocol.directory import DIRECTORY_LIMITS, MAX_WANT, DirectoryQuery


def _rank(seed: bytes, me: str, others: list[str]) -> int:
    mine = rank_key(seed, me)
    return sum(rank_key(seed, o) < mine for o in others)


def test_a_ground_seed_puts_the_volunteer_near_the_front_and_a_random_one_does_not() -> None:
    others = [f"peer{i}" for i in range(2000)]
    ground = [_rank(ground_seed("me", len(others) + 1), "me", others) for _ in range(200)]
    drawn = [_rank(os.urandom(16), "me", others) for _ in range(200)]
    assert max(ground) < MAX_WANT  # always in one answer of 64
    assert 5 <= statistics.mean(ground) <= 11  # about 8th: an unremarkable place
    assert statistics.mean(drawn) > 500  # an owner's seed: anywhere (about 1,000th)


def test_the_order_is_the_seeds_own_and_differs_between_seeds() -> None:
    peers = [f"peer{i}" for i in range(50)]
    first = sorted(peers, key=lambda p: rank_key(b"a", p))
    assert first == sorted(peers, key=lambda p: rank_key(b"a", p))
    assert first != sorted(peers, key=lambda p: rank_key(b"b", p))


def test_the_check_asks_as_a_job_this_node_fits_would_and_not_while_it_fits_none() -> None:
    ad = capacity_ad("me", 1)
    query = check_query(ad, 100)
    assert query is not None
    assert (query.want, query.gpu, query.max_hours, len(query.seed)) == (MAX_WANT, "none", 1.0, 16)
    gpu = GpuInfo(name="RTX", kind="cuda", memory_total_mb=8192)
    assert check_query(dataclasses.replace(ad, gpus=[gpu]), 100).gpu == "required"
    short = dataclasses.replace(ad, policy=Policy(max_job_hours=0.5))
    assert check_query(short, 100).max_hours == 0.5
    assert check_query(dataclasses.replace(ad, paused="on battery"), 100) is None
    assert check_query(dataclasses.replace(ad, policy=Policy(accepting=False)), 100) is None
    assert check_query(dataclasses.replace(ad, load_pct=100), 100) is None


def test_a_query_with_an_oversized_seed_is_refused_naming_the_field() -> None:
    key = SigningKey.generate()
    sealed = seal(DirectoryQuery(want=8, seed=b"x" * 33), key)
    with pytest.raises(DecodeError, match=r"\.seed has more than 32 bytes"):
        open_envelope(sealed, DirectoryQuery, limits=DIRECTORY_LIMITS)
