"""`CapacityAd`: what a node offers the network, gossiped on `meshminer/capacity/1`.

Ads are small on purpose: py-libp2p's GossipSub costs ~9 ms of CPU per delivered
message per node, and every byte is relayed by every peer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from protocol.checks import require
from protocol.codec import Limits

#: a typical ad is ~420 bytes; the largest valid one (16 GPUs, 16 addresses) ~3.5 KB
AD_LIMITS = Limits(
    max_bytes=6144, max_depth=5, max_container_len=32, max_str_len=256, max_bin_len=6144
)

MAX_ADDRS = 16
MAX_GPUS = 16
MAX_LABEL = 40
# a volunteer's name or team: letters (any script), digits, spaces and a little
# punctuation; nothing a page could read as markup, no control characters
_LABEL = re.compile(r"[\w .,+#@()-]*")


def check_label(text: str, path: str) -> None:
    """A name or team shown beside a peer id: at most `MAX_LABEL` characters of plain
    text, no markup, no control or invisible characters, no surrounding spaces."""
    require(len(text) <= MAX_LABEL, path, f"must be at most {MAX_LABEL} characters")
    require(
        _LABEL.fullmatch(text) is not None and text == text.strip(),
        path,
        "must be plain text: letters, digits, spaces and . , + # @ ( ) - only",
    )


def _finite_nonneg(value: float) -> bool:
    return math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class GpuInfo:
    """One accelerator (or, on a CPU-only node, the CPU: ``kind = "cpu"``)."""

    name: str
    kind: str = "cuda"  # "cuda" | "cpu"
    memory_total_mb: int = 0
    memory_free_mb: int = 0
    compute_capability: str = ""

    def check(self, path: str) -> None:
        require(self.kind in ("cuda", "cpu"), f"{path}.kind", "must be 'cuda' or 'cpu'")
        require(self.memory_total_mb >= 0, f"{path}.memory_total_mb", "must be >= 0")
        require(
            0 <= self.memory_free_mb <= max(self.memory_total_mb, 0),
            f"{path}.memory_free_mb",
            "must be between 0 and memory_total_mb",
        )


@dataclass(frozen=True)
class Policy:
    """The node owner's terms for accepting work."""

    accepting: bool = True
    load_limit_pct: int = 100
    max_job_hours: float = 24.0
    max_gpu_memory_share: float = 0.9

    def check(self, path: str) -> None:
        require(0 <= self.load_limit_pct <= 100, f"{path}.load_limit_pct", "must be 0..100")
        require(
            _finite_nonneg(self.max_job_hours) and self.max_job_hours > 0,
            f"{path}.max_job_hours",
            "must be > 0",
        )
        require(
            0 < self.max_gpu_memory_share <= 1,
            f"{path}.max_gpu_memory_share",
            "must be in (0, 1]",
        )


@dataclass(frozen=True)
class CapacityAd:
    TYPE: ClassVar[str] = "capacity_ad"
    VERSION: ClassVar[int] = 1

    peer_id: str
    addrs: list[str]
    gpus: list[GpuInfo]
    tflops: float
    torch_version: str
    cuda_version: str  # "" when torch has no CUDA
    policy: Policy
    load_pct: int
    seq: int
    timestamp: float  # unix seconds
    version: str = ""  # meshminer version of the advertising node
    determinism: str = ""  # the node's determinism class (node.machine.capacity.determinism_class)
    reachability: str = ""  # "public" | "private" | "unknown" (node.net.reachability)
    relay: bool = False  # it relays circuits for peers behind NATs (node.net.relay)
    paused: str = ""  # why it trains nothing now, by its volunteer's preferences ("": it does)
    directory: bool = False  # it keeps volunteers' registered ads for owners (node.net.discovery)
    name: str = ""  # its volunteer's name, as they chose it (`check_label`: plain text)
    team: str = ""  # and their team's

    def check(self, path: str) -> None:
        require(0 < len(self.peer_id) <= 128, f"{path}.peer_id", "must be 1..128 chars")
        require(len(self.addrs) <= MAX_ADDRS, f"{path}.addrs", f"has more than {MAX_ADDRS}")
        require(len(self.gpus) <= MAX_GPUS, f"{path}.gpus", f"has more than {MAX_GPUS}")
        require(_finite_nonneg(self.tflops), f"{path}.tflops", "must be a finite number >= 0")
        require(0 <= self.load_pct <= 100, f"{path}.load_pct", "must be 0..100")
        require(self.seq >= 0, f"{path}.seq", "must be >= 0")
        require(len(self.determinism) <= 200, f"{path}.determinism", "must be <= 200 chars")
        require(len(self.paused) <= 200, f"{path}.paused", "must be <= 200 chars")
        check_label(self.name, f"{path}.name")
        check_label(self.team, f"{path}.team")
        require(
            self.reachability in ("", "public", "private", "unknown"),
            f"{path}.reachability",
            "must be public, private or unknown",
        )
        require(
            math.isfinite(self.timestamp) and self.timestamp > 0,
            f"{path}.timestamp",
            "must be a positive unix time",
        )
