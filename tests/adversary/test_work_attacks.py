"""Hostile peers in the work flow, played by a libp2p host in the test process against
real node processes.

Worker side: a rogue OWNER sends `/meshminer/task/1` offers built the way
`node/work/owner/role.py` builds them, then broken (a flipped bit, sealed to someone else,
signed by the wrong key, a hostile spec). Each is declined with a reason that says what
was wrong, and nothing runs.

Owner side: a rogue WORKER advertises itself, accepts the owner's offers, serves
weights, and returns bad results (wrong hash, forged signature, a pickle, too late).
Each is rejected with a signed reason; the job is not completed, no receipt is stored,
no blob that failed the checks is kept, and the owner keeps answering.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import secrets
import shutil
import time
import tomllib
import zipfile
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from nacl.public import Box
from nacl.signing import SigningKey
from rogue import (
    RogueWorker,
    api,
    assert_alive,
    receipt_count,
    receipt_rows,
    running,
    stored_blobs,
    submit_and_accept,
    unchecked_digits_toml,
    until,
)
from safetensors.numpy import save as save_safetensors

from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, free_port
from node.identity import Identity
from node.net.host import HostError, MeshHost
from node.work.blobs import BlobStore
from protocol import encode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import MAX_BLOB_BYTES, BlobGrant
from protocol.crypto import new_job_key, seal_to
from protocol.envelope import signing_bytes
from protocol.names import (
    ADS_PROTOCOL,
    CAPACITY_TOPIC,
    PROBE_PROTOCOL,
    PROGRESS_PROTOCOL,
    TASK_PROTOCOL,
)
from protocol.schema import to_plain
from protocol.work import (
    WORK_LIMITS,
    OfferReply,
    Progress,
    ReceiptReply,
    WorkOffer,
    WorkPackage,
    decode_progress_ack,
)
from training.evidence.result_check import expected_tensors
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain

pytestmark = pytest.mark.slow


def _digits_plain(name: str, steps: int = 20) -> dict[str, Any]:
    return spec_to_plain(parse_spec(tomllib.loads(unchecked_digits_toml(name, steps))))


def _peer_id(key: SigningKey) -> str:
    return Identity(key).peer_id


def _forged(message: Any, claimed: SigningKey, actual: SigningKey) -> bytes:
    """An envelope naming `claimed` as its signer but signed by `actual`."""
    payload = encode(to_plain(message))
    sig = actual.sign(signing_bytes(message.TYPE, message.VERSION, payload)).signature
    return encode(
        {
            "t": message.TYPE,
            "v": message.VERSION,
            "p": payload,
            "k": bytes(claimed.verify_key),
            "s": sig,
        }
    )


# -- worker side: a rogue owner's offers ---------------------------------------------------


def _work_offer(
    owner: SigningKey,
    worker_id: str,
    spec: dict[str, Any],
    *,
    package_signer: SigningKey | None = None,
    sealed_to: bytes | None = None,
    flip_bit: bool = False,
    unit_id: str = "",
    grant_bytes: int = 0,
) -> WorkOffer:
    """An offer as `node/work/offers.py` builds one (built-in data: no blobs, no grant,
    unless `grant_bytes` asks for a grant of that size), optionally broken; the caller
    signs it."""
    job_id, unit_id = "a77ac4" + secrets.token_hex(5), unit_id or secrets.token_hex(8)
    blobs, grant = [], b""
    if grant_bytes:
        blobs = [sha256(b"data").hexdigest()]
        grant = seal(
            BlobGrant(
                job_id, unit_id, _peer_id(owner), worker_id, blobs, grant_bytes, time.time() + 60
            ),
            owner,
        )
    package = WorkPackage(job_id, unit_id, encode(spec), blobs, grant, new_job_key(), 1.0, 15.0)
    sealed = seal_to(
        sealed_to or public_key_from_peer_id(worker_id),
        owner,
        seal(package, package_signer or owner),
    )
    if flip_bit:  # one bit of the ciphertext, past the nonce
        i = Box.NONCE_SIZE + (len(sealed) - Box.NONCE_SIZE) // 2
        sealed = sealed[:i] + bytes([sealed[i] ^ 0x10]) + sealed[i + 1 :]
    return WorkOffer(job_id, unit_id, worker_id, sealed, time.time())


async def _send_offer(host: MeshHost, worker: LocalNode, offer: bytes) -> tuple[bool, str]:
    """(accepted, reason) from the worker's signed reply; a failed stream is a refusal."""
    try:
        raw = await host.request(worker.peer_id, TASK_PROTOCOL, offer, WORK_LIMITS.max_bytes)
    except HostError as exc:
        return False, f"stream failed: {exc}"
    reply = open_envelope(raw, OfferReply, expected_signer=worker.peer_id, limits=WORK_LIMITS)
    return reply.message.accepted, reply.message.reason


