"""Node settings: embedded defaults < `meshminer.toml` in the data dir < CLI flags.

Every setting is declared once, as a field of `Settings` with its type, default and
meaning; the TOML loader and the reference in docs/operations.md come from there. A config
file with an unknown key or a value of the wrong type stops the node with an error
naming the key, because a silently ignored typo in a volunteer's policy is worse than
a node that does not start.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import multiaddr

from node.preferences import PREFERENCE_KEYS, PreferenceError, Preferences

CONFIG_FILE = "meshminer.toml"
SAVED_PREFERENCES = "preferences.json"  # changes from the page, API or `node prefs`
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "meshminer"


class ConfigError(Exception):
    """The configuration is invalid; the message names the key and what to do."""


def _meta(help: str, section: str = "") -> dict[str, str]:
    return {"help": help, "section": section}


@dataclass(frozen=True)
class Settings:
    listen: str = field(
        default="/ip4/0.0.0.0/tcp/4470",
        metadata=_meta("libp2p listen multiaddr (TCP; Noise + Yamux)"),
    )
    http: str = field(
        default="127.0.0.1:8470",
        metadata=_meta("HOST:PORT of the local HTTP API"),
    )
    bootstrap: list[str] = field(
        default_factory=list,
        metadata=_meta("multiaddrs (ending in /p2p/<peer id>) to connect to at start"),
    )
    mdns: bool = field(default=True, metadata=_meta("discover peers on the LAN with mDNS"))
    reachability: str = field(
        default="auto",
        metadata=_meta(
            "auto (peers dial us back to find out) | public | private (behind a NAT: "
            "hold slots on relays)"
        ),
    )
    relay: bool = field(
        default=True,
        metadata=_meta("relay circuits for peers behind NATs while this node is public"),
    )
    relay_max_reservations: int = field(
        default=64, metadata=_meta("peers that may hold a relay slot here at once")
    )
    relay_max_circuits: int = field(
        default=8, metadata=_meta("relayed connections to one peer at once, through this node")
    )
    relay_circuit_mb: int = field(
        default=64,
        metadata=_meta("most MiB one relayed connection may carry (bulk data goes direct)"),
    )
    relay_circuit_s: int = field(
        default=3600, metadata=_meta("longest a relayed connection may last, in seconds")
    )
    log_level: str = field(default="info", metadata=_meta("debug | info | warning | error"))
    directory: bool = field(
        default=False,
        metadata=_meta(
            "serve as a directory: keep the ads volunteers register, answer owners' queries "
            "(a public node, for networks of hundreds of peers and more)"
        ),
    )
    directory_peers: int = field(
        default=2, metadata=_meta("directories this node registers its ad with (0 = none)")
    )
    register_interval_s: float = field(
        default=0.0,
        metadata=_meta(
            "seconds between registrations with each directory; 0 = a third of the peer TTL"
        ),
    )
    gossip_max_peers: int = field(
        default=100,
        metadata=_meta(
            "once directories count this many peers, this node's ad goes to them only, "
            "not by gossip to every node"
        ),
    )
    publish_interval_s: float = field(
        default=30.0,
        metadata=_meta("seconds between capacity ad refreshes (ads also go out on change)"),
    )
    peer_ttl_s: float = field(
        default=0.0,
        metadata=_meta("seconds without an ad before a peer is dropped; 0 = 3 x publish interval"),
    )
    gossip_rate_limit: float = field(
        default=20.0,
        metadata=_meta("GossipSub messages per second accepted from one peer on one topic"),
    )
    target_peers: int = field(
        default=8,
        metadata=_meta("connect to peers learned from ads until this many are connected"),
    )
    max_connections: int = field(
        default=0,
        metadata=_meta(
            "above this many open connections, close the idle ones down to target_peers; "
            "0 = 2 x target_peers (at least 16)"
        ),
    )
    connection_idle_s: float = field(
        default=0.0,
        metadata=_meta(
            "seconds without a new stream before a connection counts as idle; "
            "0 = 2 x the registration interval (at least 60)"
        ),
    )
    lease_s: float = field(
        default=15.0,
        metadata=_meta("seconds a worker may go without a heartbeat before its unit is re-offered"),
    )
    max_upload_mb: int = field(
        default=1024, metadata=_meta("largest data file the API accepts with a job, in MiB")
    )
    max_units: int = field(
        default=1, metadata=_meta("units this node trains at once (its own jobs' and peers')")
    )
    max_unit_download_mb: int = field(
        default=16384,
        metadata=_meta("most data one unit may make this node fetch, in MiB (larger: declined)"),
    )
    unit_disk_quota_mb: int = field(
        default=10240,
        metadata=_meta("most a training unit may write into its folder, in MiB (over: killed)"),
    )
    unit_files_keep_hours: float = field(
        default=24.0,
        metadata=_meta("hours a finished unit's folder (log, weights copy) is kept"),
    )
    # [policy]: the owner's terms, advertised in every capacity ad
    accepting: bool = field(
        default=True, metadata=_meta("accept work from peers", section="policy")
    )
    load_limit_pct: int = field(
        default=100, metadata=_meta("refuse new work above this load (0-100)", section="policy")
    )
    max_job_hours: float = field(
        default=24.0, metadata=_meta("longest job accepted, in hours", section="policy")
    )
    max_gpu_memory_share: float = field(
        default=0.9,
        metadata=_meta("largest share of GPU memory a job may use (0-1]", section="policy"),
    )

    allow_owners: list[str] = field(
        default_factory=list,
        metadata=_meta("if not empty, take work only from these peer ids", section="policy"),
    )
    deny_owners: list[str] = field(
        default_factory=list,
        metadata=_meta("never take work from these peer ids", section="policy"),
    )
    # [policy], not advertised: when this node trains (node.preferences)
    hours: str = field(
        default="",
        metadata=_meta(
            'train only in these local-time windows, e.g. "22:00-07:00" or '
            '"12:00-13:00, 22:00-07:00"; "" = any time',
            section="policy",
        ),
    )
    idle_minutes: float = field(
        default=0.0,
        metadata=_meta(
            "train only after this many minutes without keyboard/mouse input (0 = always)",
            section="policy",
        ),
    )
    idle_load_pct: int = field(
        default=25,
        metadata=_meta(
            "where input cannot be read: idle means other programs use below this % of the CPU",
            section="policy",
        ),
    )
    daily_gpu_hours: float = field(
        default=0.0,
        metadata=_meta("most hours of training a day (0 = no cap)", section="policy"),
    )
    gpus: list[int] = field(
        default_factory=list,
        metadata=_meta("CUDA device indexes training may use, e.g. [0, 1]; [] = all", "policy"),
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
        try:
            self.preferences().check()
        except PreferenceError as exc:
            raise ConfigError(f"setting {exc}") from None
        _check_range(
            "log_level",
            self.log_level in ("debug", "info", "warning", "error"),
            "must be one of debug, info, warning, error",
        )
        _check_range("publish_interval_s", self.publish_interval_s > 0, "must be > 0")
        _check_range("peer_ttl_s", self.peer_ttl_s >= 0, "must be >= 0")
        _check_range("gossip_rate_limit", self.gossip_rate_limit > 0, "must be > 0")
        _check_range("target_peers", self.target_peers >= 0, "must be >= 0")
        _check_range(
            "max_connections",
            self.max_connections == 0 or self.max_connections >= self.target_peers,
            "must be 0 or at least target_peers",
        )
        _check_range("connection_idle_s", self.connection_idle_s >= 0, "must be >= 0")
        _check_range("directory_peers", 0 <= self.directory_peers <= 8, "must be 0..8")
        _check_range(
            "register_interval_s",
            0 <= self.register_interval_s <= self.ttl_s / 2,
            f"must be 0 (auto) or at most half the peer TTL ({self.ttl_s:g} s)",
        )
        _check_range("gossip_max_peers", self.gossip_max_peers >= 0, "must be >= 0")
        _check_range(
            "reachability",
            self.reachability in ("auto", "public", "private"),
            "must be one of auto, public, private",
        )
        _check_range(
            "relay_max_reservations", 1 <= self.relay_max_reservations <= 4096, "must be 1..4096"
        )
        _check_range("relay_max_circuits", 1 <= self.relay_max_circuits <= 256, "must be 1..256")
        _check_range("relay_circuit_mb", 1 <= self.relay_circuit_mb <= 2**20, "must be 1..1048576")
        _check_range("relay_circuit_s", 1 <= self.relay_circuit_s <= 86400, "must be 1..86400")
        _check_range("lease_s", 3 <= self.lease_s <= 3600, "must be 3..3600")
        _check_range("max_units", 1 <= self.max_units <= 64, "must be 1..64")
        _check_range("unit_disk_quota_mb", self.unit_disk_quota_mb >= 1, "must be >= 1")
        _check_range("unit_files_keep_hours", self.unit_files_keep_hours >= 0, "must be >= 0")
        _check_range(
            "max_unit_download_mb", 1 <= self.max_unit_download_mb <= 2**24, "must be 1..16777216"
        )
        _check_range("max_upload_mb", self.max_upload_mb > 0, "must be > 0")
        _check_range("load_limit_pct", 0 <= self.load_limit_pct <= 100, "must be 0..100")
        _check_range("max_job_hours", self.max_job_hours > 0, "must be > 0")
        _check_range(
            "max_gpu_memory_share", 0 < self.max_gpu_memory_share <= 1, "must be in (0, 1]"
        )
        host, sep, port = self.http.rpartition(":")
        _check_range("http", bool(sep and host and port.isdigit()), "must be HOST:PORT")
        _check_multiaddr("listen", self.listen, "/tcp/", "e.g. /ip4/0.0.0.0/tcp/4470")
        for addr in self.bootstrap:
            _check_multiaddr(
                "bootstrap", addr, "/p2p/", "e.g. /ip4/192.0.2.1/tcp/4470/p2p/12D3KooW..."
            )


def _check_multiaddr(key: str, value: str, must_have: str, example: str) -> None:
    try:
        multiaddr.Multiaddr(value)
    except Exception:
        raise ConfigError(f"setting '{key}': {value!r} is not a multiaddr ({example})") from None
    if must_have not in value:
        raise ConfigError(
            f"setting '{key}': {value!r} has no {must_have.strip('/')} part ({example})"
        )


def _check_range(key: str, ok: bool, rule: str) -> None:
    if not ok:
        raise ConfigError(f"setting '{key}' {rule}")


def _type_name(tp: Any) -> str:
    return {"list[str]": "a list of strings", "list[int]": "a list of integers"}.get(
        str(tp), str(tp)
    )


def _coerce(key: str, tp: str, value: Any) -> Any:
    """Check a TOML value against the declared type (ints are fine for floats)."""
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "list[int]": isinstance(value, list)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
    }[tp]
    if not ok:
        raise ConfigError(
            f"setting '{key}' must be {_type_name(tp)}, got {type(value).__name__} {value!r}"
        )
    return float(value) if tp == "float" else value


def parse_config(text: str, source: str = CONFIG_FILE) -> dict[str, Any]:
    """Parse TOML text into validated overrides (key -> value)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    declared = {f.name: f for f in fields(Settings)}
    overrides: dict[str, Any] = {}

    def take(section: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = f"{section}.{key}" if section else key
            f = declared.get(key)
            if isinstance(value, dict) and not section and key == "policy":
                take("policy", value)
                continue
            if f is not None and f.metadata["section"] != section:
                where = (
                    f"the [{f.metadata['section']}] table"
                    if f.metadata["section"]
                    else ("the top level")
                )
                raise ConfigError(f"setting '{name}' in {source} belongs in {where}")
            if f is None:
                raise ConfigError(
                    f"unknown setting '{name}' in {source}; "
                    "the settings are listed in docs/operations.md"
                )
            overrides[key] = _coerce(name, str(f.type), value)

    take("", raw)
    return overrides


def data_dir_from(cli_value: Path | None) -> Path:
    """--data-dir, else $MESHMINER_DATA_DIR, else ~/.local/share/meshminer."""
    if cli_value is not None:
        return cli_value.expanduser()
    env = os.environ.get("MESHMINER_DATA_DIR")
    return Path(env).expanduser() if env else DEFAULT_DATA_DIR


def load_settings(data_dir: Path, cli_overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then `meshminer.toml` in `data_dir` (if any), then the preferences
    saved from the page or the API (`preferences.json`), then CLI flags."""
    settings = Settings()
    path = data_dir / CONFIG_FILE
    if path.exists():
        settings = replace(settings, **parse_config(path.read_text(), str(path)))
    settings = replace(settings, **load_saved_preferences(data_dir))
    overrides = {k: v for k, v in (cli_overrides or {}).items() if v is not None}
    settings = replace(settings, **overrides)
    settings.check()
    return settings


def load_saved_preferences(data_dir: Path) -> dict[str, Any]:
    """The policy and preferences changed at runtime, as `save_preferences` kept them."""
    path = data_dir / SAVED_PREFERENCES
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); delete it to go on") from None
    declared = {f.name: f for f in fields(Settings)}
    if not isinstance(saved, dict) or any(
        key not in declared or declared[key].metadata["section"] != "policy" for key in saved
    ):
        raise ConfigError(f"{path} holds something other than policy settings; delete it")
    return {key: _coerce(f"{path.name}: {key}", str(declared[key].type), v)
            for key, v in saved.items()}  # fmt: skip


def save_preferences(data_dir: Path, changes: dict[str, Any]) -> None:
    """Keep runtime changes for the next start (mode 0600, replaced atomically)."""
    path = data_dir / SAVED_PREFERENCES
    kept = {**load_saved_preferences(data_dir), **changes}
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(kept, out, indent=1, sort_keys=True)
    os.replace(temporary, path)


def settings_reference() -> list[tuple[str, str, Any, str]]:
    """(TOML key, type, default, meaning) for every setting, for docs and help."""
    rows = []
    for f in fields(Settings):
        default = f.default_factory() if callable(f.default_factory) else f.default
        key = f"{f.metadata['section']}.{f.name}" if f.metadata["section"] else f.name
        rows.append((key, str(f.type), default, f.metadata["help"]))
    return rows
