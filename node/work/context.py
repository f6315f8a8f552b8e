"""What the owner and worker roles share: the node's identity, network and stores."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ledger.chain import Ledger
from node.identity import Identity
from node.net.host import MeshHost
from node.net.peers import PeerTable
from node.work.blobs import BlobStore
from node.work.jobs import JobStore
from protocol import CapacityAd, Policy


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
    allow_owners: list[str]
    deny_owners: list[str]
    ledger: Ledger
    publish_receipt: Callable[[bytes], Awaitable[None]]  # gossip a co-signed receipt
    credit_for: Callable[[dict, Path | None], float] | None = None  # TFLOP, from the spec
    lease_s: float = 15.0
    data_port: int = 0  # the direct blob channel's port (0: libp2p streams only)
    # (job_id, unit_id) -> secretstream key for the blobs this node serves under a grant.
    # Read by the blob server's thread: entries are only ever set or deleted whole.
    grant_keys: dict[tuple[str, str], bytes] = field(default_factory=dict)

    on_load: Callable[[int], None] = lambda load_pct: None  # advertise the new load
    # units training on this machine (a peer's, or the owner's own): one at a time
    units_here: set[str] = field(default_factory=set)

    def claim(self, unit_id: str) -> None:
        self.units_here.add(unit_id)
        self.on_load(100)

    def release(self, unit_id: str) -> None:
        self.units_here.discard(unit_id)
        if not self.units_here:
            self.on_load(0)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id

    def unit_dir(self, unit_id: str) -> Path:
        return self.data_dir / "units" / unit_id

    def peer_ip(self, peer_id: str) -> str | None:
        """An IPv4 address the peer advertises, for the direct blob channel."""
        entry = self.peers.get(peer_id)
        for addr in entry.ad.addrs if entry else []:
            parts = addr.split("/")
            if len(parts) > 2 and parts[1] == "ip4":
                return parts[2]
        return None
