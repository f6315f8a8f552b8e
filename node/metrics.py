"""Prometheus metrics of one node, in a registry of its own (served at /metrics), and
`LoopStalls`, which counts and names what holds the node's trio thread too long."""

from __future__ import annotations

import logging
import time

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest

log = logging.getLogger(__name__)

#: a task step holding the trio thread this long is logged: meanwhile the node answers
#: no heartbeat, no offer and no probe, and its workers' leases run on
STALL_S = 0.5


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ads_rejected = Counter(
            "meshminer_ads_rejected",
            "Capacity ads rejected before delivery, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.ads_ignored = Counter(
            "meshminer_ads_ignored",
            "Capacity ads passed on but not used: an older sequence number than one already "
            "held (out of order, e.g. from a pending queue), by reason",
            ["reason"],
            registry=self.registry,
        )
        self.ads_accepted = Counter(
            "meshminer_ads_accepted",
            "Capacity ads accepted into the peer table",
            ["via"],
            registry=self.registry,
        )
        self.ads_published = Counter(
            "meshminer_ads_published",
            "Capacity ads this node published",
            registry=self.registry,
        )
        self.peers = Gauge("meshminer_peers", "Peers in the peer table", registry=self.registry)
        self.connections = Gauge(
            "meshminer_connections", "Open libp2p connections", registry=self.registry
        )
        self.connections_trimmed = Counter(
            "meshminer_connections_trimmed",
            "Idle connections closed because more than the high water mark were open",
            registry=self.registry,
        )
        self.receipts_rejected = Counter(
            "meshminer_receipts_rejected",
            "Gossiped receipts rejected before delivery, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.receipts_seen = Counter(
            "meshminer_receipts_seen",
            "Receipts kept in the audit table, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.discovery_messages = Counter(
            "meshminer_discovery_messages",
            "Discovery messages in and out by kind: ad (gossip), table (exchange on connect), "
            "register (with a directory), query (of a directory), probe (before an offer), "
            "listing (asking a directory, as a stranger, whether it lists this node)",
            ["direction", "kind"],
            registry=self.registry,
        )
        self.discovery_bytes = Counter(
            "meshminer_discovery_bytes",
            "Bytes of discovery messages, received (in) or sent (out)",
            ["direction"],
            registry=self.registry,
        )
        self.discovery_check_cpu = Counter(
            "meshminer_discovery_check_cpu_seconds",
            "CPU seconds spent checking received ads and tables (GossipSub's own work "
            "shows in process_cpu_seconds_total)",
            registry=self.registry,
        )
        self.loop_stalls = Counter(
            "meshminer_loop_stalls",
            f"Task steps that held the node's trio thread for {STALL_S} s or more",
            registry=self.registry,
        )
        self.loop_stalled = Counter(
            "meshminer_loop_stalled_seconds",
            "Seconds the node's trio thread spent in those steps",
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total and friends
        self.uptime = Gauge(
            "meshminer_uptime_seconds", "Seconds since the node started", registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopStalls(trio.abc.Instrument):
    """Times every task step on the trio thread; one of `STALL_S` or more is counted
    and logged with its task's name and its CPU time: a step mostly on CPU computed
    too much on the thread, one mostly off it waited (a lock, a disk, the GIL held by
    another thread, or a machine with no core to spare).

    Each step reads only the monotonic clock (0.1 us here). The thread's CPU clock is
    a system call (0.9 us): read twice a step, it made a gossip node of a 10-node
    network spend 14-18 % more CPU (5,300-5,500 ms a minute against 4,550-4,650
    without the instrument), so it is read at most every `CPU_EVERY_S`, and a stall's
    CPU time may include that much from the steps before it."""

    CPU_EVERY_S = 0.01

    def __init__(self, metrics: NodeMetrics, stall_s: float = STALL_S) -> None:
        self.metrics = metrics
        self.stall_s = stall_s
        # from now: the step that adds this instrument ends without having begun here
        self._began = self._cpu_read_at = time.perf_counter()
        self._cpu = time.thread_time()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._began = now = time.perf_counter()
        if now - self._cpu_read_at > self.CPU_EVERY_S:
            self._cpu_read_at, self._cpu = now, time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        held = time.perf_counter() - self._began
        if held >= self.stall_s:
            cpu = time.thread_time() - self._cpu
            self.metrics.loop_stalls.inc()
            self.metrics.loop_stalled.inc(held)
            log.warning(
                "task %s held the node's thread %.2f s (%.2f s on CPU)", task.name, held, cpu
            )
