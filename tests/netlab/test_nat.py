"""Nodes behind real NATs (network namespaces, `lab.py`): a public relay, an owner in
home A and a worker in home B. Needs root; skips without it, except under CI=true."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import Lab, LabUnavailable

from node.localnet import LocalNode, free_port, wait_for
from training.examples import elastic_toml
from training.local import train_local
from training.spec import parse_spec

pytestmark = pytest.mark.slow

P2P_PORT = 4470
FAST = ["--publish-interval", "1", "--peer-ttl", "5", "--no-mdns"]


@pytest.fixture
def lab() -> Iterator[Lab]:
    try:
        built = Lab().up({"a": "cone", "b": "symmetric", "c": "cone"})
    except LabUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but the NAT lab cannot run: {exc}")
        pytest.skip(str(exc))
    try:
        yield built
    finally:
        built.down()


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
            found = wait_for(
                lambda n=node: (r := _reachability(n))["relayed_through"] and r,
                60,
                f"{node.name} to learn it is behind a NAT and hold a relay slot",
            )
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
        for node in nodes:
            print(f"--- {node.name} ({node.peer_id}) ---\n{node.log_tail(60)}")
        raise
    finally:
        for node in nodes:
            node.stop()
