"""Every node setting, declared once: a field of `Settings` with its type, default,
meaning, unit, TOML table, `node run` flag, value rule, and whether the API may change
it while the node runs (`node.settings.schema.setting`).

From these declarations come the config file's keys and checks
(`node.settings.config`), the options of `meshminer node run`
(`node.cli.settings_options`), the keys `PUT /api/v1/policy` takes (`api_changes`) and
docs/settings.md (`python -m node.settings.doc`). Values are layered by
`node.settings.config.load_settings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import multiaddr

from node.preferences import MAX_GPUS, PREFERENCE_KEYS, PreferenceError, Preferences
from node.settings.schema import Bounds, ConfigError, Setting, declared, from_json, setting
from protocol import ProtocolError
from protocol.capacity import check_label

POLICY = "policy"
_AT_LEAST_0 = Bounds(0)
_ABOVE_0 = Bounds(0, low_open=True)


@dataclass(frozen=True)
class Settings:
    """A node's settings; each field's `setting(...)` is its whole declaration."""

    listen: str = setting(
        "/ip4/0.0.0.0/tcp/4470",
        "libp2p listen multiaddr (TCP; Noise + Yamux)",
        flag="--listen",
        value_name="MULTIADDR",
    )
    http: str = setting(
        "127.0.0.1:8470",
        "HOST:PORT of the local HTTP API",
        flag="--http",
        value_name="HOST:PORT",
    )
    bootstrap: list[str] = setting(
        [],
        "multiaddrs (ending in /p2p/ and a peer id) to connect to at start; the flag is "
        "repeatable and replaces the file's list",
        flag="--bootstrap",
        value_name="MULTIADDR",
    )
    mdns: bool = setting(True, "discover peers on the LAN with mDNS", flag="--mdns/--no-mdns")
    name: str = setting(
        "",
        "your name as others see it beside this node's peer id, e.g. on their credit "
        'page (plain text, at most 40 characters; "" = none)',
        flag="--name",
        value_name="TEXT",
    )
    team: str = setting(
        "",
        "your team's name, shown the same way (plain text, at most 40 characters)",
        flag="--team",
        value_name="TEXT",
    )
    reachability: str = setting(
        "auto",
        "auto: peers dial this node back to find out; public; private: behind a NAT, "
        "hold slots on relays",
        flag="--reachability",
        value_name="MODE",
        choices=("auto", "public", "private"),
    )
    relay: bool = setting(
        True,
        "relay circuits for peers behind NATs while this node is public",
        flag="--relay/--no-relay",
    )
    relay_max_reservations: int = setting(
        64, "peers that may hold a relay slot here at once", bounds=Bounds(1, 4096)
    )
    relay_max_circuits: int = setting(
        8, "relayed connections to one peer at once, through this node", bounds=Bounds(1, 256)
    )
    relay_circuit_mb: int = setting(
        64,
        "most MiB one relayed connection may carry (bulk data goes direct)",
        unit="MiB",
        bounds=Bounds(1, 2**20),
    )
    relay_circuit_s: int = setting(
        3600,
        "longest a relayed connection may last, in seconds",
        unit="s",
        bounds=Bounds(1, 86400),
    )
    log_level: str = setting(
        "info",
        "how much the log says",
        flag="--log-level",
        value_name="LEVEL",
        choices=("debug", "info", "warning", "error"),
    )
    directory: bool = setting(
        False,
        "serve as a directory: keep the ads volunteers register, answer owners' queries "
        "(a public node, for networks of hundreds of peers and more)",
        flag="--directory/--no-directory",
    )
    directory_peers: int = setting(
        2,
        "directories this node registers its ad with (0 = none)",
        flag="--directory-peers",
        bounds=Bounds(0, 8),
    )
    register_interval_s: float = setting(
        0.0,
        "seconds between registrations with each directory; 0 = a third of the peer TTL; "
        "else at most half the peer TTL",
        unit="s",
        bounds=_AT_LEAST_0,
    )
    gossip_max_peers: int = setting(
        100,
        "once directories count this many peers, this node's ad goes to them only, "
        "not by gossip to every node",
        flag="--gossip-max-peers",
        bounds=_AT_LEAST_0,
    )
    publish_interval_s: float = setting(
        30.0,
        "seconds between capacity ad refreshes (ads also go out on change)",
        unit="s",
        flag="--publish-interval",
        bounds=_ABOVE_0,
    )
    peer_ttl_s: float = setting(
        0.0,
        "seconds without an ad before a peer is dropped; 0 = 3 x publish interval",
        unit="s",
        flag="--peer-ttl",
        bounds=_AT_LEAST_0,
    )
    gossip_rate_limit: float = setting(
        20.0,
        "GossipSub messages per second accepted from one peer on one topic",
        flag="--gossip-rate-limit",
        bounds=_ABOVE_0,
    )
    target_peers: int = setting(
        8,
        "connect to peers learned from ads until this many are connected",
        flag="--target-peers",
        bounds=_AT_LEAST_0,
    )
    max_connections: int = setting(
        0,
        "above this many open connections, close the idle ones down to target_peers; "
        "0 = 2 x target_peers (at least 16); else at least target_peers",
        flag="--max-connections",
        bounds=_AT_LEAST_0,
    )
    connection_idle_s: float = setting(
        0.0,
        "seconds without a new stream before a connection counts as idle; "
        "0 = 2 x the registration interval (at least 60)",
        unit="s",
        flag="--connection-idle",
        bounds=_AT_LEAST_0,
    )
    lease_s: float = setting(
        15.0,
        "seconds a worker may go without a heartbeat before its unit is re-offered",
        unit="s",
        flag="--lease",
        bounds=Bounds(3, 3600),
    )
    max_upload_mb: int = setting(
        1024,
        "largest data file the API accepts with a job, in MiB",
        unit="MiB",
        flag="--max-upload-mb",
        bounds=_ABOVE_0,
    )
    max_units: int = setting(
        1,
        "units this node trains at once (its own jobs' and peers')",
        flag="--max-units",
        bounds=Bounds(1, 64),
    )
    max_unit_download_mb: int = setting(
        16384,
        "most data one unit may make this node fetch, in MiB (larger: declined)",
        unit="MiB",
        bounds=Bounds(1, 2**24),
    )
    unit_disk_quota_mb: int = setting(
        10240,
        "most a training unit may write into its folder, in MiB (over: killed)",
        unit="MiB",
        bounds=Bounds(1),
    )
    evidence_floor_mb: int = setting(
        64,
        "a unit's spot-check evidence under this many MiB is kept whole; over it, at "
        "most 3 training states at once (training waits for the owner's draws)",
        unit="MiB",
        bounds=_AT_LEAST_0,
    )
    unit_files_keep_hours: float = setting(
        24.0,
        "hours a finished unit's folder (log, weights copy) is kept",
        unit="h",
        bounds=_AT_LEAST_0,
    )
    warm_runners: bool = setting(
        True,
        "start the runners' fork server (torch imported once: 1-3 s of CPU, about 0.25 GB "
        "while it waits) when the node starts, so that its first task trains at once, not "
        "after that import; it leaves after 10 minutes without a task",
        flag="--warm-runners/--cold-runners",
    )
    # [policy]: the owner's terms; the first four are advertised in every capacity ad
    accepting: bool = setting(
        True,
        "accept work from peers",
        section=POLICY,
        api=True,
        flag="--accepting/--not-accepting",
    )
    load_limit_pct: int = setting(
        100,
        "train at most this percent of the time (a duty cycle); owners' schedulers also "
        "skip this node while its load is at or above it",
        unit="%",
        section=POLICY,
        api=True,
        flag="--load-limit",
        bounds=Bounds(0, 100),
    )
    max_job_hours: float = setting(
        24.0,
        "longest job accepted, in hours",
        unit="h",
        section=POLICY,
        api=True,
        flag="--max-job-hours",
        bounds=_ABOVE_0,
    )
    max_gpu_memory_share: float = setting(
        0.9,
        "largest share of GPU memory a job may use",
        section=POLICY,
        api=True,
        flag="--max-gpu-memory-share",
        bounds=Bounds(0, 1, low_open=True),
    )
    # [policy], not advertised: when this node trains (node.preferences)
    hours: str = setting(
        "",
        'train only in these local-time windows, e.g. "22:00-07:00" or '
        '"12:00-13:00, 22:00-07:00"; "" = any time',
        section=POLICY,
        api=True,
        flag="--hours",
        value_name="WINDOWS",
    )
    idle_minutes: float = setting(
        0.0,
        "train only after this many minutes without keyboard/mouse input (0 = always)",
        unit="min",
        section=POLICY,
        api=True,
        flag="--idle-minutes",
        bounds=Bounds(0, 24 * 60),
    )
    idle_load_pct: int = setting(
        25,
        "where input cannot be read: idle means other programs use below this % of the CPU",
        unit="%",
        section=POLICY,
        api=True,
        bounds=Bounds(0, 100),
    )
    daily_gpu_hours: float = setting(
        0.0,
        "most hours of training a day (0 = no cap)",
        unit="h",
        section=POLICY,
        api=True,
        flag="--daily-gpu-hours",
        bounds=Bounds(0, 24),
    )
    gpus: list[int] = setting(
        [],
        "CUDA device indexes training may use, e.g. [0, 1] (on the command line 0,1); none = all",
        section=POLICY,
        api=True,
        flag="--gpus",
        value_name="N,N",
        bounds=Bounds(0, MAX_GPUS - 1),
    )
    allow_owners: list[str] = setting(
        [],
        "if not empty, take work only from these peer ids; the flag is repeatable and "
        "replaces the file's list",
        section=POLICY,
        api=True,
        flag="--allow-owner",
        value_name="PEER_ID",
    )
    deny_owners: list[str] = setting(
        [],
        "never take work from these peer ids; the flag is repeatable and replaces the file's list",
        section=POLICY,
        api=True,
        flag="--deny-owner",
        value_name="PEER_ID",
    )
    max_cpu_temp_c: float = setting(
        0.0,
        "pause training at this CPU temperature, and go on 5 °C below it (0 = no cap)",
        unit="°C",
        section=POLICY,
        api=True,
        flag="--max-cpu-temp",
        bounds=Bounds(0, 120),
    )
    max_gpu_temp_c: float = setting(
        0.0,
        "pause training at this temperature of a GPU it uses, go on 5 °C below (0 = no cap)",
        unit="°C",
        section=POLICY,
        api=True,
        flag="--max-gpu-temp",
        bounds=Bounds(0, 120),
    )
    max_gpu_pct: int = setting(
        100,
        "train on each GPU at most this percent of the time (a duty cycle per device, as "
        "load_limit_pct is for the whole machine; 100 = no cap)",
        unit="%",
        section=POLICY,
        api=True,
        flag="--max-gpu-pct",
        bounds=Bounds(1, 100),
    )
    pause_on_battery: bool = setting(
        True,
        "pause training while the machine runs on battery",
        section=POLICY,
        api=True,
        flag="--pause-on-battery/--train-on-battery",
    )
    exclusive_apps: list[str] = setting(
        [],
        'pause training while one of these programs runs, by file name (e.g. "steam"); '
        "the flag is repeatable and replaces the file's list",
        section=POLICY,
        api=True,
        flag="--exclusive-app",
        value_name="NAME",
    )
    min_free_memory_gb: float = setting(
        0.0,
        "pause training while other programs are left less memory than this (0 = off)",
        unit="GB",
        section=POLICY,
        api=True,
        flag="--min-free-memory",
        bounds=Bounds(0, 4096),
    )
    max_units_disk_gb: float = setting(
        0.0,
        "decline offers while all units' folders, with the offered unit's data, would "
        "hold more than this (0 = no cap)",
        unit="GB",
        section=POLICY,
        api=True,
        flag="--max-units-disk",
        bounds=Bounds(0, 2**20),
    )
    min_free_disk_gb: float = setting(
        0.0,
        "decline offers whose data would leave less disk free than this (0 = off)",
        unit="GB",
        section=POLICY,
        api=True,
        flag="--min-free-disk",
        bounds=Bounds(0, 2**20),
    )
    max_upload_mbit_s: float = setting(
        0.0,
        "cap on the rate of blob transfers out of this node, all together (0 = no cap)",
        unit="Mbit/s",
        section=POLICY,
        api=True,
        flag="--max-upload",
        bounds=Bounds(0, 10**6),
    )
    max_download_mbit_s: float = setting(
        0.0,
        "cap on the rate of blob transfers into this node, all together (0 = no cap)",
        unit="Mbit/s",
        section=POLICY,
        api=True,
        flag="--max-download",
        bounds=Bounds(0, 10**6),
    )
    daily_transfer_gb: float = setting(
        0.0,
        "job data moved a local day, both ways; past it offers are declined and own jobs "
        "wait for the next day (0 = no cap)",
        unit="GB",
        section=POLICY,
        api=True,
        flag="--daily-transfer",
        bounds=Bounds(0, 2**20),
    )

    @property
    def register_every_s(self) -> float:
        return self.register_interval_s or self.ttl_s / 3

    @property
    def ttl_s(self) -> float:
        return self.peer_ttl_s if self.peer_ttl_s > 0 else 3 * self.publish_interval_s

    def preferences(self) -> Preferences:
        return Preferences(**{key: getattr(self, key) for key in PREFERENCE_KEYS})

    def check(self) -> None:
        """Raise `ConfigError` naming the first value that breaks its rule."""
        for s in SETTINGS:
            broken = s.broken_rule(getattr(self, s.name))
            if broken:
                raise ConfigError(f"setting '{s.name}' {broken}")
        try:
            self.preferences().check()
        except PreferenceError as exc:
            raise ConfigError(f"setting {exc}") from None
        _check(
            "max_connections",
            self.max_connections == 0 or self.max_connections >= self.target_peers,
            "must be 0 or at least target_peers",
        )
        _check(
            "register_interval_s",
            self.register_interval_s <= self.ttl_s / 2,
            f"must be 0 (auto) or at most half the peer TTL ({self.ttl_s:g} s)",
        )
        for key in ("name", "team"):
            try:
                check_label(getattr(self, key), key)
            except ProtocolError as exc:
                raise ConfigError(f"setting '{key}': {exc}") from None
        host, sep, port = self.http.rpartition(":")
        _check("http", bool(sep and host and port.isdigit()), "must be HOST:PORT")
        _check_multiaddr("listen", self.listen, "/tcp/", "e.g. /ip4/0.0.0.0/tcp/4470")
        for addr in self.bootstrap:
            _check_multiaddr(
                "bootstrap", addr, "/p2p/", "e.g. /ip4/192.0.2.1/tcp/4470/p2p/12D3KooW..."
            )


#: every setting, in the order declared
SETTINGS: tuple[Setting, ...] = declared(Settings)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
#: the keys PUT /api/v1/policy takes (and preferences.json keeps)
API_KEYS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.api)


def api_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` sent to PUT /api/v1/policy, each converted to its setting's type and
    checked against its rule; raises `PreferenceError` naming the first bad key."""
    unknown = set(changes) - set(API_KEYS)
    if unknown:
        known = ", ".join(API_KEYS)
        raise PreferenceError(f"unknown preference {sorted(unknown)[0]!r}; known: {known}")
    typed = {}
    for key, value in changes.items():
        s = BY_NAME[key]
        try:
            typed[key] = from_json(s, value)
        except ValueError as exc:
            raise PreferenceError(str(exc)) from None
        broken = s.broken_rule(typed[key])
        if broken:
            raise PreferenceError(f"{key} {broken}")
    return typed


def _check_multiaddr(key: str, value: str, must_have: str, example: str) -> None:
    try:
        multiaddr.Multiaddr(value)
    except Exception:
        raise ConfigError(f"setting '{key}': {value!r} is not a multiaddr ({example})") from None
    if must_have not in value:
        raise ConfigError(
            f"setting '{key}': {value!r} has no {must_have.strip('/')} part ({example})"
        )


def _check(key: str, ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(f"setting '{key}' {rule}")
