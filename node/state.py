"""The node's state, owned by the trio thread: its identity, capacity, policy and
preferences, its ad, and what its status says (the HTTP API reaches it through the
bridge). `node.daemon` wires it to the host, gossip and work service."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from node import __version__
from node.identity import Identity
from node.machine import LocalCapacity, measure_elsewhere, measured_capacity
from node.metrics import NodeMetrics
from node.net.discovery import CapacityGossip, Directory, Registration
from node.net.finder import parse_find_query
from node.net.host import MeshHost
from node.net.peers import PeerTable
from node.preferences import PreferenceError, apply_changes, chosen_gpus, describe_changes
from node.settings import Settings, api_changes, save_preferences
from node.store import next_counter
from node.timeline import NodeTimeline
from node.web.events import NodeEvents
from node.work.run import Availability
from node.work.service import WorkService
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
        self.preferences = settings.preferences()
        self.timeline = NodeTimeline(db)
        self.availability: Availability | None = None  # set once the node runs
        self.idle_how: Callable[[], str] = lambda: ""  # what "idle" is read from (node.machine)
        self.sensors_missing: list[str] = []  # what the machine guards cannot read here
        self.load_pct = 0
        self.started = time.time()
        self.sandbox: dict[str, str] = {}  # isolation mechanism -> "on ..." or why not
        self.gossip: CapacityGossip | None = None
        self.registration: Registration | None = None
        self.directory: Directory | None = None
        self.work: WorkService | None = None
        self.events: NodeEvents | None = None

    def ad(self, seq: int = 0) -> CapacityAd:
        return CapacityAd(
            peer_id=self.identity.peer_id,
            addrs=self.host.addrs()[:MAX_ADDRS],
            gpus=chosen_gpus(self.capacity.gpus, self.preferences.gpus),
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
            directory=self.settings.directory,
            paused=self.paused_because(),
            name=self.settings.name,
            team=self.settings.team,
        )

    def discovery_status(self) -> dict[str, Any]:
        """What finding peers costs this node per minute, and how it finds them."""
        if self.gossip is None:
            return {}
        out: dict[str, Any] = dict(self.gossip.cost.per_minute())
        if self.registration is not None:
            out.update(self.registration.status())
        if self.directory is not None:
            out["directory_holds"] = len(self.directory.table)
            out["directory_crowded"] = self.directory.crowded()
        return out

    def paused_because(self) -> str:
        return self.availability.reason if self.availability is not None else ""

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
            "preferences": self.preferences_plain(),
            "availability": self.available(),
            "timeline": self.timeline.recent(),
            "discovery": self.discovery_status(),
            "ports": {
                "listen": self.settings.listen,
                "http": self.settings.http,
                "data": self.work.ctx.data_port if self.work is not None else 0,
            },
        }

    def available(self) -> dict[str, Any]:
        """Whether training may run now by the preferences, and today's training."""
        availability = self.availability
        return {
            "paused": self.paused_because(),
            "trained_today_h": round(availability.used_today_s() / 3600, 3)
            if availability is not None
            else 0.0,
            "idle_from": self.idle_how() if self.preferences.idle_minutes else "",
            "sensors_missing": self.sensors_missing,
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

    def registrations(self) -> list[dict[str, Any]]:
        """On a directory: the ads volunteers registered here (404 elsewhere)."""
        if self.directory is None:
            raise LookupError("this node is not a directory (start it with --directory)")
        return [entry.to_json() for entry in self.directory.table.entries()]

    async def find_peers(self, query: dict[str, str]) -> dict[str, Any]:
        """Up to k peers that fit the requirements and answered a probe just now
        (`GET /api/v1/peers/find`); raises ValueError on a bad query."""
        k, requirements = parse_find_query(query)
        if self.work is None or self.work.ctx.finder is None:
            raise ValueError("the node is still starting")
        found = await self.work.ctx.finder.find(requirements, k)
        return found.to_json()

    def reputation(self) -> list[dict[str, Any]]:
        """What this node has seen of each peer's results (`node.work.trust.reputation`)."""
        return self.work.owner.reputation.all() if self.work is not None else []

    def metrics(self) -> bytes:
        self.node_metrics.uptime.set(time.time() - self.started)
        self.node_metrics.connections.set(len(self.host.connected_peers()))
        self.node_metrics.peers.set(len(self.peer_table))
        return self.node_metrics.render()

    def set_policy(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the policy and preferences at runtime (from the API or the page);
        they apply at once, the next ad says so, and the node's timeline notes it.

        `running`: "finish" (default) lets a running unit complete when the node stops
        accepting; "hand_back" stops it and returns it to its owner, who re-offers it."""
        changes = dict(changes)
        running = changes.pop("running", "finish")
        if running not in ("finish", "hand_back"):
            raise PreferenceError("'running' must be 'finish' or 'hand_back'")
        changes = api_changes(changes)  # typed, in range, or PreferenceError
        before = self.preferences_plain()
        self.policy, self.preferences = apply_changes(self.policy, self.preferences, changes)
        after = self.preferences_plain()
        if changes:
            save_preferences(self.data_dir, {key: after[key] for key in changes})
        said = describe_changes(before, after)
        if said:
            log.info("preferences changed: %s", said)
            self.timeline.add(f"set {said}")
        if self.work is not None and self.work.worker is not None and not self.policy.accepting:
            if running == "hand_back" and self.work.worker.units:
                self.timeline.add("running unit handed back to its owner")
            self.work.worker.stop_current(hand_back=running == "hand_back")
        self.availability_changed()
        return after

    def preferences_plain(self) -> dict[str, Any]:
        return {**to_plain(self.policy), **to_plain(self.preferences)}

    def availability_changed(self, reason: str | None = None) -> None:
        """The preferences may pause or allow training (`node.work.run.availability`)."""
        if reason is not None:
            self.timeline.add(f"training paused: {reason}" if reason else "training allowed again")
        self._ad_changed()

    def set_load(self, load_pct: int) -> None:
        self.load_pct = load_pct
        if self.gossip is not None:
            self.gossip.load_changed(load_pct)
        self._status_changed()

    def _ad_changed(self) -> None:
        if self.gossip is not None:
            self.gossip.changed()
        self._status_changed()

    def _status_changed(self) -> None:
        if self.events is not None:
            self.events.status(self.load_pct, to_plain(self.policy), self.capacity.tflops)

    async def refresh_capacity(self) -> dict[str, Any]:
        """Re-run the throughput benchmark and advertise the new figure."""
        measuring = await trio.to_thread.run_sync(measure_elsewhere, self.data_dir, True)
        self.capacity = await trio.to_thread.run_sync(
            measured_capacity, self.data_dir, measuring, True
        )
        log.info("capacity refreshed: %.3f TFLOP/s", self.capacity.tflops)
        self._ad_changed()
        return self.status()["capacity"]