BAD_UNIT_IDS = {
    "parent path": "../../../../meshminer-escape",
    "absolute path": "/tmp/meshminer-escape",
    "NUL byte": "0123456789abcdef\x00",
    "overlong": "a" * 4000,
    "upper case": "0123456789ABCDEF",
}


def _tree(root: Path) -> set[tuple[str, int, float]]:
    """Every file under `root` with its size and mtime (what a stray write would change)."""
    return {
        (str(p), p.stat().st_size, p.stat().st_mtime)
        for p in root.rglob("*")
        if p.is_file() and "-wal" not in p.name and "-shm" not in p.name and p.suffix != ".log"
    }


def _units(node: LocalNode) -> list[str]:
    units = node.data_dir / "units"
    return sorted(p.name for p in units.iterdir()) if units.exists() else []


async def _rogue_owner(worker: LocalNode) -> dict[str, str]:
    key, other = SigningKey.generate(), SigningKey.generate()
    wid = worker.peer_id
    spec = _digits_plain("attack")
    disk = shutil.disk_usage(worker.data_dir).total
    outside = _tree(worker.data_dir.parent)
    layers = {
        "arch": "layers",
        "layers": [{"type": "Linear", "out_features": 10}, {"type": "PythonEval"}],
    }
    # (offer envelope, what the reason must say)
    cases: dict[str, tuple[bytes, str]] = {
        "1 flipped bit": (
            seal(_work_offer(key, wid, spec, flip_bit=True), key),
            "cannot open the package",
        ),
        "2 sealed to another node": (
            seal(_work_offer(key, wid, spec, sealed_to=bytes(other.verify_key)), key),
            "cannot open the package",
        ),
        "3a offer signed by another key": (
            seal(_work_offer(key, wid, spec), other),
            f"work_offer is signed by {_peer_id(other)}",
        ),
        "3b offer signature forged": (
            _forged(_work_offer(key, wid, spec), claimed=key, actual=other),
            "work_offer signature does not verify",
        ),
        "4 package signed by another key": (
            seal(_work_offer(key, wid, spec, package_signer=other), key),
            f"work_package is signed by {_peer_id(other)}",
        ),
        "5a unknown layer": (
            seal(_work_offer(key, wid, {**spec, "model": layers}), key),
            "invalid job spec: model.layers[1].type: unknown layer type 'PythonEval'",
        ),
        "5b negative size": (
            seal(_work_offer(key, wid, {**spec, "model": {**spec["model"], "hidden": [-16]}}), key),
            "invalid job spec: model.hidden[0]",
        ),
        "5c 10^12 parameters": (
            seal(
                _work_offer(
                    key, wid, {**spec, "model": {**spec["model"], "hidden": [10**6, 10**6]}}
                ),
                key,
            ),
            "invalid job spec: model: 1,000,0",
        ),
        "6 a grant for ten times the disk (or the 64 GiB grant maximum)": (
            seal(_work_offer(key, wid, spec, grant_bytes=min(10 * disk, MAX_BLOB_BYTES)), key),
            "this node fetches at most",
        ),
    }
    for name, bad_id in BAD_UNIT_IDS.items():
        cases[f"7 unit id: {name}"] = (
            seal(_work_offer(key, wid, spec, unit_id=bad_id), key),
            "bad offer: WorkOffer.unit_id must be 16..32 lowercase hex",
        )
    observed = {}
    async with MeshHost.start(Identity(key), f"/ip4/127.0.0.1/tcp/{free_port()}") as host:
        await host.connect(worker.multiaddr)
        for name, (offer, expected) in cases.items():
            accepted, reason = await _send_offer(host, worker, offer)
            observed[name] = reason
            assert not accepted, f"{name}: the worker accepted"
            assert expected in reason, f"{name}: {reason!r}"
            status = await assert_alive(worker)
            assert status["load"] == 0, f"{name}: the worker took the unit"
            assert _units(worker) == [], f"{name}: a unit ran"
            assert stored_blobs(worker) == set(), f"{name}: a blob was stored"
            assert receipt_count(worker) == 0, f"{name}: a receipt was stored"
        # nothing beside the worker's data dir was created or changed
        assert _tree(worker.data_dir.parent) - outside <= _tree(worker.data_dir)

        # control: the same offer, unbroken, is taken (so the refusals above were
        # about what was broken, not about how this test builds offers)
        good = _work_offer(key, wid, spec)
        accepted, reason = await _send_offer(host, worker, seal(good, key))
        assert accepted, reason
        await until(lambda: worker.get("/api/v1/status")["load"] == 100, 10, "load 100%")
        # the same unit id again, in a new offer: refused, the running unit untouched
        again = dataclasses.replace(_work_offer(key, wid, spec, unit_id=good.unit_id))
        accepted, reason = await _send_offer(host, worker, seal(again, key))
        observed["8 duplicate unit id"] = reason
        assert not accepted and f"unit {good.unit_id} is already known here" in reason
        # no second unit (the first may be over already: its owner here serves nothing)
        assert set(_units(worker)) <= {good.unit_id}
    return observed


