"""The running node: wires identity, capacity, host, gossip, discovery and HTTP.

`run_node` owns shutdown. SIGINT/SIGTERM stop the HTTP thread, close libp2p (its
listener included) and SQLite, within a few seconds.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

import trio

from node import __version__
from node.capacity import LocalCapacity, local_capacity
from node.config import Settings
from node.identity import Identity, load_or_create_api_token
from node.metrics import NodeMetrics
from node.net.bridge import HttpServerThread, TrioBridge
from node.net.discovery import keep_connected
from node.net.gossip import CapacityGossip
from node.net.host import MeshHost
from node.net.peers import PeerTable
from node.store import next_counter, open_node_db
from node.web.api import make_app
from protocol import CapacityAd, Policy, seal
from protocol.capacity import MAX_ADDRS
from protocol.schema import to_plain

log = logging.getLogger(__name__)


class Node:
    """Node state, owned by the trio thread (the HTTP API reaches it via the bridge)."""

    def __init__(
        self,
        settings: Settings,
        identity: Identity,
        data_dir: Path,
        capacity: LocalCapacity,
        host: MeshHost,
        peers: PeerTable,
        db: Any,
        metrics: NodeMetrics,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.data_dir = data_dir
        self.capacity = capacity
        self.host = host
        self.peer_table = peers
        self.db = db
        self.node_metrics = metrics
        self.policy = Policy(
            accepting=settings.accepting,
            load_limit_pct=settings.load_limit_pct,
            max_job_hours=settings.max_job_hours,
            max_gpu_memory_share=settings.max_gpu_memory_share,
        )
        self.load_pct = 0
        self.started = time.time()
        self.gossip: CapacityGossip | None = None

    def ad(self, seq: int = 0) -> CapacityAd:
        return CapacityAd(
            peer_id=self.identity.peer_id,
            addrs=self.host.addrs()[:MAX_ADDRS],
            gpus=self.capacity.gpus,
            tflops=self.capacity.tflops,
            torch_version=self.capacity.torch_version,
            cuda_version=self.capacity.cuda_version,
            policy=self.policy,
            load_pct=self.load_pct,
            seq=seq,
            timestamp=time.time(),
            version=__version__,
        )

    def signed_ad(self) -> bytes:
        """A fresh ad with the next persistent sequence number, sealed."""
        return seal(self.ad(next_counter(self.db, "ad_seq")), self.identity.signing_key)

    def status(self) -> dict[str, Any]:
        ad = to_plain(self.ad())
        capacity = {k: ad[k] for k in ("gpus", "tflops", "torch_version", "cuda_version")}
        return {
            "peer_id": self.identity.peer_id,
            "addrs": self.host.addrs(),
            "capacity": capacity,
            "policy": ad["policy"],
            "load": self.load_pct,
            "peers": len(self.peer_table),
            "connections": len(self.host.connected_peers()),
            "uptime_s": round(time.time() - self.started, 3),
            "version": __version__,
        }

    def peers(self) -> list[dict[str, Any]]:
        return [entry.to_json() for entry in self.peer_table.entries()]

    def metrics(self) -> bytes:
        self.node_metrics.uptime.set(time.time() - self.started)
        self.node_metrics.connections.set(len(self.host.connected_peers()))
        self.node_metrics.peers.set(len(self.peer_table))
        return self.node_metrics.render()

    async def refresh_capacity(self) -> dict[str, Any]:
        """Re-run the throughput benchmark and advertise the new figure."""
        self.capacity = await trio.to_thread.run_sync(local_capacity, self.data_dir, True)
        log.info("capacity refreshed: %.3f TFLOP/s", self.capacity.tflops)
        if self.gossip is not None:
            self.gossip.changed()
        return self.status()["capacity"]


async def run_node(
    settings: Settings,
    identity: Identity,
    data_dir: Path,
    *,
    rebenchmark: bool = False,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until SIGINT/SIGTERM (or cancellation)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        capacity = await trio.to_thread.run_sync(local_capacity, data_dir, rebenchmark)
        token = load_or_create_api_token(data_dir)
        db = open_node_db(data_dir)
        try:
            await _serve(settings, identity, data_dir, capacity, db, token, signals, task_status)
        finally:
            db.close()
    log.info("node stopped")


async def _serve(
    settings: Settings,
    identity: Identity,
    data_dir: Path,
    capacity: LocalCapacity,
    db: Any,
    token: str,
    signals: Any,
    task_status: Any,
) -> None:
    metrics = NodeMetrics()
    peers = PeerTable(db, settings.ttl_s)
    http_host, _, http_port = settings.http.rpartition(":")
    async with MeshHost.start(
        identity, settings.listen, gossip_rate_limit=settings.gossip_rate_limit, mdns=settings.mdns
    ) as host:
        node = Node(settings, identity, data_dir, capacity, host, peers, db, metrics)
        node.gossip = CapacityGossip(
            host, peers, metrics, node.signed_ad, settings.publish_interval_s
        )
        async with trio.open_nursery() as nursery:
            bridge = TrioBridge(trio.lowlevel.current_trio_token(), nursery)
            app = make_app(node, bridge, token=token, bind_host=http_host)
            http = HttpServerThread(app, http_host, int(http_port))
            await trio.to_thread.run_sync(http.start)
            try:
                await node.gossip.start()
                nursery.start_soon(node.gossip.run)
                nursery.start_soon(keep_connected, host, settings.bootstrap, settings.target_peers)
                log.info(
                    "node %s up: libp2p %s, API http://%s",
                    identity.peer_id,
                    " ".join(host.addrs()),
                    settings.http,
                )
                task_status.started(node)
                async for signum in signals:
                    log.info("received %s, shutting down", signal.Signals(signum).name)
                    break
            finally:
                await trio.to_thread.run_sync(http.stop)
                nursery.cancel_scope.cancel()
