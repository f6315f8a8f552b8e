"""Nodes behind real NATs (network namespaces, `lab.py`): public relays, an owner and
workers in homes behind cone and symmetric NATs. Needs root; skips without it, except
under CI=true."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from lab import Lab, LabUnavailable

from node.client import request_json
from node.demo.localnet import LocalNode, free_port, wait_for
from training.run.execute import run_job
from training.run.local import train_local
from training.spec.examples import digits_toml, elastic_toml
from training.spec.job import parse_spec

pytestmark = pytest.mark.slow

P2P_PORT = 4470
FAST = ["--publish-interval", "1", "--peer-ttl", "5", "--no-mdns", "--cold-runners"]
LARGE = ["--gossip-max-peers", "1"]  # any directory's count is large: no ad is gossiped


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
    with _built({"a": "cone", "b": "symmetric", "c": "cone"}, publics=2) as built:
        yield built


def _wait_relays(node: LocalNode, count: int) -> dict:
    return wait_for(
        lambda: len((r := _reachability(node))["relayed_through"]) >= count and r,
        60,
        f"{node.name} to learn it is behind a NAT and hold {count} relay slot(s)",
    )


@contextmanager
def _nodes(
    lab: Lab, root: Path, others: dict[str, list[str]], pub: tuple[str, ...] = ()
) -> Iterator[dict[str, LocalNode]]:
    """A node in "pub" (the relay everyone joins through, with the extra arguments
    `pub`), then one in each of the `others` namespaces (with theirs), started side by
    side; their logs printed on a failure, and every one stopped afterwards."""
    relay = _node(lab, "pub", root, lab.publics["pub"], ["--not-accepting", *pub])
    nodes = {"pub": relay}
    try:
        relay.start()
        for ns, args in others.items():
            _joining(lab, root, nodes, ns, args).launch()
        for ns in others:
            nodes[ns].wait_ready(90)
        yield nodes
    except BaseException:
        for node in nodes.values():
            print(f"--- {node.name} ({node.peer_id}) ---\n{node.log_tail(60)}")
        raise
    finally:
        for node in nodes.values():
            node.stop()


def _joining(
    lab: Lab, root: Path, nodes: dict[str, LocalNode], ns: str, args: list[str]
) -> LocalNode:
    """A node in namespace `ns` that joins through the relay in "pub"; in `nodes`, so
    that `_nodes` prints its log on a failure and stops it."""
    ip = lab.publics.get(ns) or lab.homes[ns]
    nodes[ns] = _node(lab, ns, root, ip, ["--bootstrap", nodes["pub"].multiaddr, *args])
    return nodes[ns]


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


def test_nated_nodes_work_through_relays_hole_punching_and_a_relay_that_stops(
    lab: Lab, tmp_path: Path
) -> None:
    """Two public relays; the owner in home A (cone NAT); worker B behind a symmetric
    NAT (no hole punching: only a relay reaches it); worker C behind a cone NAT.

    1. Each home node learns it is behind a NAT from the relays' failed dial-backs and
       holds a slot on both relays; `meshminer doctor` inside the namespaces says so.
       The owner's search for peers finds B and C, each answering a probe.
    2. The owner's connection to C is hole-punched to direct; B's stays relayed. An
       elastic job of two shares completes bitwise equal to `train-local`, the
       timeline naming the path of each round's weights and each delta: B's through
       a relay, C's over the direct (hole-punched) connection.
    3. With C paused, a job goes to B; the relay the nodes met through is stopped
       while B trains: the rest goes through the other relay, and the job completes
       bitwise too."""
    others = {"pub2": ["--not-accepting"], "a": ["--not-accepting"], "b": [], "c": []}
    with _nodes(lab, tmp_path, others) as nodes:
        first, second = nodes["pub"], nodes["pub2"]
        owner, symmetric, cone = nodes["a"], nodes["b"], nodes["c"]
        relays = {first.peer_id, second.peer_id}
        for node in (owner, symmetric, cone):
            found = _wait_relays(node, 2)
            assert found["state"] == "private" and set(found["relayed_through"]) == relays
        public = _reachability(first)
        assert public["state"] == "public" and public["relaying"], public
        asked = (first, owner, symmetric, cone)
        with ThreadPoolExecutor(len(asked)) as pool:  # each inside its own namespace
            found = list(pool.map(lambda n: _doctor(lab, n)["reachability"], asked))
        said = dict(zip("pabc", found, strict=True))
        assert said["p"]["state"] == "ok" and said["p"]["detail"].startswith("public"), said
        for home in "abc":
            assert "behind a NAT" in said[home]["detail"], said
            assert "through 2 relay" in said[home]["detail"], said
        for worker in (symmetric, cone):
            wait_for(
                lambda w=worker: w.peer_id in owner.peer_ids(),
                30,
                f"the owner to list {worker.name}",
            )
            ad = next(p for p in owner.get("/api/v1/peers") if p["peer_id"] == worker.peer_id)
            assert any("/p2p-circuit/" in a for a in ad["addrs"]), ad
        # a search probes each candidate, NAT'd ones included (over the connections the
        # relays gave; a new one dials the relay 0.5 s after the private addresses). On a
        # loaded machine a relayed probe can pass its 3 s: that peer is dropped until its
        # next ad, and a later search finds it
        both = {symmetric.peer_id, cone.peer_id}

        def find_both() -> dict | None:
            found = owner.get("/api/v1/peers/find?k=8")
            return found if both <= {p["peer_id"] for p in found["peers"]} else None

        found = wait_for(find_both, 90, "a search that finds both NAT'd workers", interval=2.0)
        assert found["dead"] == 0, found
        print(f"the owner found both NAT'd workers in {found['seconds']:.2f} s")
        # the owner dials both (through a relay); C's connection is hole-punched (when
        # the first tries collide or miss on a loaded machine, again some 10-40 s later)
        wait_for(lambda: _path(owner, cone.peer_id) == "direct", 90, "a hole-punched path to C")

        # on a loaded machine the owner's offer to B can fail to open its relayed stream
        # (seen once in CI: a StreamFailure after 10 s); C then trains both slots, and
        # the next job asks B again
        for attempt in range(3):
            spec = elastic_toml(
                f"behind-nats-{attempt}", workers=2, min_workers=2, inner_steps=20, rounds=1
            )
            job = owner.wait_job_end(owner.submit_spec(spec), 240)
            assert job["state"] == "completed", job["reason"]
            local = train_local(parse_spec(tomllib.loads(spec)), tmp_path / "local.safetensors")
            assert job["weights_sha256"] == local["weights_sha256"]  # bitwise train-local
            notes = [e["note"] for e in job["timeline"]]
            if any(f"delta from {symmetric.peer_id}" in n for n in notes):
                break
            print(f"job {attempt}: B trained no slot; the timeline: {notes}")
        for worker, path in ((symmetric, "through a relay"), (cone, "direct connection")):
            delta = [n for n in notes if f"delta from {worker.peer_id}" in n]
            assert delta and f"({path})" in delta[0], (worker.name, notes)
            fetched = [n for n in notes if "weights" in n and f"by {worker.peer_id}" in n]
            assert fetched and fetched[0].endswith(f"({path})"), (worker.name, notes)
        assert _path(owner, symmetric.peer_id) == "relayed"  # no hole through a symmetric NAT

        request_json(cone.api, "PUT", "/api/v1/policy", {"accepting": False}, token=cone.token)
        # B trains at a 20% duty cycle, so that the relay stops while it trains
        policy = {"load_limit_pct": 20}
        request_json(symmetric.api, "PUT", "/api/v1/policy", policy, token=symmetric.token)
        unchecked = "\n[trust]\ncheckpoints = 0\nspot_check_budget = 0\n"
        spec = digits_toml("relay-stops", steps=2000, hidden=(32,), lr=3e-3, gpu="none",
                           extra=unchecked)  # fmt: skip
        job_id = owner.submit_spec(spec)
        try:
            wait_for(
                lambda: owner.get(f"/api/v1/jobs/{job_id}").get("progress", {}).get("step", 0),
                60,
                "B's first heartbeat with progress",
            )
        except TimeoutError:
            print("timeline:", *owner.get(f"/api/v1/jobs/{job_id}")["timeline"], sep="\n")
            raise
        first.stop()
        job = owner.wait_job_end(job_id, 240)
        assert job["state"] == "completed", job["reason"]
        assert job["worker"] == symmetric.peer_id
        local = run_job(parse_spec(tomllib.loads(spec)), None, tmp_path / "single.safetensors")
        assert job["weights_sha256"] == local["weights_sha256"]
        left = _reachability(symmetric)["relayed_through"]
        assert left == [second.peer_id], left  # the stopped relay's slot is gone


def test_an_owner_finds_volunteers_behind_nats_through_a_directory_and_trains_on_them(
    lab: Lab, tmp_path: Path
) -> None:
    """A large network's way: the public node is a directory, and nobody gossips an
    ad. Workers behind a symmetric (B) and a cone (C) NAT register their ads, relay
    addresses included, and check as strangers that the directory lists them; the
    owner, behind a NAT too, finds both through the directory, each answering a probe
    through a relay, and a job trains on one of them bitwise equal to training here."""
    others = {"pub2": ["--not-accepting", *LARGE], "b": LARGE, "c": LARGE}
    with _nodes(lab, tmp_path, others, pub=("--directory", *LARGE)) as nodes:
        directory = nodes["pub"]
        workers = {nodes["b"].peer_id, nodes["c"].peer_id}
        for worker in (nodes["b"], nodes["c"]):
            _wait_relays(worker, 1)  # the relay it joined through: no relay's ad is gossiped
            wait_for(
                lambda w=worker: _discovery(w)["listed_by"] == [directory.peer_id],
                60,
                f"{worker.name} to be listed by the directory",
            )
            assert not _discovery(worker)["gossips_own_ad"]
        # the owner joins a large network: the directory hands it no volunteer's ad
        owner = _joining(lab, tmp_path, nodes, "a", ["--not-accepting", *LARGE]).start(90)
        wait_for(lambda: directory.peer_id in owner.peer_ids(), 30, "the owner's first table")
        assert not workers & set(owner.peer_ids())  # no ad of theirs came by gossip

        found = wait_for(
            lambda: workers <= _ids(f := _find(owner)) and f,
            60,
            "the owner to find both NAT'd workers through the directory",
        )
        # a probe over a new connection dials the private addresses, then a relay
        print(f"the owner found both NAT'd workers through the directory in "
              f"{found['seconds']:.2f} s ({found['directories_s']:.2f} s waiting for its "
              f"answer, {found['probed'] - found['connected']} of {found['probed']} probes "
              "over new connections)")  # fmt: skip

        unchecked = "\n[trust]\ncheckpoints = 0\nspot_check_budget = 0\n"
        spec = digits_toml("found-behind-nats", steps=100, gpu="none", extra=unchecked)
        job = owner.wait_job_end(owner.submit_spec(spec), 240)
        assert job["state"] == "completed", job["reason"]
        assert job["worker"] in workers
        local = run_job(parse_spec(tomllib.loads(spec)), None, tmp_path / "here.safetensors")
        assert job["weights_sha256"] == local["weights_sha256"]


def _discovery(node: LocalNode) -> dict:
    return node.get("/api/v1/status")["discovery"]


def _find(owner: LocalNode) -> dict:
    return owner.get("/api/v1/peers/find?k=8")


def _ids(found: dict) -> set[str]:
    return {p["peer_id"] for p in found["peers"]}
