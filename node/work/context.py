"""What the owner and worker roles share: the node's identity, network and stores."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledger.chain import Ledger
from node.identity import Identity
from node.net.host import MeshHost
from node.net.peers import PeerTable

if TYPE_CHECKING:
    from node.net.finder import PeerFinder
from node.net.relay import PATH_WORDS
from node.preferences import Preferences
from node.work.blobs import BlobStore, DailyBytes, RateCap, mbit_s
from node.work.jobs import JobStore, UnitKeys
from node.work.run import RunnerRequest, run_training, warm_runners
from protocol import CapacityAd, Policy

_UNIT_ID = re.compile(r"[0-9a-f]{16,32}")


@dataclass(frozen=True)
class WorkLimits:
    """The volunteer's bounds on work, from its settings (`node.settings`)."""

    lease_s: float = 15.0  # a remote unit lives this long past its last heartbeat
    max_units: int = 1  # units this node trains at once (its own and peers')
    max_unit_download_bytes: int = 16 << 30  # what one unit's grant may make it fetch
    unit_disk_quota_bytes: int = 10 << 30  # what one unit may write into its folder
    unit_files_keep_s: float = 24 * 3600.0  # how long a finished unit's folder stays
    # a unit's evidence under this is kept whole; over it, `trust.commitments.MAX_HELD`
    evidence_floor_bytes: int = 64 << 20


