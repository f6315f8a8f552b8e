"""Nodes behind real NATs (network namespaces, `lab.py`): public relays, an owner and
workers in homes behind cone and symmetric NATs. Needs root; skips without it, except
under CI=true."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from lab import Lab, LabUnavailable

from node.localnet import LocalNode, free_port, wait_for
from training.examples import digits_toml, elastic_toml
from training.execute import run_job
from training.local import train_local
from training.spec import parse_spec

pytestmark = pytest.mark.slow

P2P_PORT = 4470
FAST = ["--publish-interval", "1", "--peer-ttl", "5", "--no-mdns"]


@contextmanager
def _built(homes: dict[str, str], publics: int = 1) -> Iterator[Lab]:
    try:
        built = Lab().up(homes, publics)
    except LabUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but the NAT lab cannot run: {exc}")
        pytest.skip(str(exc))
    try:
        yield built
    finally:
        built.down()


@pytest.fixture
def lab() -> Iterator[Lab]:
    with _built({"a": "cone", "b": "symmetric", "c": "cone"}) as built:
        yield built


@pytest.fixture
def two_relay_lab() -> Iterator[Lab]:
    with _built({"a": "cone", "b": "symmetric"}, publics=2) as built:
        yield built


def _wait_relays(node: LocalNode, count: int) -> dict:
    return wait_for(
        lambda: len((r := _reachability(node))["relayed_through"]) >= count and r,
        60,
        f"{node.name} to learn it is behind a NAT and hold {count} relay slot(s)",
    )


def _logs_on_failure(nodes: list[LocalNode]) -> None:
    for node in nodes:
        print(f"--- {node.name} ({node.peer_id}) ---\n{node.log_tail(60)}")


def _node(lab: Lab, where: str, root: Path, ip: str, args: list[str]) -> LocalNode:
    ns = lab.ns(where)
    return LocalNode(
        where,
        root / where,
        P2P_PORT,
        free_port(),
        [*FAST, *args],
        http_host=lab.mgmt[ns],
        listen_ip=ip,
        netns=ns,
    )


def _reachability(node: LocalNode) -> dict:
    return node.get("/api/v1/status")["reachability"]


def _doctor(lab: Lab, node: LocalNode) -> dict:
    """`meshminer doctor --json` run inside the node's namespace."""
    command = [sys.executable, "-m", "node", "doctor", "--json", "--api", node.api]
    done = lab.exec(node.name, [*command, "--data-dir", str(node.data_dir)],
                    {"MESHMINER_TOKEN": node.token or ""})  # fmt: skip
    return {f["name"]: f for f in json.loads(done.stdout)["findings"]}


def _path(owner: LocalNode, peer: str) -> str:
    entry = next((p for p in owner.get("/api/v1/peers") if p["peer_id"] == peer), None)
    return entry["path"] if entry else "unknown"


