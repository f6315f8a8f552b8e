"""Messages of the work-package flow: offer, reply, progress, result, receipt.

Owner -> worker on `/meshminer/task/1`: a `WorkOffer`, signed by the owner, whose
`sealed` field is a `WorkPackage` encrypted to the worker (crypto_box), so only the
worker learns the spec, the blob grant and the job key. Worker -> owner: a signed
`OfferReply`, then `Progress` heartbeats on `/meshminer/progress/1`, then a signed
`Result` on `/meshminer/result/1`, answered by the owner's signed `Receipt`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from protocol.checks import require, require_sha256
from protocol.codec import Limits, decode, encode
from protocol.errors import DecodeError
from protocol.ids import check_id, check_peer
from protocol.rounds import RoundShare

#: offers carry a sealed spec and a grant; results carry metrics: small messages
WORK_LIMITS = Limits(
    max_bytes=256 * 1024,
    max_depth=6,
    max_container_len=1024,
    max_str_len=4096,
    max_bin_len=200 * 1024,
)


MAX_CHECKPOINTS = 1001  # trust.checkpoints is at most 1000 segments


def _check_ids(obj: object, path: str) -> None:
    for name in ("job_id", "unit_id"):
        check_id(getattr(obj, name), f"{path}.{name}")


def _check_metrics(metrics: dict[str, float], path: str) -> None:
    require(len(metrics) <= 64, path, "has more than 64 entries")
    for key, value in metrics.items():
        require(0 < len(key) <= 64, f"{path} key", "must be 1..64 chars")
        require(not math.isnan(value), f"{path}[{key!r}]", "must not be NaN")


@dataclass(frozen=True)
class ResumeFrom:
    """A unit that goes on from where a lost one stopped: a checkpoint of that unit
    the owner fetched (one of the package's blobs), and its step."""

    state_sha256: str
    step: int

    def check(self, path: str) -> None:
        require_sha256(self.state_sha256, f"{path}.state_sha256")
        require(1 <= self.step <= 2**40, f"{path}.step", "must be 1..2**40")


@dataclass(frozen=True)
class WorkPackage:
    """The plaintext inside a `WorkOffer` (never sent unencrypted)."""

    TYPE: ClassVar[str] = "work_package"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    spec: bytes  # msgpack of the plain job spec (training.spec.job.spec_to_plain)
    blobs: list[str]  # sha256 of every blob the unit needs (dataset)
    blob_grant: bytes  # signed BlobGrant envelope for those blobs
    job_key: bytes  # 32-byte key for secretstream-encrypted blob transfer
    max_hours: float
    lease_s: float  # heartbeat at least this often, or the owner re-offers the unit
    round_share: RoundShare | None = None  # set for a share of an elastic round
    resume: ResumeFrom | None = None  # set for a unit that goes on from a lost one's state

    def check(self, path: str) -> None:
        _check_ids(self, path)
        for i, sha in enumerate(self.blobs):
            require_sha256(sha, f"{path}.blobs[{i}]")
        if self.resume is not None:
            require(
                self.resume.state_sha256 in self.blobs and self.round_share is None,
                f"{path}.resume.state_sha256",
                "must be one of the package's blobs (and no round's share resumes)",
            )
        if self.round_share is not None:
            for name in ("weights_sha256", "update_sha256"):
                sha = getattr(self.round_share, name)
                require(
                    not sha or sha in self.blobs,
                    f"{path}.round_share.{name}",
                    "must be one of the package's blobs",
                )
        require(len(self.job_key) == 32, f"{path}.job_key", "must be 32 bytes")
        require(0 < self.max_hours <= 24 * 365, f"{path}.max_hours", "must be in (0, 8760]")
        require(1 <= self.lease_s <= 3600, f"{path}.lease_s", "must be 1..3600 s")


@dataclass(frozen=True)
class WorkOffer:
    TYPE: ClassVar[str] = "work_offer"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    worker: str  # peer id the package is sealed to
    sealed: bytes  # crypto_box(WorkPackage envelope) to the worker
    created_at: float

    def check(self, path: str) -> None:
        _check_ids(self, path)
        check_peer(self.worker, f"{path}.worker")


@dataclass(frozen=True)
class OfferReply:
    TYPE: ClassVar[str] = "offer_reply"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    accepted: bool
    reason: str = ""  # why not, when declined
    transient: bool = False  # declined for now (busy), not for this job: ask again later

    def check(self, path: str) -> None:
        _check_ids(self, path)
        require(len(self.reason) <= 1000, f"{path}.reason", "must be <= 1000 chars")


PHASES = ("fetching", "training", "waiting", "paused", "uploading")


@dataclass(frozen=True)
class Progress:
    """Worker -> owner: where training stands; every one also renews the unit's lease."""

    TYPE: ClassVar[str] = "progress"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    # "fetching" | "training" | "waiting" (an eager share's runner, for its round's
    # weights: the owner may hold its answer until they exist) | "paused" (by its
    # volunteer) | "uploading"
    phase: str
    step: int
    total_steps: int
    loss: float | None
    samples_per_s: float
    samples: int
    timestamp: float
    val_loss: float | None = None  # of the latest validation during training (val_step)
    val_step: int = -1  # the step of that validation (-1: none yet)
    val_accuracy: float | None = None
    # the sha256 of the unit's checkpoints from index `commit_from` on, sent as each is
    # made: the worker is bound to a state before it can know whether it is replayed
    commit_from: int = 0
    commitments: list[str] = field(default_factory=list)
    evidence_grant: bytes = b""  # a BlobGrant for the states the owner asked to keep
    # its runner waits, or soon will, for room (`training.evidence.writer`): the owner
    # fetches what it asked to keep now rather than with the result
    evidence_full: bool = False

    def check(self, path: str) -> None:
        _check_ids(self, path)
        require(
            self.commit_from >= 0 and self.commit_from + len(self.commitments) <= MAX_CHECKPOINTS,
            f"{path}.commitments",
            f"must lie within the {MAX_CHECKPOINTS} checkpoints of a unit",
        )
        for i, sha in enumerate(self.commitments):
            require_sha256(sha, f"{path}.commitments[{i}]")
        require(
            self.phase in PHASES,
            f"{path}.phase",
            "must be fetching, training, waiting, paused or uploading",
        )
        require(
            0 <= self.step <= max(self.total_steps, 0), f"{path}.step", "must be 0..total_steps"
        )
        require(self.samples >= 0 and self.samples_per_s >= 0, f"{path}.samples", "must be >= 0")
        require(-1 <= self.val_step <= self.step, f"{path}.val_step", "must be -1..step")
        for name in ("loss", "val_loss", "val_accuracy"):
            value = getattr(self, name)
            require(value is None or math.isfinite(value), f"{path}.{name}", "must be finite")


@dataclass(frozen=True)
class Result:
    """Worker -> owner: the signed outcome of a unit."""

    TYPE: ClassVar[str] = "result"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    ok: bool
    error: str  # why the unit failed, when not ok
    weights_sha256: str  # "" when not ok
    weights_size: int
    weights_grant: bytes  # signed BlobGrant from the worker for the weights blob
    metrics: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    samples: int = 0
    wall_time_s: float = 0.0
    device: str = ""
    retryable: bool = False  # the failure was not the job's (handed back, data unreachable)
    # sha256 of the training-state files at the steps of training.evidence.checkpoints
    # .checkpoint_steps, in order: the evidence a spot check replays (docs/threat-model.md)
    checkpoints: list[str] = field(default_factory=list)

    def check(self, path: str) -> None:
        _check_ids(self, path)
        require_sha256(self.weights_sha256, f"{path}.weights_sha256", allow_empty=not self.ok)
        require(len(self.checkpoints) <= MAX_CHECKPOINTS, f"{path}.checkpoints", "too many")
        for i, sha in enumerate(self.checkpoints):
            require_sha256(sha, f"{path}.checkpoints[{i}]")
        require(self.weights_size >= 0, f"{path}.weights_size", "must be >= 0")
        require(len(self.error) <= 4000, f"{path}.error", "must be <= 4000 chars")
        _check_metrics(self.metrics, f"{path}.metrics")
        require(self.steps >= 0 and self.samples >= 0, f"{path}.steps", "must be >= 0")


@dataclass(frozen=True)
class Receipt:
    """Owner -> worker: the owner verified the result and stored the weights."""

    TYPE: ClassVar[str] = "receipt"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    owner: str
    worker: str
    weights_sha256: str
    steps: int
    samples: int
    metrics: dict[str, float]
    issued_at: float

    def check(self, path: str) -> None:
        _check_ids(self, path)
        check_peer(self.owner, f"{path}.owner")
        check_peer(self.worker, f"{path}.worker")
        require_sha256(self.weights_sha256, f"{path}.weights_sha256")
        _check_metrics(self.metrics, f"{path}.metrics")


#: the owner's answer to a result sent again while the first copy is being checked
#: (the worker's first try lost its answer in transit): not a refusal, ask again
RESULT_BEING_CHECKED = "result being checked: send it again later"


@dataclass(frozen=True)
class ReceiptReply:
    """Result stream answer: a receipt, or the reason the result was rejected."""

    TYPE: ClassVar[str] = "receipt_reply"
    VERSION: ClassVar[int] = 1

    accepted: bool
    reason: str
    receipt: bytes  # signed Receipt envelope when accepted, else b""


def encode_ack(ok: bool, reason: str = "") -> bytes:
    """The owner's answer to a progress message: keep going, or stop (and why).

    Unsigned: it travels on the libp2p stream the worker opened, whose peer is
    authenticated by Noise."""
    return encode({"ok": ok, "reason": reason[:1000]})


@dataclass(frozen=True)
class ProgressAck:
    """The owner's answer to a heartbeat, with what it decided of the worker's
    checkpoints: how many commitments it holds (`have`), which states to keep until
    it fetched them, and which the worker may delete."""

    ok: bool
    reason: str = ""
    have: int = 0
    keep: tuple[int, ...] = ()
    drop: tuple[int, ...] = ()
    # a round's share that takes its round's global weights on its way
    # (`ElasticSpec.takes_weights_at`), once the round before closed: their sha256,
    # the `RoundUpdate` that gives them from the weights the share started from ("":
    # fetch them whole), and a `BlobGrant` envelope to fetch that one blob
    weights_sha256: str = ""
    update_sha256: str = ""
    weights_grant: bytes = b""


MAX_ACK_GRANT_BYTES = 8 * 1024


def encode_progress_ack(ack: ProgressAck) -> bytes:
    value = {
        "ok": ack.ok,
        "reason": ack.reason[:1000],
        "have": ack.have,
        "keep": list(ack.keep),
        "drop": list(ack.drop),
    }
    if ack.weights_sha256:
        value |= {
            "weights_sha256": ack.weights_sha256,
            "update_sha256": ack.update_sha256,
            "weights_grant": ack.weights_grant,
        }
    return encode(value)


def decode_progress_ack(data: bytes) -> ProgressAck:
    """A heartbeat's answer; an answer without checkpoint decisions decides none."""
    limits = Limits(max_bytes=32 * 1024, max_depth=2, max_container_len=MAX_CHECKPOINTS)
    value = decode(data, limits)
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        raise DecodeError("not a progress acknowledgement")
    have = value.get("have", 0)
    lists = [value.get(name, []) for name in ("keep", "drop")]
    indices = [i for one in lists if isinstance(one, list) for i in one]
    if (
        type(have) is not int
        or not 0 <= have <= MAX_CHECKPOINTS
        or not all(isinstance(one, list) for one in lists)
        or not all(type(i) is int and 0 <= i < MAX_CHECKPOINTS for i in indices)
    ):
        raise DecodeError("a progress acknowledgement with bad checkpoint decisions")
    ack = ProgressAck(value["ok"], str(value.get("reason", ""))[:1000], have, *map(tuple, lists))
    if "weights_sha256" not in value:
        return ack
    weights, update, grant = (
        value.get(k) for k in ("weights_sha256", "update_sha256", "weights_grant")
    )
    require(isinstance(weights, str), "ProgressAck.weights_sha256", "must be a string")
    require_sha256(weights, "ProgressAck.weights_sha256")
    require(isinstance(update, str), "ProgressAck.update_sha256", "must be a string")
    require_sha256(update, "ProgressAck.update_sha256", allow_empty=True)
    require(
        isinstance(grant, bytes) and 0 < len(grant) <= MAX_ACK_GRANT_BYTES,
        "ProgressAck.weights_grant",
        f"must be 1..{MAX_ACK_GRANT_BYTES} bytes",
    )
    return dataclasses.replace(
        ack, weights_sha256=weights, update_sha256=update, weights_grant=grant
    )


def decode_ack(data: bytes) -> tuple[bool, str]:
    value = decode(data, Limits(max_bytes=4096, max_depth=1, max_container_len=4))
    if not isinstance(value, dict) or not isinstance(value.get("ok"), bool):
        raise DecodeError("not a progress acknowledgement")
    return value["ok"], str(value.get("reason", ""))[:1000]