def test_a_rogue_owners_broken_offers_are_declined(localnet: LocalNetwork) -> None:
    worker = localnet.add()
    started = time.monotonic()
    observed = trio.run(_rogue_owner, worker)
    for name, reason in observed.items():
        print(f"{name}: {reason}")
    print(f"worker side: {time.monotonic() - started:.1f} s")
    assert worker.proc is not None and worker.proc.poll() is None


# -- owner side: a rogue worker's results --------------------------------------------------


def _honest_tensors(seed: int = 1) -> dict[str, np.ndarray]:
    """Exactly the tensors the digits job's model has."""
    spec = spec_to_plain(parse_spec(tomllib.loads(unchecked_digits_toml("weights"))))
    return {
        name: np.full(shape, 0.01 * seed, dtype=np.float32)
        for name, (shape, _) in expected_tensors(spec).items()
    }


def _weights(seed: int) -> bytes:
    return save_safetensors(_honest_tensors(seed))


def _pickle_bytes() -> bytes:
    return pickle.dumps({"w": [0.0] * 8}, protocol=4)  # starts with b"\x80\x04"


def _torch_zip() -> bytes:
    """What torch.save writes: a zip holding a pickle."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", _pickle_bytes())
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


async def _rejected(
    owner: LocalNode, rogue: RogueWorker, envelope: bytes, job_id: str, expected: str
) -> str:
    """Send a result that must be rejected; checks the signed reply, the job, the receipts
    table and the blob store; returns the reason."""
    reply = await rogue.send_result(owner, envelope)
    assert not reply.accepted, reply
    assert reply.receipt == b""
    assert expected in reply.reason, reply.reason
    job = await api(owner, f"/api/v1/jobs/{job_id}")
    assert job["state"] != "completed" and job["weights_sha256"] == "", job
    assert receipt_rows(owner, job_id) == []
    assert stored_blobs(owner) == set(), "a rejected blob was kept"
    await assert_alive(owner)
    return reply.reason


def _notes(job: dict[str, Any]) -> list[str]:
    return [entry["note"] for entry in job["timeline"]]


async def _rogue_worker(owner: LocalNode, root: Path) -> dict[str, str]:
    rogue = RogueWorker(Identity(SigningKey.generate()), BlobStore(root, durable=False))
    other = SigningKey.generate()
    observed = {}
    async with running(rogue, owner), trio.open_nursery() as nursery:
        good, good_size = rogue.serve(_weights(1))

        # 9 (set up first, so its lease runs out while the others play): never a heartbeat
        late = await submit_and_accept(owner, rogue, "late")

        # 6: the served bytes do not hash to the sha256 the result names
        package = await submit_and_accept(owner, rogue, "bad-hash")
        claimed, size = rogue.serve(_weights(2), under=sha256(_weights(3)).hexdigest())
        envelope = seal(rogue.result(package, owner.peer_id, claimed, size), rogue.key)
        observed["6 weights hash mismatch"] = await _rejected(
            owner, rogue, envelope, package.job_id, "weights rejected"
        )
        assert "hashes to" in observed["6 weights hash mismatch"]
        job = await api(owner, f"/api/v1/jobs/{package.job_id}")
        assert job["state"] == "queued"
        assert any(f"weights from {rogue.peer_id} rejected" in n for n in _notes(job)), job

        # 8: a pickle and a torch .pt zip, correctly hashed and served
        for name, job_name, data in (
            ("8a pickle", "pickle", _pickle_bytes()),
            ("8b torch .pt zip", "zip", _torch_zip()),
        ):
            package = await submit_and_accept(owner, rogue, job_name)
            sha, size = rogue.serve(data)
            envelope = seal(rogue.result(package, owner.peer_id, sha, size), rogue.key)
            observed[name] = await _rejected(
                owner, rogue, envelope, package.job_id, "not a safetensors file"
            )
            job = await api(owner, f"/api/v1/jobs/{package.job_id}")
            assert job["state"] == "queued"
            assert any("not a safetensors file" in n for n in _notes(job)), job

        # 7: good weights, but the result is signed by another key / its signature forged
        forged_job = await submit_and_accept(owner, rogue, "forged")
        result = rogue.result(forged_job, owner.peer_id, good, good_size)
        observed["7a result signed by another key"] = await _rejected(
            owner,
            rogue,
            seal(result, other),
            forged_job.job_id,
            f"bad result: result is signed by {_peer_id(other)}",
        )
        observed["7b result signature forged"] = await _rejected(
            owner,
            rogue,
            _forged(result, claimed=rogue.key, actual=other),
            forged_job.job_id,
            "bad result: result signature does not verify",
        )
        # a result that cannot be attributed to its sender never touches a job: the
        # unit runs on (and would take the worker's genuine result, or expire)
        job = await api(owner, f"/api/v1/jobs/{forged_job.job_id}")
        assert job["state"] == "running" and job["unit_id"] == forged_job.unit_id, job

        # 9: the lease ran out (no heartbeat); then a valid-looking result arrives
        job = await until(
            lambda: (j := owner.get(f"/api/v1/jobs/{late.job_id}"))["state"] == "queued" and j,
            20,
            "the late unit's lease to expire",
        )
        assert any("vanished" in n for n in _notes(job)), job
        envelope = seal(rogue.result(late, owner.peer_id, good, good_size), rogue.key)
        observed["9 late result"] = await _rejected(
            owner, rogue, envelope, late.job_id, "lease expired"
        )
        job = await api(owner, f"/api/v1/jobs/{late.job_id}")
        assert job["state"] == "queued"
        assert any("late result" in n and "lease expired" in n for n in _notes(job)), job

        # 10-13: weights that are not this model's, or not finite, or too big
        honest = _honest_tensors()
        shaped = {**honest, "body.0.bias": np.zeros(33, np.float32)}
        poisoned = {**honest, "body.2.weight": honest["body.2.weight"].copy()}
        poisoned["body.2.weight"][0, 0] = np.nan
        for name, job_name, tensors, expected in (
            (
                "10 another model's tensors",
                "names",
                {"w": np.arange(8, dtype=np.float32)},
                "tensor names differ",
            ),
            ("11 a wrong shape", "shape", shaped, "expected F32 [16], found F32 [33]"),
            ("12 NaN", "nan", poisoned, "NaN or Inf"),
        ):
            package = await submit_and_accept(owner, rogue, job_name)
            sha, size = rogue.serve(save_safetensors(tensors))
            envelope = seal(rogue.result(package, owner.peer_id, sha, size), rogue.key)
            observed[name] = await _rejected(owner, rogue, envelope, package.job_id, expected)
        package = await submit_and_accept(owner, rogue, "oversized")
        big = dataclasses.replace(
            rogue.result(package, owner.peer_id, good, good_size), weights_size=1 << 30
        )
        observed["13 oversized"] = await _rejected(
            owner, rogue, seal(big, rogue.key), package.job_id, "this model's are at most"
        )

        # 14: a result for a unit this worker never had
        stranger = dataclasses.replace(
            rogue.result(late, owner.peer_id, good, good_size), unit_id=secrets.token_hex(8)
        )
        reply = await rogue.send_result(owner, seal(stranger, rogue.key))
        observed["14 someone else's unit"] = reply.reason
        assert not reply.accepted and "unknown unit" in reply.reason

        # 15: two results for one unit at once: one receipt at most
        package = await submit_and_accept(owner, rogue, "twice")
        twice = seal(rogue.result(package, owner.peer_id, good, good_size), rogue.key)
        replies: list[ReceiptReply] = []

        async def send() -> None:
            replies.append(await rogue.send_result(owner, twice))

        async with trio.open_nursery() as both:
            both.start_soon(send)
            both.start_soon(send)
        assert sorted(r.accepted for r in replies) == [False, True], replies
        observed["15 two results at once"] = next(r.reason for r in replies if not r.accepted)
        assert receipt_rows(owner, package.job_id) == [(package.unit_id, "owner")]

        # control: the same good weights in a genuine result are accepted with a receipt
        # (so the refusals above were about what was broken)
        package = await submit_and_accept(owner, rogue, "control")
        envelope = seal(rogue.result(package, owner.peer_id, good, good_size), rogue.key)
        reply = await rogue.send_result(owner, envelope)
        assert reply.accepted, reply.reason
        job = await api(owner, f"/api/v1/jobs/{package.job_id}")
        assert job["state"] == "completed" and job["weights_sha256"] == good
        assert receipt_rows(owner, package.job_id) == [(package.unit_id, "owner")]
        assert stored_blobs(owner) == {good}

        # the forged results never touched their job: its unit ran on until its lease ended
        job = await api(owner, f"/api/v1/jobs/{forged_job.job_id}")
        assert job["state"] != "completed" and receipt_rows(owner, forged_job.job_id) == []
        nursery.cancel_scope.cancel()
    return observed


def test_a_rogue_workers_bad_results_are_rejected(localnet: LocalNetwork, tmp_path: Path) -> None:
    owner = localnet.add(["--not-accepting", "--lease", "3"])
    started = time.monotonic()
    observed = trio.run(_rogue_worker, owner, tmp_path / "rogue")
    for name, reason in observed.items():
        print(f"{name}: {reason}")
    print(f"owner side: {time.monotonic() - started:.1f} s")
    assert owner.proc is not None and owner.proc.poll() is None
    jobs = {j["name"]: j for j in owner.get("/api/v1/jobs")}
    assert {name: j["state"] for name, j in jobs.items() if name != "forged"} == {
        "late": "queued",
        "bad-hash": "queued",
        "pickle": "queued",
        "zip": "queued",
        "names": "queued",
        "shape": "queued",
        "nan": "queued",
        "oversized": "queued",
        "twice": "completed",
        "control": "completed",
    }


async def _heartbeat_forever(owner: LocalNode, root: Path) -> tuple[float, str, dict]:
    """A worker that takes a unit and heartbeats, never returning a result: how long
    until the owner says stop, and why."""
    rogue = RogueWorker(Identity(SigningKey.generate()), BlobStore(root, durable=False))
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(rogue.identity, listen) as host, trio.open_nursery() as nursery:
        rogue.host = host
        host.serve(ADS_PROTOCOL, rogue.serve_table, max_request=64)
        host.serve(PROBE_PROTOCOL, rogue.serve_probe, max_request=64)
        host.serve(TASK_PROTOCOL, rogue.handle_offer, WORK_LIMITS.max_bytes)
        await host.subscribe(CAPACITY_TOPIC, lambda sender, data: True)
        await host.connect(owner.multiaddr)
        nursery.start_soon(rogue.publish_ads)
        await until(lambda: rogue.peer_id in owner.peer_ids(), 15, "the owner to list the rogue")
        body = {"spec": digits_toml("forever", steps=20, extra="max_hours = 0.001")}
        job = await trio.to_thread.run_sync(
            lambda: request_json(owner.api, "POST", "/api/v1/jobs", body)
        )
        with trio.fail_after(20):
            while job["id"] not in rogue.packages:
                await trio.sleep(0.05)
        package = rogue.packages[job["id"]]
        accepted_at = time.monotonic()
        with trio.fail_after(60):
            while True:
                beat = Progress(
                    package.job_id, package.unit_id, "training", 1, 20, 0.5, 1.0, 64, time.time()
                )
                raw = await host.request(
                    owner.peer_id, PROGRESS_PROTOCOL, seal(beat, rogue.key), 4096
                )
                ack = decode_progress_ack(raw)
                if not ack.ok:
                    break
                await trio.sleep(0.5)
        held = time.monotonic() - accepted_at
        job = await until(
            lambda: (j := owner.get(f"/api/v1/jobs/{job['id']}"))["state"] != "running" and j,
            5,
            "the owner to end the unit",
        )
        nursery.cancel_scope.cancel()
    return held, ack.reason, job


def test_heartbeats_cannot_hold_a_unit_past_max_hours(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """max_hours = 0.001 (3.6 s), lease 3 s: the unit's deadline is 3.6 + 4 x 3 = 15.6 s
    after the offer, however often the worker heartbeats."""
    owner = localnet.add(["--not-accepting", "--lease", "3"])
    held, reason, job = trio.run(_heartbeat_forever, owner, tmp_path / "rogue")
    print(f"the unit was held {held:.1f} s; then: {reason}")
    assert "ran past the job's max_hours" in reason
    assert 12 < held < 25
    assert job["state"] == "queued" and job["weights_sha256"] == ""
    assert any("max_hours" in n for n in _notes(job)), job
    assert owner.get("/api/v1/ledger")["entries"][-1]["kind"] != "work_received"