def test_nated_workers_train_through_a_relay_and_hole_punched_connections(
    lab: Lab, tmp_path: Path
) -> None:
    """The owner in home A; worker B behind a symmetric NAT (no hole punching: only the
    relay reaches it), worker C behind a cone NAT (hole punching works). An elastic
    job of two shares: both are reached, B through the relay and C over the
    hole-punched direct connection, each transfer's path in the job's timeline; the
    weights are bitwise `train-local`'s."""
    relay = _node(lab, "pub", tmp_path, "10.0.0.1", ["--not-accepting"])
    nodes = [relay]
    try:
        relay.start()
        join = ["--bootstrap", relay.multiaddr]
        owner = _node(lab, "a", tmp_path, lab.homes["a"], [*join, "--not-accepting"])
        symmetric = _node(lab, "b", tmp_path, lab.homes["b"], join)
        cone = _node(lab, "c", tmp_path, lab.homes["c"], join)
        nodes += [owner, symmetric, cone]
        for node in nodes[1:]:
            node.launch()
        for node in nodes[1:]:
            node.wait_ready(90)
        for node in nodes[1:]:
            found = _wait_relays(node, 1)
            assert found["state"] == "private", found
            assert found["relayed_through"] == [relay.peer_id], found
        public = _reachability(relay)
        assert public["state"] == "public" and public["relaying"], public
        found = {n.name: _doctor(lab, n)["reachability"] for n in (relay, symmetric)}
        assert found["pub"]["state"] == "ok" and found["pub"]["detail"].startswith("public")
        assert "behind a NAT" in found["b"]["detail"] and "1 relay" in found["b"]["detail"]
        for worker in (symmetric, cone):
            wait_for(
                lambda w=worker: w.peer_id in owner.peer_ids(),
                30,
                f"the owner to list {worker.name}",
            )
            ad = next(p for p in owner.get("/api/v1/peers") if p["peer_id"] == worker.peer_id)
            assert any("/p2p-circuit/" in a for a in ad["addrs"]), ad
        # the owner dials both (through the relay); C's connection is hole-punched
        wait_for(lambda: _path(owner, cone.peer_id) == "direct", 45, "a hole-punched path to C")

        spec = elastic_toml("behind-nats", workers=2, min_workers=2, inner_steps=30, rounds=1)
        job_id = owner.submit_spec(spec)
        job = owner.wait_job_end(job_id, 240)
        assert job["state"] == "completed", job["reason"]
        local = train_local(parse_spec(tomllib.loads(spec)), tmp_path / "local.safetensors")
        assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
        notes = [e["note"] for e in job["timeline"]]
        for worker, path in ((symmetric, "through a relay"), (cone, "direct connection")):
            delta = [n for n in notes if f"delta from {worker.peer_id}" in n]
            assert delta and f"({path})" in delta[0], (worker.name, notes)
        assert _path(owner, symmetric.peer_id) == "relayed"  # no hole through a symmetric NAT
    except BaseException:
        _logs_on_failure(nodes)
        raise
    finally:
        for node in nodes:
            node.stop()


def test_a_relay_that_stops_mid_job_leaves_the_job_to_the_other_relay(
    two_relay_lab: Lab, tmp_path: Path
) -> None:
    """Two public relays; the owner (cone NAT) and a worker behind a symmetric NAT (no
    hole punching) each hold a slot on both. The relay they met through is stopped
    while the worker trains: heartbeats, the result and the weights go through the
    other relay, and the job completes with `train-local`'s weights."""
    lab = two_relay_lab
    first = _node(lab, "pub", tmp_path, lab.publics["pub"], ["--not-accepting"])
    nodes = [first]
    try:
        first.start()
        join = ["--bootstrap", first.multiaddr]
        second = _node(lab, "pub2", tmp_path, lab.publics["pub2"], [*join, "--not-accepting"])
        owner = _node(lab, "a", tmp_path, lab.homes["a"], [*join, "--not-accepting"])
        worker = _node(lab, "b", tmp_path, lab.homes["b"], join)
        nodes += [second, owner, worker]
        for node in nodes[1:]:
            node.launch()
        for node in nodes[1:]:
            node.wait_ready(90)
        for node in (owner, worker):
            relays = set(_wait_relays(node, 2)["relayed_through"])
            assert relays == {first.peer_id, second.peer_id}, relays
        wait_for(lambda: worker.peer_id in owner.peer_ids(), 30, "the owner to list the worker")

        spec = digits_toml("relay-stops", steps=2000, hidden=(32,), lr=3e-3, gpu="none")
        job_id = owner.submit_spec(spec)
        wait_for(
            lambda: owner.get(f"/api/v1/jobs/{job_id}").get("progress", {}).get("step", 0) > 0,
            60,
            "the worker's first heartbeat with progress",
        )
        first.stop()
        job = owner.wait_job_end(job_id, 240)
        assert job["state"] == "completed", job["reason"]
        assert job["worker"] == worker.peer_id
        local = run_job(parse_spec(tomllib.loads(spec)), None, tmp_path / "local.safetensors")
        assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
        left = _reachability(worker)["relayed_through"]
        assert left == [second.peer_id], left  # the stopped relay's slot is gone
    except BaseException:
        _logs_on_failure(nodes)
        raise
    finally:
        for node in nodes:
            node.stop()
