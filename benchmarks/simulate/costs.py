"""What one message or operation costs on a real node, read from `costs.json`.

The simulator only adds these figures up, so its answers are as good as they are: they
come from measurements on real nodes (the file names what it was measured on), and a
file with a missing or misspelt key is refused rather than silently filled in, since a
default would be a number nobody measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(__file__).with_name("costs.json")
# keys that describe the measurement rather than cost anything
METADATA_KEYS = frozenset({"measured", "commit", "date", "notes", "machine", "source", "speed_ms"})
# figures that follow the machine's speed: CPU, and latencies on loopback (all CPU there)
SPEED_BOUND = frozenset(
    {
        "idle_ms_per_min", "conn_ms_per_min", "ad_ms", "table_ad_check_ms",
        "register_client_ms", "register_server_ms", "query_client_ms", "query_server_ms",
        "query_per_ad_ms", "ad_check_ms", "probe_client_ms", "probe_server_ms", "rtt_ms",
        "connect_ms", "dial_ms", "join_connect_ms", "gossip_hop_ms", "receipt_ms",
        "relay_circuit_ms",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Costs:
    """Per-message and per-operation costs (ms of CPU, bytes, latencies) of one node."""

    idle_ms_per_min: float  # CPU of a node doing nothing, per minute
    conn_ms_per_min: float  # CPU per open connection, per minute (keep-alives, muxer)
    ad_ms: float  # CPU per delivered gossip ad: validation, forwarding, duplicates
    ad_bytes: float  # bytes per delivered ad (and per ad in a fetched table)
    table_ad_check_ms: float  # CPU per ad checked in a table fetched on joining
    register_client_ms: float  # volunteer CPU per registration sent
    register_server_ms: float  # directory CPU per registration taken (also its latency)
    register_bytes: float  # bytes per registration (out at the volunteer, in at the directory)
    query_client_ms: float  # owner CPU per directory query
    query_server_ms: float  # directory CPU per query (also its latency)
    query_per_ad_ms: float  # directory CPU per ad returned
    ad_check_ms: float  # owner CPU per returned ad checked
    probe_client_ms: float  # owner CPU per probe
    probe_server_ms: float  # probed peer's CPU per probe
    probe_bytes: float  # bytes per probe, each way
    rtt_ms: float  # round trip between two connected nodes
    connect_ms: float  # a request to a peer not yet connected: the dial until it returns
    dial_ms: float  # CPU of one new connection, each end: handshakes to the ad exchange
    join_connect_ms: float  # dial start until the new connection carries streams
    dial_timeout_s: float  # how long a request to a dead peer takes to fail
    gossip_hop_ms: float  # latency of one gossip hop
    receipt_ms: float  # CPU per delivered receipt (meshminer/receipts/1): as an ad, and its audit
    receipt_bytes: float  # bytes per delivered receipt
    relayed_probe_ms: float  # how much longer a probe over a new connection takes via a relay
    relay_circuit_ms: float  # a relay's CPU per circuit it carries (both streams, the piping)
    sweep_s: float  # period of the expiry sweeps (peer table, registrations)
    measured: str = "unknown"  # what the figures were measured on ("placeholder" until then)
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def on_machine(self, speed_ms: float) -> Costs:
        """These costs on a machine whose yardstick (`benchmarks.discovery.speed_ms`)
        reads `speed_ms`, where they were measured on one that read `meta["speed_ms"]`:
        the CPU figures scaled by the ratio. Unchanged when either yardstick is missing
        (0 or absent)."""
        measured_on = self.meta.get("speed_ms")
        if not measured_on or not speed_ms:
            return self
        factor = speed_ms / measured_on
        return replace(self, **{k: getattr(self, k) * factor for k in SPEED_BOUND})


COST_KEYS = tuple(f.name for f in fields(Costs) if f.name not in ("measured", "meta"))


def load_costs(path: str | Path | None = None) -> Costs:
    """Read costs from `path` (default: costs.json beside this module).

    Raises ValueError naming every missing or unknown key, or a value that is not a
    finite number >= 0, so a stale or hand-edited file fails loudly.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of costs")
    return costs_from_dict(data, source=str(path))


def costs_from_dict(data: dict[str, Any], source: str = "costs") -> Costs:
    """Build Costs from a dict as found in costs.json (same checks as `load_costs`)."""
    unknown = sorted(set(data) - set(COST_KEYS) - METADATA_KEYS)
    missing = [k for k in COST_KEYS if k not in data]
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unknown:
        known = ", ".join(sorted(METADATA_KEYS))
        problems.append(f"unknown keys: {', '.join(unknown)} (metadata keys allowed: {known})")
    for key in COST_KEYS:
        value = data.get(key, 0)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            problems.append(f"{key} must be a finite number >= 0, got {value!r}")
    speed = data.get("speed_ms", 1.0)
    number = isinstance(speed, int | float) and not isinstance(speed, bool)
    if not number or not math.isfinite(speed) or speed <= 0:
        problems.append(f"speed_ms must be a number > 0, finite, got {speed!r}")
    if problems:
        raise ValueError(f"{source}: " + "; ".join(problems))
    meta = {k: data[k] for k in METADATA_KEYS if k in data and k != "measured"}
    measured = str(data.get("measured", "unknown"))
    return Costs(**{k: float(data[k]) for k in COST_KEYS}, measured=measured, meta=meta)
