"""Nodes behind real NATs (network namespaces, `lab.py`): a public relay, an owner in
home A and a worker in home B. Needs root; skips without it, except under CI=true."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import Lab, LabUnavailable

from node.localnet import LocalNode, free_port, wait_for
from training.examples import digits_toml
from training.execute import run_job
from training.spec import parse_spec

pytestmark = pytest.mark.slow

P2P_PORT = 4470
FAST = ["--publish-interval", "1", "--peer-ttl", "5", "--no-mdns"]


@pytest.fixture
def lab() -> Iterator[Lab]:
    try:
        built = Lab().up()
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


def test_an_owner_and_a_worker_behind_nats_train_a_job_through_a_relay(
    lab: Lab, tmp_path: Path
) -> None:
    relay = _node(lab, "pub", tmp_path, "10.0.0.1", ["--not-accepting"])
    nodes = [relay]
    try:
        relay.start()
        join = ["--bootstrap", relay.multiaddr]
        owner = _node(lab, "a", tmp_path, lab.homes["a"], [*join, "--not-accepting"])
        worker = _node(lab, "b", tmp_path, lab.homes["b"], join)
        nodes += [owner, worker]
        for node in (owner, worker):
            node.launch()
        for node in (owner, worker):
            node.wait_ready(90)
        for node in (owner, worker):
            found = wait_for(
                lambda n=node: (r := _reachability(n))["relayed_through"] and r,
                60,
                f"{node.name} to learn it is behind a NAT and hold a relay slot",
            )
            assert found["state"] == "private", found
            assert found["relayed_through"] == [relay.peer_id], found
        assert wait_for(lambda: _reachability(relay)["state"] == "public", 30, "the relay")
        wait_for(lambda: worker.peer_id in owner.peer_ids(), 30, "the owner to list the worker")
        ad = next(p for p in owner.get("/api/v1/peers") if p["peer_id"] == worker.peer_id)
        assert any("/p2p-circuit/" in a for a in ad["addrs"]), ad

        spec = digits_toml("behind-nats", steps=60, hidden=(16,), lr=3e-3, gpu="none")
        job_id = owner.submit_spec(spec)
        job = owner.wait_job_end(job_id, 240)
        assert job["state"] == "completed", job["reason"]
        assert job["worker"] == worker.peer_id
        local = run_job(parse_spec(tomllib.loads(spec)), None, tmp_path / "local.safetensors")
        assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
    except BaseException:
        for node in nodes:
            print(f"--- {node.name} ({node.peer_id}) ---\n{node.log_tail(60)}")
        raise
    finally:
        for node in nodes:
            node.stop()
