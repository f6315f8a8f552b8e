"""Choosing a worker: requirements, policy, throughput, load; and why a job waits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio
from factories import capacity_ad
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.peers import PeerEntry, fitting, unfit_reason
from node.work.owner import SELF, OwnerRole, choose_worker
from protocol import GpuInfo, Policy
from tests.contexts import offline_context

GPU = GpuInfo(
    name="NVIDIA H100",
    kind="cuda",
    memory_total_mb=81920,
    memory_free_mb=80000,
    compute_capability="9.0",
)
OWN = capacity_ad("12D3KooWown", 1, tflops=0.2)


def _peer(name: str, stale: bool = False, **changes) -> PeerEntry:
    return PeerEntry(capacity_ad(f"12D3KooW{name}", 1, **changes), b"", 0.0, stale=stale)


def test_fastest_least_loaded_fitting_peer_wins() -> None:
    peers = [
        _peer("slow", tflops=1.0),
        _peer("fast", tflops=5.0),
        _peer("busy", tflops=9.0, load_pct=90),
    ]
    choice = choose_worker({}, "auto", peers, OWN, set())
    assert choice.worker == "12D3KooWfast"


def test_policy_and_requirements_rule_peers_out_with_reasons() -> None:
    peers = [
        _peer("paused", policy=Policy(accepting=False)),
        _peer("full", load_pct=80, policy=Policy(load_limit_pct=80)),
        _peer("short", policy=Policy(max_job_hours=0.5)),
        _peer("nogpu"),
        _peer("old", stale=True),
    ]
    own = replace(OWN, policy=Policy(accepting=False))
    choice = choose_worker({"gpu": "required", "max_hours": 2}, "auto", peers, own, set())
    assert choice.worker is None
    for why in (
        "not accepting work",
        "load limit",
        "up to 0.5 h",
        "no GPU",
        "stale",
        "this node: not accepting work",
    ):
        assert why in choice.reason


def test_gpu_peer_preferred_and_required_memory_checked() -> None:
    big = _peer("big", gpus=[GPU], tflops=1.0)
    cpu = _peer("cpu", tflops=50.0)
    assert choose_worker({"gpu": "preferred"}, "auto", [big, cpu], OWN, set()).worker == (
        "12D3KooWbig"
    )
    small = _peer("small", gpus=[replace(GPU, memory_total_mb=8192)])
    choice = choose_worker(
        {"gpu": "required", "min_gpu_memory_gb": 16},
        "auto",
        [small],
        replace(OWN, policy=Policy(accepting=False)),
        set(),
    )
    assert choice.worker is None and "no GPU with >= 16 GB" in choice.reason


def test_own_node_only_when_no_peer_fits_or_asked() -> None:
    assert choose_worker({}, "auto", [], OWN, set()).worker == SELF
    assert choose_worker({}, "local", [_peer("fast", tflops=9.0)], OWN, set()).worker == SELF
    declined = _peer("x")
    assert choose_worker({}, "auto", [declined], OWN, {"12D3KooWx"}).worker == SELF
    assert choose_worker({}, "auto", [], OWN, {SELF}).worker is None


def test_a_busy_peer_is_passed_over_and_the_reason_says_busy() -> None:
    peers = [_peer("fast", tflops=5.0), _peer("slow", tflops=1.0)]
    busy = {"12D3KooWfast"}
    choice = choose_worker({}, "auto", peers, OWN, busy, busy=busy)
    assert choice.worker == "12D3KooWslow"
    waiting = choose_worker({}, "auto", peers, OWN, {SELF, *busy, "12D3KooWslow"}, busy=busy)
    assert waiting.worker is None
    assert "fast: declined another job's offer for now" in waiting.reason
    assert "slow: declined or lost this job before" in waiting.reason


def test_a_peer_whose_load_may_be_ours_is_held_back_only_by_the_rest_of_its_ad() -> None:
    """An elastic slot's holder has just delivered its share: the load in its ad may be
    that share's, so an owner may leave it out of the count (`loaded_ok`); a pause or
    a policy still rules the peer out."""
    full = _peer("full", load_pct=100)
    paused = _peer("pausedfull", load_pct=100, policy=Policy(accepting=False))
    entries = [full, paused, _peer("free")]
    assert unfit_reason(full.ad, {}) == "at its load limit (100% of 100%)"
    assert unfit_reason(full.ad, {}, count_load=False) is None
    assert unfit_reason(paused.ad, {}, count_load=False) == "not accepting work"
    names = [e.ad.peer_id[-4:] for e in fitting(entries, {}, set())]
    assert names == ["free"]
    loaded_ok = {full.ad.peer_id, paused.ad.peer_id}
    names = [e.ad.peer_id[-4:] for e in fitting(entries, {}, set(), loaded_ok)]
    assert names == ["full", "free"]


def test_a_peer_that_just_ended_a_unit_of_the_job_is_asked_again_whatever_its_load(
    tmp_path: Path,
) -> None:
    """A worker whose units follow each other advertises itself busy throughout
    (load-only ads wait a second): the owner it just delivered to leaves that load out
    (`Placement.done_here`), and nobody else's; a peer still training one of the job's
    units, or new to it, is judged by its ad."""
    owner = OwnerRole(offline_context(tmp_path), None)  # type: ignore[arg-type]
    ctx = owner.ctx
    job = ctx.jobs.create("j", {"requirements": {"max_hours": 1.0}}, "auto", {}, [])
    names = {name: Identity(SigningKey.generate()).peer_id for name in ("done", "both", "new")}
    for n, peer in enumerate(names.values()):
        ctx.peers.accept(capacity_ad(peer, 1, load_pct=100), f"ad {n}".encode())
    for peer in (names["done"], names["both"]):
        unit = ctx.jobs.add_unit(job.id, peer, 30)
        ctx.jobs.unit_transition(unit.unit_id, ("offered",), state="expired")
    training = ctx.jobs.add_unit(job.id, names["both"], 30)
    ctx.jobs.add_unit(job.id, names["new"], 30)
    assert owner.placement.done_here(job) == {names["done"]}
    assert owner.placement.done_here(job, offering=training.unit_id) == {
        names["done"],
        names["both"],
    }
    assert trio.run(owner.placement.candidates, job, set()) == [names["done"]]
