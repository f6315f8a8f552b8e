"""The worker's checks of an offer (`WorkerRole.handle_offer`, node/work/worker.py), each
refusal reason on its own: a real `WorkerRole` on a real node.db, offers sealed and
signed as node/work/offers.py builds them, in this process (no host, no runner).

Every decline comes back as the worker's signed `OfferReply` with the reason and
whether it is transient (ask again later) or not, and leaves nothing running."""

from __future__ import annotations

import hashlib
import shutil
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from nacl.signing import SigningKey

from node.identity import Identity
from node.preferences import Preferences
from node.store import open_node_db
from node.work.blobs import BlobStore
from node.work.context import WorkContext, WorkLimits
from node.work.heartbeats import RunningUnit
from node.work.jobs import JobStore
from node.work.service import validate_wire_spec
from node.work.worker import WorkerRole
from protocol import GpuInfo, Policy, encode, open_envelope, seal
from protocol.blobs import BlobGrant
from protocol.crypto import new_job_key, seal_to
from protocol.work import WORK_LIMITS, OfferReply, WorkOffer, WorkPackage
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain


def _identity(name: str) -> Identity:
    return Identity(SigningKey(hashlib.sha256(f"offer checks: {name}".encode()).digest()))


OWNER, WORKER, STRANGER = _identity("owner"), _identity("worker"), _identity("stranger")
JOB, UNIT = "0123456789abcdef", "fedcba9876543210"
BLOB = hashlib.sha256(b"the job's data").hexdigest()
MIB = 2**20


def _spec(extra: str = "", gpu: str = "preferred") -> dict[str, Any]:
    """A small built-in-data job as the owner sends it (`extra` goes to [requirements])."""
    toml = digits_toml("offered", steps=20, hidden=(16,), gpu=gpu, extra=extra)
    return spec_to_plain(parse_spec(tomllib.loads(toml)))


@dataclass
class Volunteer:
    """What the worker's owner set, and what the node is doing now."""

    policy: Policy = field(default_factory=Policy)
    preferences: Preferences = field(default_factory=Preferences)
    paused_because: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)  # a CPU-only node by default
    units_here: set[str] = field(default_factory=set)
    max_units: int = 1
    max_download_mb: int = 1024


@pytest.fixture
def node_db(tmp_path: Path) -> Iterator[Any]:
    db = open_node_db(tmp_path)
    try:
        yield db
    finally:
        db.close()


def _worker(tmp_path: Path, db: Any, volunteer: Volunteer) -> WorkerRole:
    ctx = WorkContext(
        identity=WORKER,
        host=None,  # type: ignore[arg-type]  # checks never touch the network
        peers=None,  # type: ignore[arg-type]
        jobs=JobStore(db),
        blobs=BlobStore(tmp_path),
        data_dir=tmp_path,
        own_ad=lambda: SimpleNamespace(gpus=volunteer.gpus),  # type: ignore[arg-type,return-value]
        policy=lambda: volunteer.policy,
        preferences=lambda: volunteer.preferences,
        ledger=None,  # type: ignore[arg-type]
        publish_receipt=lambda raw: trio.sleep(0),
        publish_evidence=lambda raw: trio.sleep(0),
        paused_because=lambda: volunteer.paused_because,
        units_here=set(volunteer.units_here),
        limits=WorkLimits(
            max_units=volunteer.max_units,
            max_unit_download_bytes=volunteer.max_download_mb * MIB,
        ),
    )
    return WorkerRole(ctx, None, validate_wire_spec, None)  # type: ignore[arg-type]


def _grant(
    *, grantee: Identity = WORKER, blobs: tuple[str, ...] = (BLOB,), max_bytes: int = MIB
) -> BlobGrant:
    return BlobGrant(JOB, UNIT, OWNER.peer_id, grantee.peer_id, list(blobs), max_bytes, 2e9)


