"""The running node: wires identity, capacity, host, gossip, discovery and HTTP.

`run_node` owns shutdown. SIGINT/SIGTERM hand running units back, stop the HTTP
thread, end the node's tasks (runner subprocesses are killed), close libp2p (its
listener included) and SQLite: each step under its own deadline, the whole within
`SHUTDOWN_S` or the process ends anyway (`node.shutdown`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import trio

from ledger.audit import AuditLog
from ledger.chain import Ledger
from node.identity import Identity, load_or_create_api_token
from node.machine import IdleSensor, LocalCapacity, Sensors, measured_capacity, process_cpu_s
from node.metrics import LoopStalls, NodeMetrics
from node.net.bridge import EventFeed, HttpServerThread, TrioBridge
from node.net.connections import ConnectionLimits, trim_connections
from node.net.discovery import (
    MAX_REGISTRATIONS,
    CapacityGossip,
    CreditServer,
    Directory,
    DirectoryCredit,
    DiscoveryCost,
    Registration,
    keep_connected,
)
from node.net.evidence_gossip import EvidenceGossip
from node.net.finder import PeerFinder
from node.net.host import MeshHost
from node.net.nat import keep_reachable
from node.net.peers import PeerTable
from node.net.receipts_gossip import ReceiptGossip
from node.net.relay import RelayOptions
from node.settings import Settings
from node.shutdown import Shutdown, in_thread
from node.state import Node
from node.store import lock_data_dir, open_node_db
from node.web.api import WriteGuard, make_app
from node.web.credit import audit_figures, credit_routes
from node.web.events import NodeEvents, PublishingLedger, event_routes, watch_peers
from node.web.jobs_api import job_routes
from node.web.ledger_api import ledger_routes
from node.web.pages import PageSources, page_routes
from node.work.blobs import BlobStore
from node.work.context import WorkContext, WorkLimits
from node.work.jobs import JobStore, UnitKeys
from node.work.owner import SubmitError
from node.work.run import Availability, TrainingDays, keep_checking
from node.work.service import WorkService

log = logging.getLogger(__name__)

HAND_BACK_S = 3.0  # at shutdown, how long running units have to reach their owners
HTTP_STOP_S = 3.0  # at shutdown, how long the HTTP thread has to end (its join waits 3 s)
DIRECTORY_CONNECTIONS = MAX_REGISTRATIONS + 1024  # one per registrant, and its own peers


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
    measuring: subprocess.Popen | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until SIGINT/SIGTERM (or cancellation). A signal that arrives while the node
    starts arms the shutdown deadline at once; the stop begins once it is up.
    `measuring`: the capacity measurement already under way (`measure_elsewhere`)."""
    lock = lock_data_dir(data_dir)
    stop = Shutdown()
    with lock, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        # a system task, not a nursery: run_node's own errors reach the CLI unwrapped
        trio.lowlevel.spawn_system_task(stop.watch, signals, name="signals")
        try:
            capacity = await trio.to_thread.run_sync(
                measured_capacity, data_dir, measuring, rebenchmark
            )
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
                    stop,
                    task_status,
                )
            finally:
                stop.doing = "closing the stores"
                for store in (audit, ledger, db):
                    store.close()
        finally:
            stop.finished()
    log.info("node stopped")


