"""Prometheus metrics of one node, in a registry of its own (served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest


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
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total and friends
        self.uptime = Gauge(
            "meshminer_uptime_seconds", "Seconds since the node started", registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