def _offer(
    *,
    spec: dict[str, Any] | None = None,
    spec_bytes: bytes | None = None,
    max_hours: float = 1.0,
    grant: BlobGrant | None = None,
    grant_signer: Identity = OWNER,
    package_blobs: list[str] | None = None,  # default: the grant's
    package_unit: str = UNIT,
    package_signer: Identity = OWNER,
    sealed_to: Identity = WORKER,
    addressed_to: Identity = WORKER,
    offer_signer: Identity = OWNER,
) -> bytes:
    """The signed offer bytes; by default one this worker accepts."""
    package = WorkPackage(
        JOB,
        package_unit,
        spec_bytes if spec_bytes is not None else encode(spec or _spec()),
        package_blobs if package_blobs is not None else list(grant.blobs) if grant else [],
        seal(grant, grant_signer.signing_key) if grant is not None else b"",
        new_job_key(),
        max_hours,
        15.0,
    )
    sealed = seal_to(
        sealed_to.public_key, OWNER.signing_key, seal(package, package_signer.signing_key)
    )
    offer = WorkOffer(JOB, UNIT, addressed_to.peer_id, sealed, time.time())
    return seal(offer, offer_signer.signing_key)


def _answer(worker: WorkerRole, offer: bytes) -> OfferReply:
    """The worker's signed reply to `offer` from the owner."""
    raw = trio.run(worker.handle_offer, OWNER.peer_id, offer)
    reply = open_envelope(raw, OfferReply, expected_signer=WORKER.peer_id, limits=WORK_LIMITS)
    return reply.message


GPU_8_GB = [GpuInfo("a test GPU", "cuda", memory_total_mb=8192, memory_free_mb=8192)]

# (what is wrong, the volunteer, the offer's arguments, the reason given, transient)
DECLINES = [
    pytest.param(
        Volunteer(),
        {"offer_signer": STRANGER},
        f"bad offer: work_offer is signed by {STRANGER.peer_id}, but was sent by",
        False,
        id="offer-not-signed-by-the-sender",
    ),
    pytest.param(
        Volunteer(),
        {"addressed_to": STRANGER},
        "the offer is addressed to another node",
        False,
        id="addressed-to-another-node",
    ),
    pytest.param(
        Volunteer(),
        {"sealed_to": STRANGER},
        "cannot open the package: not sealed to this node",
        False,
        id="sealed-to-another-node",
    ),
    pytest.param(
        Volunteer(),
        {"package_signer": STRANGER},
        f"bad offer: work_package is signed by {STRANGER.peer_id}, but was sent by",
        False,
        id="package-not-signed-by-the-owner",
    ),
    pytest.param(
        Volunteer(),
        {"package_unit": "00000000000000aa"},
        "the package does not match the offer",
        False,
        id="package-names-another-unit",
    ),
    pytest.param(
        Volunteer(policy=Policy(accepting=False)),
        {},
        "this node is paused (not accepting work)",
        False,
        id="not-accepting",
    ),
    pytest.param(
        Volunteer(preferences=Preferences(deny_owners=[OWNER.peer_id])),
        {},
        "this node does not take work from you (deny list)",
        False,
        id="deny-list",
    ),
    pytest.param(
        Volunteer(preferences=Preferences(allow_owners=[STRANGER.peer_id])),
        {},
        "this node only takes work from its allow list",
        False,
        id="not-on-the-allow-list",
    ),
    pytest.param(
        Volunteer(paused_because="outside its hours (22:00-07:00)"),
        {},
        "this node does not train now: outside its hours (22:00-07:00)",
        True,
        id="preferences-pause-training",
    ),
    pytest.param(
        Volunteer(units_here={"1111111111111111"}),
        {},
        "busy: 1 unit(s) training here",
        True,
        id="busy",
    ),
    pytest.param(
        Volunteer(policy=Policy(max_job_hours=2.0)),
        {"max_hours": 3.0},
        "job may run 3 h; this node takes up to 2 h",
        False,
        id="job-longer-than-the-policy-allows",
    ),
    pytest.param(
        Volunteer(),
        {"spec_bytes": b"\xc1 not msgpack"},
        "bad offer: not valid msgpack",
        False,
        id="spec-not-decodable",
    ),
    pytest.param(
        Volunteer(),
        {"spec": {**_spec(), "data": {**_spec()["data"], "source": "/home/owner/data.npz"}}},
        "invalid job spec: data.source '/home/owner/data.npz': a worker reads data only from "
        "blobs or built-in data sets",
        False,
        id="data-from-a-local-path",
    ),
    pytest.param(
        Volunteer(),
        {"spec": {"name": "no-model"}},
        "invalid job spec: model.arch is required",
        False,
        id="spec-invalid",
    ),
    pytest.param(
        Volunteer(),
        {"spec": _spec(gpu="required")},
        "the job requires a GPU; this node has none",
        False,
        id="gpu-required-on-a-cpu-node",
    ),
    pytest.param(
        Volunteer(gpus=GPU_8_GB, policy=Policy(max_gpu_memory_share=0.5)),
        {"spec": _spec("min_gpu_memory_gb = 6")},
        "the job needs 6 GB of GPU memory; this node offers 50% of its GPU memory",
        False,
        id="gpu-memory-share-too-small",
    ),
    pytest.param(
        Volunteer(),
        {"grant": _grant(grantee=STRANGER)},
        "the blob grant does not match the package",
        False,
        id="grant-to-another-node",
    ),
    pytest.param(
        Volunteer(),
        {"grant": _grant(), "package_blobs": [BLOB, "ab" * 32]},
        "the blob grant does not match the package",
        False,
        id="grant-for-other-blobs",
    ),
    pytest.param(
        Volunteer(),
        {"grant": _grant(), "grant_signer": STRANGER},
        f"bad offer: blob_grant is signed by {STRANGER.peer_id}, but was sent by",
        False,
        id="grant-not-signed-by-the-owner",
    ),
    pytest.param(
        Volunteer(max_download_mb=100),
        {"grant": _grant(blobs=(BLOB, "ab" * 32), max_bytes=60 * MIB)},
        "the unit's data may be 120 MiB; this node fetches at most 100 MiB per unit",
        False,
        id="download-over-the-per-unit-cap",
    ),
]


