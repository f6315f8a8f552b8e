"""`Evidence`: an owner's signed record that a worker's result failed a spot check.

It carries the worker's own signed `Result` (its commitment to a checkpoint chain),
the segment the owner replayed and the hash the replay gave. Anyone can check both
signatures and that the disputed hash is the one the worker committed to; replaying
the segment needs the job's spec and data, which only the owner and its workers hold.
Gossiped on `meshminer/evidence/1` and kept in the owner's ledger as `invalidated`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from protocol.checks import require, require_sha256
from protocol.codec import Limits
from protocol.envelope import open_envelope
from protocol.ids import check_id, check_peer
from protocol.work import WORK_LIMITS, Result

EVIDENCE_LIMITS = Limits(
    max_bytes=WORK_LIMITS.max_bytes + 8 * 1024,
    max_depth=2,
    max_container_len=16,
    max_str_len=4096,
    max_bin_len=WORK_LIMITS.max_bytes,
)


@dataclass(frozen=True)
class Evidence:
    TYPE: ClassVar[str] = "evidence"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    owner: str  # who replayed, and signs this
    worker: str  # whose result failed
    result: bytes  # the worker's signed Result envelope
    index: int  # the checkpoint that failed: result.checkpoints[index] (-1: the weights)
    start_step: int  # the replayed segment: start_step .. end_step
    end_step: int
    replayed_sha256: str  # what the owner's replay gave for that checkpoint
    reason: str
    created_at: float

    def check(self, path: str) -> None:
        check_id(self.job_id, f"{path}.job_id")
        check_id(self.unit_id, f"{path}.unit_id")
        check_peer(self.owner, f"{path}.owner")
        check_peer(self.worker, f"{path}.worker")
        require(self.owner != self.worker, f"{path}.worker", "must not be the owner")
        require(-1 <= self.index <= 1000, f"{path}.index", "must be -1..1000")
        require(0 <= self.start_step <= self.end_step, f"{path}.end_step", "must be >= start")
        require_sha256(self.replayed_sha256, f"{path}.replayed_sha256")
        require(len(self.reason) <= 2000, f"{path}.reason", "must be <= 2000 chars")
        require(math.isfinite(self.created_at), f"{path}.created_at", "must be finite")


def claimed_result(evidence: Evidence) -> Result:
    """The worker's signed result inside `evidence`, checked to be the worker's and to
    commit to something other than what the replay gave. Raises `ProtocolError`."""
    result = open_envelope(
        evidence.result, Result, expected_signer=evidence.worker, limits=WORK_LIMITS
    ).message
    require(
        (result.job_id, result.unit_id) == (evidence.job_id, evidence.unit_id),
        "evidence.result",
        "is for another unit",
    )
    if evidence.index == -1:
        claimed = result.weights_sha256
    else:
        require(evidence.index < len(result.checkpoints), "evidence.index", "is out of range")
        claimed = result.checkpoints[evidence.index]
    require(claimed != evidence.replayed_sha256, "evidence", "shows no disagreement")
    return result
