"""Discovery in a large network, on real node processes: volunteers register with a
directory and stop gossiping their ads, an owner finds peers through the directory,
probes them before offering work, never offers to a dead one, and a newcomer is
found at once."""

from __future__ import annotations

import signal
import time
from urllib.parse import urlencode

import pytest

from node.client import ApiError
from node.demo.localnet import LocalNetwork, LocalNode, wait_for
from training.spec.examples import digits_toml

pytestmark = pytest.mark.slow

TTL_S = 3.0  # FAST_GOSSIP: registrations every 1 s, forgotten 3 s after the last one
# so small a threshold that four volunteers already make a "large" network
LARGE = ["--gossip-max-peers", "3"]


def _discovery(node: LocalNode) -> dict:
    return node.get("/api/v1/status")["discovery"]


def _find(node: LocalNode, k: int, **requirements: object) -> dict:
    return node.get(f"/api/v1/peers/find?{urlencode({'k': k, **requirements})}")


def test_volunteers_register_with_a_directory_and_owners_find_probe_and_place_through_it(
    localnet: LocalNetwork,
) -> None:
    directory = localnet.add(["--directory"])
    owner, *volunteers = localnet.add_many(4, LARGE)
    ids = {v.peer_id for v in volunteers}

    # every volunteer registers; the directory counts all four, and so the volunteers
    # learn that the network is "large" and stop gossiping their own ads
    wait_for(lambda: _discovery(directory).get("directory_holds") == 4, 20, "4 registrations")
    wait_for(
        lambda: all(not _discovery(n).get("gossips_own_ad", True) for n in [owner, *volunteers]),
        20,
        "the volunteers to stop gossiping their ads",
    )
    # a volunteer hears the count when it registers again; a registration the loaded
    # directory answered too late is retried after 10 s (failed CI with a 10 s wait)
    status = wait_for(
        lambda: (d := _discovery(volunteers[0]))["network_size"] == 4 and d, 40, "size 4"
    )
    assert status["registered_with"] == [directory.peer_id]
    held = {e["peer_id"] for e in directory.get("/api/v1/directory")}
    assert held == ids | {owner.peer_id}
    with pytest.raises(ApiError, match="404 this node is not a directory"):
        owner.get("/api/v1/directory")
    assert _discovery(directory)["gossips_own_ad"] is True  # a directory stays visible
    # their copies in each other's tables expire: the owner knows only the directory now
    wait_for(
        lambda: owner.peer_ids() == {directory.peer_id}, 3 * TTL_S + 10, "gossiped ads to expire"
    )
    assert _discovery(volunteers[0])["registrations_out"] > 0

    # the owner finds the three through the directory (and the directory, which trains
    # too), each probed just now
    found = _find(owner, 4)
    assert {p["peer_id"] for p in found["peers"]} == ids | {directory.peer_id}
    assert found["from_directories"] >= 3 and found["probed"] >= 3 and found["dead"] == 0
    assert 0 < found["directories_s"] <= found["seconds"]
    assert 0 <= found["connected"] <= found["probed"]
    assert all(p["via"] == "probe" for p in found["peers"])
    # requirements are the directory's filter: no GPU here, so none fits "required"
    assert _find(owner, 3, gpu="required")["peers"] == []
    with pytest.raises(ApiError, match="400 k must be 1..64"):  # names what is wrong
        owner.get("/api/v1/peers/find?k=0")

    # a volunteer dies: it is never among the found (its probe fails at once), and the
    # directory forgets it within its TTL
    victim = volunteers[-1]
    victim.stop(signal.SIGKILL)
    died = time.monotonic()
    found = _find(owner, 4)
    assert victim.peer_id not in {p["peer_id"] for p in found["peers"]}
    assert len(found["peers"]) == 3
    wait_for(
        lambda: _discovery(directory).get("directory_holds") == 3,
        TTL_S + 5,
        "the directory to forget the dead volunteer",
    )
    dropped_s = time.monotonic() - died
    assert dropped_s <= TTL_S + 3, dropped_s

    # a newcomer registers at once (it does not gossip its ad: the network is large)
    # and is found by the next search that asks the directory (4: more than the owner
    # knows of)
    joined = time.monotonic()
    newcomer = localnet.add(LARGE)
    wait_for(
        lambda: newcomer.peer_id in {p["peer_id"] for p in _find(owner, 4)["peers"]},
        20,
        "the newcomer to be found",
    )
    found_s = time.monotonic() - joined
    print(f"dead volunteer dropped in {dropped_s:.1f} s; newcomer found in {found_s:.1f} s")

    # a job goes to a peer found through the directory, probed, and completes
    job_id = owner.submit_spec(digits_toml("through-directory", steps=5))
    job = owner.wait_job_end(job_id, timeout=120)
    assert job["state"] == "completed", job
    assert job["worker"] in ids - {victim.peer_id} | {newcomer.peer_id, directory.peer_id}

    # receipts, like ads, go to directories only: the directory audits the job's, a
    # volunteer that took no part keeps none (each would cost it an ad's 9 ms)
    wait_for(
        lambda: owner.peer_id in directory.get("/api/v1/ledger/balances")["network"],
        20,
        "the directory to audit the job's receipt",
    )
    bystander = next(v for v in volunteers[:-1] if v.peer_id != job["worker"])
    assert not _discovery(bystander)["audits_receipts"] and _discovery(directory)["audits_receipts"]
    assert bystander.get("/api/v1/ledger/balances")["network"] == {}
    # its Credit page shows the directory's audit instead, as the directory's view
    credit = bystander.get("/api/v1/credit")
    assert credit["peers"] == []
    theirs = credit["directory"]
    assert theirs["directory"] == directory.peer_id and theirs["receipts"] >= 1, theirs
    assert [(r["peer_id"], r["units"], r["rank"]) for r in theirs["peers"]] == [
        (job["worker"], 1, 1)
    ]
    assert "directory" not in directory.get("/api/v1/credit")  # it audits them itself