async def _serve(
    settings: Settings,
    identity: Identity,
    data_dir: Path,
    capacity: LocalCapacity,
    stores: Stores,
    token: str,
    stop: Shutdown,
    task_status: Any,
) -> None:
    db, ledger, audit = stores
    metrics = NodeMetrics()
    trio.lowlevel.add_instrument(LoopStalls(metrics))
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
        max_connections=DIRECTORY_CONNECTIONS if settings.directory else None,
    ) as host:
        node = Node(settings, identity, data_dir, capacity, host, peers, db, metrics)
        node.sandbox = await probe_isolation()
        feed = EventFeed()
        node.events = events = NodeEvents(feed)
        cost = DiscoveryCost(metrics)  # what discovery costs this node, all parts together
        if settings.directory:
            node.directory = Directory(host, identity, metrics, cost, settings.ttl_s)
        directory = node.directory
        node.registration = registration = Registration(
            host,
            identity,
            peers,
            cost,
            node.signed_ad,
            directory_peers=settings.directory_peers,
            interval_s=settings.register_every_s,
            gossip_max_peers=settings.gossip_max_peers,
            is_directory=settings.directory,
            own_count=(lambda: len(directory.table)) if directory else (lambda: 0),
            db=db,
        )
        node.gossip = gossip = CapacityGossip(
            host,
            peers,
            metrics,
            node.signed_ad,
            settings.publish_interval_s,
            cost,
            gossip_own_ad=registration.gossip_own_ad,
            slow_refresh=registration.slow_refresh,
            shares_all_ads=registration.shares_all_ads,
        )
        registration.on_change = gossip.changed  # two directories said "small": publish
        receipts = ReceiptGossip(host, audit, metrics, registration.audits_receipts)
        directory_credit = DirectoryCredit(registration, identity)
        if directory is not None:
            credit_server = CreditServer(
                host,
                identity,
                lambda: audit_figures(audit),
                lambda: {e.ad.peer_id: (e.ad.name, e.ad.team) for e in directory.table.entries()},
            )
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
                    preferences=lambda: node.preferences,
                    paused_because=node.paused_because,
                    ledger=PublishingLedger(ledger, events),  # type: ignore[arg-type]
                    publish_receipt=receipts.publish,
                    publish_evidence=evidence.publish,
                    limits=WorkLimits(
                        lease_s=settings.lease_s,
                        max_units=settings.max_units,
                        max_unit_download_bytes=settings.max_unit_download_mb << 20,
                        unit_disk_quota_bytes=settings.unit_disk_quota_mb << 20,
                        evidence_floor_bytes=settings.evidence_floor_mb << 20,
                        unit_files_keep_s=settings.unit_files_keep_hours * 3600,
                    ),
                    unit_keys=UnitKeys(db, identity.seed),
                    on_load=node.set_load,
                    finder=PeerFinder(gossip, registration),
                ),
                memory_limit_mb=_memory_limit_mb(),
                warm_runners=settings.warm_runners,
            )
            ctx = work.ctx
            stop.runner_pids = lambda: ctx.unit_pids | ctx.runner_pids

            def training_share() -> float:
                return ctx.duty_cycle() / 100 if ctx.unit_pids else 0.0

            idle = IdleSensor(
                lambda: sum(process_cpu_s(pid) for pid in ctx.unit_pids | ctx.runner_pids),
                lambda: node.preferences.idle_load_pct,
            )
            node.idle_how = lambda: idle.how
            sensors = Sensors()
            node.sensors_missing = sensors.missing()
            for gap in node.sensors_missing:
                log.info("machine guards: %s", gap)
            node.availability = Availability(
                lambda: node.preferences,
                TrainingDays(db),
                idle,
                sensors=lambda wanted: sensors.read(ctx.unit_pids | ctx.runner_pids, wanted),
            )
            bridge = TrioBridge(trio.lowlevel.current_trio_token(), nursery)
            guard = WriteGuard(token, http_host)
            routes = job_routes(
                work, bridge, guard, data_dir / "uploads", settings.max_upload_mb << 20, SubmitError
            )
            own_label = {"peer_id": identity.peer_id, "name": settings.name, "team": settings.team}
            pages = PageSources(node, work, ledger, audit, bridge, guard.open, own_label)

            def directory_view() -> Any:  # a directory's table, asked from the trio thread
                return bridge.call_async(directory_credit.view)

            pages.directory_credit = directory_view
            app = make_app(
                node,
                bridge,
                guard,
                [
                    routes,
                    ledger_routes(ledger, audit),
                    credit_routes(
                        audit,
                        lambda: bridge.call(node.peers),
                        own_label,
                        directory_view,
                    ),
                    event_routes(feed, identity.peer_id),
                    page_routes(pages),
                ],
            )
            http = HttpServerThread(app, http_host, int(http_port))
            await trio.to_thread.run_sync(http.start)
            try:
                await node.gossip.start()
                if node.directory is not None:
                    node.directory.start()
                    credit_server.start()
                    nursery.start_soon(node.directory.run)
                nursery.start_soon(registration.run)
                await receipts.start()
                await evidence.start()
                nursery.start_soon(node.gossip.run)
                nursery.start_soon(receipts.run)
                nursery.start_soon(evidence.run)
                nursery.start_soon(work.run)
                nursery.start_soon(
                    keep_checking, node.availability, training_share, node.availability_changed
                )
                nursery.start_soon(watch_peers, peers, events)
                nursery.start_soon(keep_connected, host, settings.bootstrap, settings.target_peers)
                limits = ConnectionLimits.for_node(
                    settings.target_peers,
                    settings.register_every_s,
                    settings.max_connections,
                    settings.connection_idle_s,
                )
                nursery.start_soon(
                    trim_connections,
                    host,
                    limits,
                    metrics,
                    lambda: set(registration.directories()),
                )
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
                await stop.requested.wait()
                if work.worker is not None:
                    hand_back = work.worker.hand_back_all
                    await stop.step("handing back units", HAND_BACK_S + 1, hand_back, HAND_BACK_S)
            finally:
                await stop.step("stopping the HTTP server", HTTP_STOP_S, in_thread, http.stop)
                stop.doing = "ending the node's tasks (runners, blob server)"
                nursery.cancel_scope.cancel()
        stop.doing = "closing the libp2p host"


async def probe_isolation() -> dict[str, str]:
    """Which isolation a training subprocess gets here (`training.run.isolation`), measured
    once at start in a throwaway child."""
    done = await trio.run_process(
        [sys.executable, "-m", "training.run.isolation"],
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
