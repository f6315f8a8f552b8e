"""The running node: wires identity, capacity, host, gossip, discovery and HTTP.

`run_node` owns shutdown. SIGINT/SIGTERM stop the HTTP thread, close libp2p (its
listener included) and SQLite, within a few seconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import trio

from ledger.audit import AuditLog
from ledger.chain import Ledger
from node import __version__
from node.capacity import LocalCapacity, local_capacity
from node.config import Settings
from node.identity import Identity, load_or_create_api_token
from node.metrics import NodeMetrics
from node.net.bridge import EventFeed, HttpServerThread, TrioBridge
from node.net.discovery import keep_connected
from node.net.evidence_gossip import EvidenceGossip
from node.net.gossip import CapacityGossip
from node.net.host import MeshHost
from node.net.nat import keep_reachable
from node.net.peers import PeerTable
from node.net.receipts_gossip import ReceiptGossip
from node.net.relay import RelayOptions
from node.store import lock_data_dir, next_counter, open_node_db
from node.web.api import WriteGuard, make_app
from node.web.events import NodeEvents, PublishingLedger, event_routes, watch_peers
from node.web.jobs_api import job_routes
from node.web.ledger_api import ledger_routes
from node.web.pages import PageSources, page_routes
from node.work.blobs import BlobStore
from node.work.context import WorkContext
from node.work.jobs import JobStore
from node.work.service import SubmitError, WorkService
from node.work.unit_keys import UnitKeys
from protocol import CapacityAd, Policy, ProtocolError, seal
from protocol.capacity import MAX_ADDRS
from protocol.schema import to_plain

log = logging.getLogger(__name__)

HAND_BACK_S = 3.0  # at shutdown, how long running units have to reach their owners


POLICY_FIELDS = ("accepting", "load_limit_pct", "max_job_hours", "max_gpu_memory_share")


class PolicyError(ValueError):
    """A policy change was refused; the message names the field."""


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
        self.sandbox: dict[str, str] = {}  # isolation mechanism -> "on ..." or why not
        self.gossip: CapacityGossip | None = None
        self.work: WorkService | None = None
        self.events: NodeEvents | None = None

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
            determinism=self.capacity.determinism,
            reachability=self.host.reachability.now.state,
            relay=self.host.relaying,
        )

    def signed_ad(self) -> bytes:
        """A fresh ad with the next persistent sequence number, sealed."""
        return seal(self.ad(next_counter(self.db, "ad_seq")), self.identity.signing_key)

    def status(self) -> dict[str, Any]:
        ad = to_plain(self.ad())
        keys = ("gpus", "tflops", "torch_version", "cuda_version", "determinism")
        capacity = {k: ad[k] for k in keys}
        return {
            "peer_id": self.identity.peer_id,
            "addrs": self.host.addrs(),
            "capacity": capacity,
            "policy": ad["policy"],
            "load": self.load_pct,
            "peers": len(self.peer_table),
            "connections": len(self.host.connected_peers()),
            "uptime_s": round(time.time() - self.started, 3),
            "sandbox": self.sandbox,
            "version": __version__,
            "reachability": self.reachability(),
            "ports": {
                "listen": self.settings.listen,
                "http": self.settings.http,
                "data": self.work.ctx.data_port if self.work is not None else 0,
            },
        }

    def reachability(self) -> dict[str, Any]:
        """Whether peers can dial us, how that was learned, and our relay slots."""
        now = self.host.reachability.now
        return {
            "state": now.state,
            "how": now.how,
            "checked_at": now.checked_at,
            "answers": now.answers,
            "relayed_through": sorted(self.host.relay.reservations),
            "relaying": self.host.relaying,
            "observed_addrs": self.host.observed_addrs(),
        }

    def peers(self) -> list[dict[str, Any]]:
        """The peer table, each with how we are connected to it now (`path`)."""
        return [
            {**entry.to_json(), "path": self.host.path_to(entry.ad.peer_id)}
            for entry in self.peer_table.entries()
        ]

    def reputation(self) -> list[dict[str, Any]]:
        """What this node has seen of each peer's results (`node.work.reputation`)."""
        return self.work.owner.reputation.all() if self.work is not None else []

    def metrics(self) -> bytes:
        self.node_metrics.uptime.set(time.time() - self.started)
        self.node_metrics.connections.set(len(self.host.connected_peers()))
        self.node_metrics.peers.set(len(self.peer_table))
        return self.node_metrics.render()

    def set_policy(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the policy at runtime (pause/resume, limits); the next ad says so.

        `running`: "finish" (default) lets a running unit complete; "hand_back" stops
        it and returns it to its owner, who re-offers it elsewhere.
        """
        changes = dict(changes)
        running = changes.pop("running", "finish")
        if running not in ("finish", "hand_back"):
            raise PolicyError("'running' must be 'finish' or 'hand_back'")
        fields = {f: type(getattr(self.policy, f)) for f in POLICY_FIELDS}
        for key, value in changes.items():
            if key not in fields:
                raise PolicyError(f"unknown policy field {key!r}; known: {', '.join(fields)}")
            expected = fields[key]
            ok = (
                isinstance(value, bool)
                if expected is bool
                else (isinstance(value, int | float) and not isinstance(value, bool))
            )
            if not ok:
                raise PolicyError(f"policy field {key!r} must be {expected.__name__}")
        policy = replace(self.policy, **{k: fields[k](v) for k, v in changes.items()})
        try:
            policy.check("policy")
        except ProtocolError as exc:
            raise PolicyError(str(exc)) from exc
        self.policy = policy
        log.info("policy changed: %s", to_plain(policy))
        if self.work is not None and self.work.worker is not None and not policy.accepting:
            self.work.worker.stop_current(hand_back=running == "hand_back")
        self._ad_changed()
        return to_plain(policy)

    def set_load(self, load_pct: int) -> None:
        self.load_pct = load_pct
        self._ad_changed()

    def _ad_changed(self) -> None:
        if self.gossip is not None:
            self.gossip.changed()
        if self.events is not None:
            self.events.status(self.load_pct, to_plain(self.policy), self.capacity.tflops)

    async def refresh_capacity(self) -> dict[str, Any]:
        """Re-run the throughput benchmark and advertise the new figure."""
        self.capacity = await trio.to_thread.run_sync(local_capacity, self.data_dir, True)
        log.info("capacity refreshed: %.3f TFLOP/s", self.capacity.tflops)
        self._ad_changed()
        return self.status()["capacity"]


class Stores(NamedTuple):
    db: Any  # node.db (sqlite-utils)
    ledger: Ledger
    audit: AuditLog


async def run_node(
    settings: Settings,
    identity: Identity,
    data_dir: Path,
    *,
    rebenchmark: bool = False,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until SIGINT/SIGTERM (or cancellation)."""
    lock = lock_data_dir(data_dir)
    with lock, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        capacity = await trio.to_thread.run_sync(local_capacity, data_dir, rebenchmark)
        token = load_or_create_api_token(data_dir)
        db = open_node_db(data_dir)
        ledger = Ledger.open(data_dir, identity.signing_key)
        audit = AuditLog.open(data_dir)
        try:
            await _serve(
                settings,
                identity,
                data_dir,
                capacity,
                Stores(db, ledger, audit),
                token,
                signals,
                task_status,
            )
        finally:
            for store in (audit, ledger, db):
                store.close()
    log.info("node stopped")


async def _serve(
    settings: Settings,
    identity: Identity,
    data_dir: Path,
    capacity: LocalCapacity,
    stores: Stores,
    token: str,
    signals: Any,
    task_status: Any,
) -> None:
    db, ledger, audit = stores
    metrics = NodeMetrics()
    peers = PeerTable(db, settings.ttl_s)
    http_host, _, http_port = settings.http.rpartition(":")
    relay = RelayOptions(
        serve=settings.relay and settings.reachability != "private",
        max_reservations=settings.relay_max_reservations,
        max_circuits=settings.relay_max_circuits,
        circuit_bytes=settings.relay_circuit_mb << 20,
        circuit_s=settings.relay_circuit_s,
    )
    async with MeshHost.start(
        identity,
        settings.listen,
        gossip_rate_limit=settings.gossip_rate_limit,
        mdns=settings.mdns,
        relay=relay,
        reachability=settings.reachability,
    ) as host:
        node = Node(settings, identity, data_dir, capacity, host, peers, db, metrics)
        node.sandbox = await probe_isolation()
        feed = EventFeed()
        node.events = events = NodeEvents(feed)
        node.gossip = CapacityGossip(
            host, peers, metrics, node.signed_ad, settings.publish_interval_s
        )
        receipts = ReceiptGossip(host, audit, metrics)
        evidence = EvidenceGossip(
            host, lambda found: work.owner.reputation.reported(found.worker, found.reason)
        )
        async with trio.open_nursery() as nursery:
            node.work = work = WorkService(
                WorkContext(
                    identity=identity,
                    host=host,
                    peers=peers,
                    jobs=JobStore(db, on_change=events.job),
                    blobs=BlobStore(data_dir),
                    data_dir=data_dir,
                    own_ad=node.ad,
                    policy=lambda: node.policy,
                    allow_owners=settings.allow_owners,
                    deny_owners=settings.deny_owners,
                    ledger=PublishingLedger(ledger, events),  # type: ignore[arg-type]
                    publish_receipt=receipts.publish,
                    publish_evidence=evidence.publish,
                    lease_s=settings.lease_s,
                    unit_keys=UnitKeys(db, identity.seed),
                    max_units=settings.max_units,
                    max_unit_download_bytes=settings.max_unit_download_mb << 20,
                    unit_disk_quota_bytes=settings.unit_disk_quota_mb << 20,
                    unit_files_keep_s=settings.unit_files_keep_hours * 3600,
                    on_load=node.set_load,
                ),
                memory_limit_mb=_memory_limit_mb(),
            )
            bridge = TrioBridge(trio.lowlevel.current_trio_token(), nursery)
            guard = WriteGuard(token, http_host)
            routes = job_routes(
                work, bridge, guard, data_dir / "uploads", settings.max_upload_mb << 20, SubmitError
            )
            pages = PageSources(node, work, ledger, audit, bridge, guard.open)
            app = make_app(
                node,
                bridge,
                guard,
                [
                    routes,
                    ledger_routes(ledger, audit),
                    event_routes(feed, identity.peer_id),
                    page_routes(pages),
                ],
            )
            http = HttpServerThread(app, http_host, int(http_port))
            await trio.to_thread.run_sync(http.start)
            try:
                await node.gossip.start()
                await receipts.start()
                await evidence.start()
                nursery.start_soon(node.gossip.run)
                nursery.start_soon(receipts.run)
                nursery.start_soon(evidence.run)
                nursery.start_soon(work.run)
                nursery.start_soon(watch_peers, peers, events)
                nursery.start_soon(keep_connected, host, settings.bootstrap, settings.target_peers)
                nursery.start_soon(
                    keep_reachable, host, settings.bootstrap, peers.relays, node.gossip.changed
                )
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
                if work.worker is not None:
                    await work.worker.hand_back_all(HAND_BACK_S)
            finally:
                await trio.to_thread.run_sync(http.stop)
                nursery.cancel_scope.cancel()


async def probe_isolation() -> dict[str, str]:
    """Which isolation a training subprocess gets here (`training.isolation`), measured
    once at start in a throwaway child."""
    done = await trio.run_process(
        [sys.executable, "-m", "training.isolation"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {
            "isolation": f"off: the probe failed ({done.stderr[-300:].decode(errors='replace')})"
        }
    for name, state in report.items():
        (log.info if state.startswith("on") else log.warning)("sandbox %s: %s", name, state)
    return report


def _memory_limit_mb() -> int:
    """Half this machine's memory for a training subprocess (0 when unknown)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    return int(pages * page_size / 2 / 2**20)