@dataclass
class WorkContext:
    identity: Identity
    host: MeshHost
    peers: PeerTable
    jobs: JobStore
    blobs: BlobStore
    data_dir: Path
    own_ad: Callable[[], CapacityAd]
    policy: Callable[[], Policy]
    preferences: Callable[[], Preferences]
    ledger: Ledger
    publish_receipt: Callable[[bytes], Awaitable[None]]  # gossip a co-signed receipt
    publish_evidence: Callable[[bytes], Awaitable[None]]  # gossip a failed spot check
    credit_for: Callable[[dict, Path | None], float] | None = None  # TFLOP, from the spec
    limits: WorkLimits = field(default_factory=lambda: WorkLimits())
    data_port: int = 0  # the direct blob channel's port (0: libp2p streams only)
    # (job_id, unit_id) -> secretstream key for the blobs this node serves under a grant.
    # Read by the blob server's thread: entries are only ever set or deleted whole.
    grant_keys: dict[tuple[str, str], bytes] = field(default_factory=dict)
    unit_keys: UnitKeys | None = None  # the owner's keys, sealed in node.db for restarts

    finder: PeerFinder | None = None  # candidates from directories, probes before offers
    on_load: Callable[[int], None] = lambda load_pct: None  # advertise the new load
    # why this node may not train now ("" when it may): node.work.run.availability
    paused_because: Callable[[], str] = lambda: ""
    unit_pids: set[int] = field(default_factory=set)  # runners of units, running now
    runner_pids: set[int] = field(default_factory=set)  # the other runners (checks, outer steps)
    # units training on this machine (a peer's, or the owner's own): one at a time
    units_here: set[str] = field(default_factory=set)
    # the volunteer's caps on blob transfer rates, each shared by every transfer at once
    download_cap: RateCap = field(init=False)
    upload_cap: RateCap = field(init=False)
    transferred: DailyBytes = field(init=False)  # both ways, per day: daily_transfer_gb

    def __post_init__(self) -> None:
        self.transferred = DailyBytes(self.jobs.db)
        self.download_cap = RateCap(
            lambda: mbit_s(self.preferences().max_download_mbit_s), meter=self.transferred
        )
        self.upload_cap = RateCap(
            lambda: mbit_s(self.preferences().max_upload_mbit_s), meter=self.transferred
        )

    def transfer_cap_used(self) -> str:
        """Why this node moves no more job data today ("" while it may)."""
        cap_gb = self.preferences().daily_transfer_gb
        if cap_gb and self.transferred.today() >= cap_gb * 2**30:
            return f"today's {cap_gb:g} GB of job data transfer are used"
        return ""

    def claim(self, unit_id: str) -> None:
        self.units_here.add(unit_id)
        self.on_load(self.load_pct())

    def release(self, unit_id: str) -> None:
        self.units_here.discard(unit_id)
        self.on_load(self.load_pct())

    async def train_unit(
        self,
        request: RunnerRequest,
        unit_id: str,
        max_hours: float,
        on_event: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Train a unit (a job's training, a peer's or our own) here: paused while the
        volunteer's preferences say so (`duty_cycle`), and counted towards the day's
        training hours (`unit_pids`). See `_run` for the rest."""
        return await self._run(
            request, unit_id, max_hours, on_event, lambda: self.duty_cycle(request), self.unit_pids
        )

    async def run_owner_task(
        self,
        request: RunnerRequest,
        task_id: str,
        max_hours: float,
        on_event: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Run one of the owner's short tasks here (a spot check's replay, an elastic
        job's first or outer step): only under the load limit, never paused by the
        volunteer's preferences, so that jobs waiting on this node keep moving."""
        return await self._run(
            request, task_id, max_hours, on_event, self.load_limit, self.runner_pids
        )

    async def _run(
        self,
        request: RunnerRequest,
        unit_id: str,
        max_hours: float,
        on_event: Callable[[dict[str, Any]], None],
        duty_cycle: Callable[[], float],
        pids: set[int],
    ) -> dict[str, Any]:
        """Run one training subprocess in `unit_id`'s folder, under `duty_cycle` and
        this node's disk quota (`executor.run_training`), forked from the node's fork
        server (`training.run.forkserver`), which stays for the tasks that follow; `pids`
        holds the runner's pid while it runs."""
        return await run_training(
            request,
            self.unit_dir(unit_id),
            max_hours * 3600,
            on_event,
            duty_cycle=duty_cycle,
            disk_quota_bytes=self.limits.unit_disk_quota_bytes,
            warm_dir=self.runners_dir,
            pids=pids,
        )

    @property
    def runners_dir(self) -> Path:
        return self.data_dir / "runners"

    async def warm_runners(self) -> None:
        """Have the runner's imports under way while a unit's blobs are fetched: the
        fork server starts now, not at the unit's first runner (2-4 s of CPU saved on a
        worker's first unit after an idle spell)."""
        await warm_runners(self.runners_dir)

    def load_limit(self) -> float:
        """The share of the time (%) a runner may train: the volunteer's load limit."""
        return max(1.0, float(self.policy().load_limit_pct))

    def duty_cycle(self, request: RunnerRequest | None = None) -> float:
        """A unit's share of the time (%): the load limit, and for a unit that trains
        on this node's GPU (`request`) the volunteer's cap per GPU too; 0 while the
        volunteer's preferences pause training."""
        if self.paused_because():
            return 0.0
        share = self.load_limit()
        if request is not None and request.device != "cpu" and self.own_ad().gpus:
            share = min(share, float(self.preferences().max_gpu_pct))
        return share

    def load_pct(self) -> int:
        return min(100, round(100 * len(self.units_here) / max(1, self.limits.max_units)))

    def has_room(self) -> bool:
        return len(self.units_here) < self.limits.max_units

    def remember_unit_key(self, job_id: str, unit_id: str, key: bytes) -> None:
        self.grant_keys[(job_id, unit_id)] = key
        if self.unit_keys is not None:
            self.unit_keys.remember(job_id, unit_id, key)

    def forget_unit_key(self, job_id: str, unit_id: str) -> None:
        self.grant_keys.pop((job_id, unit_id), None)
        if self.unit_keys is not None:
            self.unit_keys.forget(unit_id)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def unit_dir(self, unit_id: str) -> Path:
        """A unit's folder. Ids reach here checked by `protocol`; this refuses anything
        else again, since no path is ever built from a string a peer chose freely."""
        if not _UNIT_ID.fullmatch(unit_id):
            raise ValueError(f"not a unit id: {unit_id[:80]!r}")
        return self.data_dir / "units" / unit_id

    def path_to(self, peer_id: str) -> str:
        """How this node reaches `peer_id` now, for the job's timeline."""
        return PATH_WORDS[self.host.path_to(peer_id)]

    def peer_ip(self, peer_id: str) -> str | None:
        """An IPv4 address the peer advertises, for the direct blob channel."""
        entry = self.peers.get(peer_id)
        for addr in entry.ad.addrs if entry else []:
            parts = addr.split("/")
            if len(parts) > 2 and parts[1] == "ip4":
                return parts[2]
        return None