@pytest.mark.parametrize(("volunteer", "offer", "reason", "transient"), DECLINES)
def test_each_check_declines_with_its_reason(
    tmp_path: Path,
    node_db: Any,
    volunteer: Volunteer,
    offer: dict[str, Any],
    reason: str,
    transient: bool,
) -> None:
    worker = _worker(tmp_path, node_db, volunteer)
    reply = _answer(worker, _offer(**offer))
    assert not reply.accepted
    assert reply.reason.startswith(reason), reply.reason
    assert reply.transient is transient
    assert worker.units == {} and worker.ctx.units_here == volunteer.units_here


def test_the_default_offer_passes_every_check(tmp_path: Path, node_db: Any) -> None:
    """The baseline the declines above break one check of: with data to fetch, on the
    allow list, a GPU job on a node whose share of GPU memory is enough."""
    volunteer = Volunteer(
        preferences=Preferences(allow_owners=[OWNER.peer_id]),
        gpus=GPU_8_GB,
        policy=Policy(max_gpu_memory_share=0.9),
    )
    worker = _worker(tmp_path, node_db, volunteer)
    offer = open_envelope(_offer(spec=_spec("min_gpu_memory_gb = 6"), grant=_grant()), WorkOffer)
    unit = worker._check_offer(OWNER.peer_id, offer.message)
    assert isinstance(unit, RunningUnit)
    assert (unit.owner, unit.package.unit_id, unit.spec["name"]) == (OWNER.peer_id, UNIT, "offered")
    assert unit.grant is not None and unit.grant.blobs == [BLOB]


def test_a_unit_already_here_or_already_receipted_is_declined(tmp_path: Path, node_db: Any) -> None:
    worker = _worker(tmp_path, node_db, Volunteer())
    offer = open_envelope(_offer(), WorkOffer)
    worker.units[UNIT] = worker._check_offer(OWNER.peer_id, offer.message)  # training here
    reply = _answer(worker, _offer())
    assert (reply.accepted, reply.reason) == (False, f"unit {UNIT} is already known here")

    worker.units.clear()  # done, and its receipt is in node.db
    worker.ctx.jobs.add_receipt(UNIT, JOB, "worker", OWNER.peer_id, WORKER.peer_id, b"cosigned")
    reply = _answer(worker, _offer())
    assert (reply.accepted, reply.reason) == (False, f"unit {UNIT} is already known here")
    assert not reply.transient


@pytest.mark.parametrize(
    ("volunteer", "reason"),
    [
        (Volunteer(units_here={"1111111111111111"}), "busy: 1 unit(s) training here"),
        (
            Volunteer(preferences=Preferences(deny_owners=[OWNER.peer_id])),
            "this node does not take work from you (deny list)",
        ),
    ],
    ids=["busy", "deny-list"],
)
def test_a_busy_or_unwilling_node_declines_before_opening_the_package(
    tmp_path: Path, node_db: Any, volunteer: Volunteer, reason: str
) -> None:
    """The policy comes before any cryptography: a package this node could not even
    open is declined for the policy's reason, at the cost of the offer's signature."""
    worker = _worker(tmp_path, node_db, volunteer)
    reply = _answer(worker, _offer(sealed_to=STRANGER))
    assert (reply.accepted, reply.reason) == (False, reason)


