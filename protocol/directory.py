"""Directory messages: volunteers register their capacity ad with a few directory
nodes, and owners ask a directory for peers that fit a job.

In a large network nobody gossips every ad (each delivered ad costs every node ~11 ms
of CPU); a volunteer instead hands its signed `CapacityAd` to `directory_peers`
directories on `/meshminer/directory/register/1` and an owner asks one or two of them
on `/meshminer/directory/query/1`; any node may ask one for its audit of the network's
credit on `/meshminer/directory/credit/1`. Every ad a directory returns is the volunteer's own
signed envelope, so a directory can hide peers but never invent or alter one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from protocol.capacity import AD_LIMITS, check_label
from protocol.checks import require
from protocol.codec import Limits
from protocol.ids import check_peer

MAX_WANT = 64  # ads one query may ask for
MAX_SEED = 32  # bytes of a query's seed
GPU_WISHES = ("preferred", "required", "none")

#: a reply holds up to MAX_WANT ads, each a nested envelope of <= AD_LIMITS.max_bytes
DIRECTORY_LIMITS = Limits(
    max_bytes=MAX_WANT * (AD_LIMITS.max_bytes + 16) + 4096,
    max_depth=4,
    max_container_len=MAX_WANT,
    max_str_len=256,
    max_bin_len=MAX_WANT * (AD_LIMITS.max_bytes + 16) + 1024,
)


@dataclass(frozen=True)
class DirectoryQuery:
    """Owner -> directory: up to `want` registered peers that could take a job now."""

    TYPE: ClassVar[str] = "directory_query"
    VERSION: ClassVar[int] = 1

    want: int
    gpu: str = "preferred"  # the job's requirements.gpu
    min_gpu_memory_gb: float = 0.0
    max_hours: float = 1.0
    timestamp: float = 0.0
    # the answer's order: registrants by sha256(seed + peer id) (b"": the directory
    # draws one); random from an owner, ground by a volunteer checking its listing
    seed: bytes = b""

    def check(self, path: str) -> None:
        require(1 <= self.want <= MAX_WANT, f"{path}.want", f"must be 1..{MAX_WANT}")
        require(len(self.seed) <= MAX_SEED, f"{path}.seed", f"has more than {MAX_SEED} bytes")
        require(self.gpu in GPU_WISHES, f"{path}.gpu", f"must be one of {GPU_WISHES}")
        require(
            0 <= self.min_gpu_memory_gb <= 10**6, f"{path}.min_gpu_memory_gb", "must be 0..10^6"
        )
        require(0 < self.max_hours <= 24 * 365, f"{path}.max_hours", "must be in (0, 8760]")

    def requirements(self) -> dict[str, object]:
        """The job-spec `requirements` this query stands for (scheduler.unfit_reason)."""
        return {
            "gpu": self.gpu,
            "min_gpu_memory_gb": self.min_gpu_memory_gb,
            "max_hours": self.max_hours,
        }


@dataclass(frozen=True)
class DirectoryReply:
    """Directory -> peer, for a registration and for a query alike."""

    TYPE: ClassVar[str] = "directory_reply"
    VERSION: ClassVar[int] = 1

    registered: int  # peers the directory holds now: how large the network is, seen from here
    ttl_s: float  # how long a registration lasts without a refresh
    ads: list[bytes] = field(default_factory=list)  # query: signed CapacityAd envelopes

    def check(self, path: str) -> None:
        require(self.registered >= 0, f"{path}.registered", "must be >= 0")
        require(0 < self.ttl_s <= 86400, f"{path}.ttl_s", "must be in (0, 86400]")
        require(len(self.ads) <= MAX_WANT, f"{path}.ads", f"has more than {MAX_WANT}")
        for i, ad in enumerate(self.ads):
            require(len(ad) <= AD_LIMITS.max_bytes, f"{path}.ads[{i}]", "is too large")


MAX_CREDIT_ROWS = 200  # peers one credit reply may list

#: a reply of MAX_CREDIT_ROWS rows, each a peer id, five numbers and two labels
CREDIT_LIMITS = Limits(
    max_bytes=MAX_CREDIT_ROWS * 320 + 4096,
    max_depth=4,
    max_container_len=MAX_CREDIT_ROWS,
    max_str_len=256,
    max_bin_len=1024,
)


@dataclass(frozen=True)
class CreditQuery:
    """Peer -> directory: the directory's own audit of the network's credit, its top
    `want` workers. A node of a large network audits only its own receipts (they go
    to directories alone), so this is how its Credit page sees the others."""

    TYPE: ClassVar[str] = "credit_query"
    VERSION: ClassVar[int] = 1

    want: int = 100
    timestamp: float = 0.0

    def check(self, path: str) -> None:
        require(1 <= self.want <= MAX_CREDIT_ROWS, f"{path}.want", f"must be 1..{MAX_CREDIT_ROWS}")


@dataclass(frozen=True)
class CreditRow:
    """One worker as the directory audited it (`ledger.audit.AuditLog.network_credit`)."""

    peer_id: str
    credit: float  # TFLOP earned over receipts not in conflict
    rac: float  # recent average credit (a week's half-life)
    units: int
    conflicts: int
    name: str = ""  # from the worker's signed ad, when the directory holds it
    team: str = ""

    def check(self, path: str) -> None:
        check_peer(self.peer_id, f"{path}.peer_id")
        for key in ("credit", "rac"):
            value = getattr(self, key)
            require(math.isfinite(value) and value >= 0, f"{path}.{key}", "must be finite, >= 0")
        for key in ("units", "conflicts"):
            require(0 <= getattr(self, key) <= 2**53, f"{path}.{key}", "must be 0..2^53")
        check_label(self.name, f"{path}.name")
        check_label(self.team, f"{path}.team")


@dataclass(frozen=True)
class CreditReply:
    """Directory -> peer: its workers ranked by credit, and how many receipts its audit
    holds. Signed by the directory: one node's view, shown as that, never merged."""

    TYPE: ClassVar[str] = "credit_reply"
    VERSION: ClassVar[int] = 1

    receipts: int
    rows: list[CreditRow] = field(default_factory=list)
    timestamp: float = 0.0

    def check(self, path: str) -> None:
        require(0 <= self.receipts <= 2**53, f"{path}.receipts", "must be 0..2^53")
        require(len(self.rows) <= MAX_CREDIT_ROWS, f"{path}.rows", "has too many rows")
        for i, row in enumerate(self.rows):
            row.check(f"{path}.rows[{i}]")
        ids = [row.peer_id for row in self.rows]
        require(len(set(ids)) == len(ids), f"{path}.rows", "lists a peer twice")
