"""Hostile programs against real node processes: an owner's node refuses a hostile
`.pt2` at submit, and a volunteer's node, handed a hostile program by a rogue owner,
refuses it in its runner before any op, with the reason in the unit's result.

Owner side: each archive of `hostile_archives.ARCHIVES` is posted to
`/api/v1/jobs` as a user's upload. Each gets 400 naming the problem; nothing is
stored (no blob, no job row, no upload left behind), the payload never runs, and the
node keeps answering. The honest pair is accepted, and the sample-inputs pickle
converts to the very same program blob.

Volunteer side: a rogue owner (a libp2p host in this process, built from our own
protocol modules) offers units whose program blob is each of
`hostile_programs.PROGRAMS`, with the honest program's figures in the spec, and
serves the hostile bytes under a grant it signed. The worker accepts (it cannot see
the program before fetching it), its runner refuses the program, and the failed
unit's result names the problem; no marker, no receipt, no credit, the worker stays
up. The honest program, offered the same way, trains.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from hostile_archives import ARCHIVES, sample_inputs_pickle, unused_weight
from hostile_programs import PROGRAMS, Honest, export_honest
from nacl.signing import SigningKey
from programs.export import program_toml
from rogue import assert_alive, query, receipt_count, stored_blobs, unchecked_digits_toml, until

from node.client import ApiError, submit_job
from node.demo.localnet import LocalNetwork, LocalNode, free_port
from node.identity import Identity
from node.net.host import MeshHost
from node.work.blobs import BlobStore, serve_blobs_libp2p
from protocol import encode, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import BlobGrant
from protocol.crypto import new_job_key, seal_to
from protocol.names import PROGRESS_PROTOCOL, RESULT_PROTOCOL, TASK_PROTOCOL
from protocol.work import (
    WORK_LIMITS,
    OfferReply,
    Progress,
    ReceiptReply,
    Result,
    WorkOffer,
    WorkPackage,
    encode_ack,
)
from training.program import Program, convert_pt2, encode_program, figures
from training.program.job import spec_figures
from training.spec.job import parse_spec, spec_to_plain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Honest:
    return export_honest(tmp_path_factory.mktemp("honest"))


# -- owner side: a user's hostile upload ----------------------------------------------------


def _submit(owner: LocalNode, train: Path, evaluation: Path) -> dict[str, Any]:
    """POST the pair as `meshminer submit` does: the spec and both archives, multipart."""
    spec = program_toml("hostile", steps=5, top='placement = "local"')
    files = {"program": train, "eval_program": evaluation}
    return submit_job(owner.api, spec, None, token=owner.token, timeout=60, files=files)


def test_an_owner_refuses_hostile_archives_at_submit_and_stores_nothing(
    localnet: LocalNetwork, honest: Honest, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    uploads = owner.data_dir / "uploads"
    observed = {}
    started = time.monotonic()
    for name, (builder, expected) in ARCHIVES.items():
        marker = tmp_path / f"marker-{len(observed)}"
        hostile = builder(honest.train, tmp_path / f"hostile-{len(observed)}", marker)
        assert hostile.name == "model.pt2"
        with pytest.raises(ApiError) as refused:
            _submit(owner, hostile, honest.eval)
        observed[name] = message = str(refused.value)
        assert message.startswith("submit: 400 ") and expected in message, f"{name}: {message}"
        assert not marker.exists(), f"{name}: the payload ran"
        assert stored_blobs(owner) == set(), f"{name}: a blob was stored"
        assert owner.get("/api/v1/jobs") == [], f"{name}: a job was listed"
        assert query(owner, "select count(*) from jobs")[0][0] == 0, f"{name}: a job row"
        assert list(uploads.iterdir()) == [], f"{name}: an upload was left behind"
        assert owner.get("/api/v1/status")["peer_id"] == owner.peer_id
    refusals_s = time.monotonic() - started

    # control: the honest pair is accepted, and the archive with a pickle in its
    # (never opened) sample inputs converts to the very same program blob
    job = _submit(owner, honest.train, honest.eval)
    blob = job["spec"]["model"]["program"].removeprefix("blob:")
    assert stored_blobs(owner) == {blob}
    marker = tmp_path / "marker-sample-inputs"
    sample_inputs = sample_inputs_pickle(honest.train, tmp_path / "sample-inputs", marker)
    again = _submit(owner, sample_inputs, honest.eval)
    assert again["spec"]["model"] == job["spec"]["model"]
    assert stored_blobs(owner) == {blob} and not marker.exists()
    done = owner.wait_job_end(job["id"], timeout=120)
    assert done["state"] == "completed", done["timeline"]
    for name, message in observed.items():
        print(f"{name}: {message}")
    print(f"{len(observed)} refusals in {refusals_s:.1f} s")


def test_an_owner_refuses_state_that_no_graph_takes_with_400(
    localnet: LocalNetwork, honest: Honest, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    hostile = unused_weight(honest.train, tmp_path / "hostile", tmp_path / "marker")
    with pytest.raises(ApiError) as refused:
        _submit(owner, hostile, honest.eval)
    assert stored_blobs(owner) == set() and owner.get("/api/v1/jobs") == []
    assert owner.get("/api/v1/status")["peer_id"] == owner.peer_id
    assert str(refused.value).startswith("submit: 400 "), refused.value
    assert "'hook'" in str(refused.value)


# -- volunteer side: a rogue owner's hostile program ------------------------------------------


@dataclass
class RogueOwner:
    """Offers units, serves their program blobs under its own grants, acknowledges
    heartbeats and collects the results (answering each without a receipt)."""

    identity: Identity
    store: BlobStore
    host: MeshHost | None = None
    keys: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (job, unit) -> key
    results: dict[str, Result] = field(default_factory=dict)  # by unit id

    @property
    def key(self) -> SigningKey:
        return self.identity.signing_key

    def job_key(self, job_id: str, unit_id: str) -> bytes | None:
        return self.keys.get((job_id, unit_id))

    async def handle_progress(self, peer: str, data: bytes) -> bytes:
        open_envelope(data, Progress, expected_signer=peer, limits=WORK_LIMITS)
        return encode_ack(True)

    async def handle_result(self, peer: str, data: bytes) -> bytes:
        result = open_envelope(data, Result, expected_signer=peer, limits=WORK_LIMITS).message
        self.results[result.unit_id] = result
        return seal(ReceiptReply(False, "this owner keeps no receipts", b""), self.key)

    def offer(self, worker_id: str, spec: dict[str, Any], program: bytes) -> WorkOffer:
        """An offer as `node/work/offers.py` builds one: the program is the unit's one
        blob, under a grant sealed by this owner for the worker."""
        sha = self.store.put_bytes(program)
        job_id, unit_id = "a77ac4" + secrets.token_hex(5), secrets.token_hex(8)
        job_key = new_job_key()
        self.keys[(job_id, unit_id)] = job_key
        grant = BlobGrant(
            job_id,
            unit_id,
            self.identity.peer_id,
            worker_id,
            [sha],
            len(program),
            time.time() + 3600,
        )
        package = WorkPackage(
            job_id,
            unit_id,
            encode(_with_program(spec, sha)),
            [sha],
            seal(grant, self.key),
            job_key,
            1.0,
            15.0,
        )
        sealed = seal_to(public_key_from_peer_id(worker_id), self.key, seal(package, self.key))
        return WorkOffer(job_id, unit_id, worker_id, sealed, time.time())


def _with_program(spec: dict[str, Any], sha: str) -> dict[str, Any]:
    model = {**spec["model"], "program": f"blob:{sha}"}
    return spec_to_plain(parse_spec({**spec, "model": model}))


def _program_spec(program: Program, data: bytes) -> dict[str, Any]:
    """A small digits job whose model is the converted program `data` with `program`'s
    figures (a hostile owner keeps the honest figures, which pass the worker's planning)."""
    plain = spec_to_plain(parse_spec(tomllib.loads(unchecked_digits_toml("program", steps=5))))
    model = {"arch": "program", "output": "logits", **spec_figures(figures(program))}
    return _with_program({**plain, "model": model}, hashlib.sha256(data).hexdigest())


async def _unit(
    rogue: RogueOwner, worker: LocalNode, spec: dict[str, Any], program: bytes
) -> Result:
    """Offer one unit of `program`, which the worker must take; its result."""
    assert rogue.host is not None
    await until(lambda: worker.get("/api/v1/status")["load"] == 0, 30, "the worker to be free")
    offer = rogue.offer(worker.peer_id, spec, program)
    raw = await rogue.host.request(
        worker.peer_id, TASK_PROTOCOL, seal(offer, rogue.key), WORK_LIMITS.max_bytes
    )
    reply = open_envelope(raw, OfferReply, expected_signer=worker.peer_id, limits=WORK_LIMITS)
    assert reply.message.accepted, reply.message.reason
    with trio.fail_after(180):
        while offer.unit_id not in rogue.results:
            await trio.sleep(0.1)
    return rogue.results[offer.unit_id]


async def _rogue_owner(worker: LocalNode, root: Path, honest: Honest) -> dict[str, str]:
    rogue = RogueOwner(Identity(SigningKey.generate()), BlobStore(root / "rogue", durable=False))
    program = convert_pt2(honest.train, honest.eval)
    honest_program = encode_program(program)
    spec = _program_spec(program, honest_program)
    observed = {}
    listen = f"/ip4/127.0.0.1/tcp/{free_port()}"
    async with MeshHost.start(rogue.identity, listen) as host:
        rogue.host = host
        host.serve(PROGRESS_PROTOCOL, rogue.handle_progress, WORK_LIMITS.max_bytes)
        host.serve(RESULT_PROTOCOL, rogue.handle_result, WORK_LIMITS.max_bytes)
        serve_blobs_libp2p(host, rogue.store, rogue.job_key)
        await host.connect(worker.multiaddr)
        for i, (name, (builder, expected)) in enumerate(PROGRAMS.items()):
            marker = root / f"marker-{i}"
            result = await _unit(rogue, worker, spec, builder(honest_program, marker))
            observed[name] = result.error
            assert not result.ok and expected in result.error, f"{name}: {result.error!r}"
            assert result.weights_sha256 == "" and result.steps == 0, name
            assert not marker.exists(), f"{name}: the payload ran"
            await assert_alive(worker)
            assert receipt_count(worker) == 0, f"{name}: a receipt was stored"

        # control: the honest program, offered the same way, trains
        result = await _unit(rogue, worker, spec, honest_program)
        assert result.ok and result.weights_sha256 and result.steps == 5, result.error
    return observed


def test_a_volunteer_refuses_a_rogue_owners_hostile_programs_before_any_op(
    localnet: LocalNetwork, honest: Honest, tmp_path: Path
) -> None:
    worker = localnet.add()
    started = time.monotonic()
    observed = trio.run(_rogue_owner, worker, tmp_path, honest)
    for name, error in observed.items():
        print(f"{name}: {error}")
    print(f"volunteer side: {time.monotonic() - started:.1f} s")
    assert worker.proc is not None and worker.proc.poll() is None
    ledger = worker.get("/api/v1/ledger")["entries"]
    assert not [e for e in ledger if e["kind"] == "work_done"], ledger
    assert receipt_count(worker) == 0