def test_data_larger_than_half_the_free_disk_is_declined_for_now(
    tmp_path: Path, node_db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = _worker(tmp_path, node_db, Volunteer())
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=100 * MIB))
    reply = _answer(worker, _offer(grant=_grant(max_bytes=60 * MIB)))
    assert not reply.accepted and reply.transient
    assert reply.reason == ("the unit's data may be 60 MiB; this node has 100 MiB of disk free"), (
        reply.reason
    )


def test_the_disk_guards_decline_what_would_fill_the_units_folders_or_the_disk(
    tmp_path: Path, node_db: Any
) -> None:
    """A real folder of 3 MiB in units/: a cap of 4 MiB takes a unit bringing 1 MiB of
    data and declines one bringing 2 MiB, for now (the folders empty as units end); a
    free-space floor past what the disk has declines too."""
    units = tmp_path / "units" / "1111111111111111"
    units.mkdir(parents=True)
    (units / "checkpoint.safetensors").write_bytes(b"\0" * 3 * MIB)
    cap = 4 * MIB / 2**30
    worker = _worker(tmp_path, node_db, Volunteer(preferences=Preferences(max_units_disk_gb=cap)))
    offer = open_envelope(_offer(grant=_grant(max_bytes=MIB)), WorkOffer)
    assert isinstance(worker._check_offer(OWNER.peer_id, offer.message), RunningUnit)
    reply = _answer(worker, _offer(grant=_grant(max_bytes=2 * MIB)))
    assert not reply.accepted and reply.transient
    assert reply.reason.startswith("its units' folders hold 0.0 GB"), reply.reason
    assert reply.reason.endswith(f"within {cap:g} GB")
    free_gb = shutil.disk_usage(tmp_path).free / 2**30
    floor = Volunteer(preferences=Preferences(min_free_disk_gb=round(free_gb + 10)))
    reply = _answer(_worker(tmp_path, node_db, floor), _offer())
    assert not reply.accepted and reply.transient
    assert f"GB of disk free; this node keeps {round(free_gb + 10):g} GB free" in reply.reason


def test_a_worker_past_its_daily_transfer_cap_declines_for_now(
    tmp_path: Path, node_db: Any
) -> None:
    volunteer = Volunteer(preferences=Preferences(daily_transfer_gb=0.5))
    worker = _worker(tmp_path, node_db, volunteer)
    worker.ctx.download_cap.take(2**29)  # half a GB fetched today, counted as it came
    reply = _answer(worker, _offer())
    assert not reply.accepted and reply.transient
    assert reply.reason == (
        "this node moves no more data today: today's 0.5 GB of job data transfer are used"
    )


def test_a_unit_on_a_gpu_trains_within_the_cap_per_gpu(tmp_path: Path, node_db: Any) -> None:
    """`max_gpu_pct` is the duty cycle of a unit that trains on this node's GPU (with
    the load limit, the lower wins); a CPU unit, or a node without a GPU, ignores it."""
    from node.work.run import RunnerRequest

    prefs = Preferences(max_gpu_pct=40)
    gpu_node = Volunteer(preferences=prefs, gpus=GPU_8_GB)
    on_gpu = RunnerRequest({}, {}, tmp_path / "w", device="auto")
    on_cpu = RunnerRequest({}, {}, tmp_path / "w", device="cpu")
    ctx = _worker(tmp_path, node_db, gpu_node).ctx
    assert ctx.duty_cycle(on_gpu) == 40 and ctx.duty_cycle(on_cpu) == 100
    assert ctx.duty_cycle() == 100  # the machine's share: the load limit alone
    gpu_node.policy = Policy(load_limit_pct=25)
    assert ctx.duty_cycle(on_gpu) == 25
    gpu_node.paused_because = "on battery (it trains on mains power)"
    assert ctx.duty_cycle(on_gpu) == 0
    cpu_node = Volunteer(preferences=prefs)
    assert _worker(tmp_path / "cpu", node_db, cpu_node).ctx.duty_cycle(on_gpu) == 100
