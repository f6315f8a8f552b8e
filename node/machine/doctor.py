"""`meshminer doctor`: what stands between this node and useful work, each with its fix.

Plain functions from facts to findings: the running node's status and peers (from its
API, when one answers), the data dir, and the machine's torch. The command
(`node.cli.doctor`) gathers the facts and prints the findings.
"""

from __future__ import annotations

import json
import stat
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OK, WARN, PROBLEM = "ok", "warn", "problem"
MAX_SKEW_S = 30.0  # ads older or newer than this look stale or from the future to peers


@dataclass(frozen=True)
class Finding:
    name: str
    state: str  # ok | warn | problem
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def node_findings(status: dict[str, Any], peers: list[dict[str, Any]], now: float) -> list[Finding]:
    """What the running node's own view says."""
    return [
        _reachability(status),
        _addresses(status),
        _relays(status),
        _peers_by_path(status, peers),
        _clock(peers, now),
        _ports(status),
        *_isolation(status),
        _guards(status),
    ]


def _guards(status: dict[str, Any]) -> Finding:
    """A machine guard set where its sensor cannot be read never pauses: say so."""
    missing = status.get("availability", {}).get("sensors_missing", [])
    prefs = status.get("preferences", {})
    blind = [gap for gap in missing if prefs.get(gap.rsplit(": ", 1)[-1])]
    if blind:
        fix = "docs/volunteer.md (Machine guards) says what each guard reads"
        return Finding("machine guards", WARN, "; ".join(blind) + " (set, never pauses)", fix)
    unread = ", ".join(gap.rsplit(": ", 1)[-1] for gap in missing)
    return Finding("machine guards", OK, f"unread here: {unread}" if unread else "all read")


def _reachability(status: dict[str, Any]) -> Finding:
    r = status.get("reachability", {})
    state, how, relays = r.get("state", "unknown"), r.get("how", ""), r.get("relayed_through", [])
    if state == "public":
        relaying = "; relays for peers behind NATs" if r.get("relaying") else ""
        return Finding("reachability", OK, f"public: {how}{relaying}")
    if state == "private" and relays:
        return Finding(
            "reachability", OK, f"behind a NAT ({how}); reachable through {len(relays)} relay(s)"
        )
    if state == "private":
        return Finding(
            "reachability",
            PROBLEM,
            f"behind a NAT ({how}) and holding no relay slot: peers cannot reach this node",
            "join through a public node (--bootstrap), which relays by default; or forward "
            "the listen port on your router",
        )
    return Finding(
        "reachability",
        WARN,
        f"not known yet ({how})",
        "it is learned from a connected peer's dial-back: check --bootstrap",
    )


def _addresses(status: dict[str, Any]) -> Finding:
    r = status.get("reachability", {})
    listen = [a for a in status.get("addrs", []) if "/p2p-circuit" not in a]
    observed = r.get("observed_addrs", [])
    detail = f"listen {', '.join(listen) or '-'}; peers see {', '.join(observed) or '-'}"
    return Finding("addresses", OK, detail)


def _relays(status: dict[str, Any]) -> Finding:
    relays = status.get("reachability", {}).get("relayed_through", [])
    circuits = [a for a in status.get("addrs", []) if "/p2p-circuit" in a]
    if not relays:
        return Finding("relay slots", OK, "none held")
    return Finding("relay slots", OK, f"{len(relays)}: {', '.join(circuits)}")


def _peers_by_path(status: dict[str, Any], peers: list[dict[str, Any]]) -> Finding:
    paths = [p.get("path", "none") for p in peers]
    direct, relayed = paths.count("direct"), paths.count("relayed")
    detail = f"{direct} direct, {relayed} through a relay, {len(peers)} known"
    if not status.get("connections"):
        return Finding(
            "peers",
            PROBLEM,
            f"no connections ({len(peers)} known)",
            "check --bootstrap addresses and that this machine can reach them",
        )
    return Finding("peers", OK, detail)


def _clock(peers: list[dict[str, Any]], now: float) -> Finding:
    """Ads and leases carry timestamps: our clock against the peers' ads as received."""
    skews = [p["ad_timestamp"] - p["last_seen"] for p in peers if not p.get("stale")]
    if not skews:
        return Finding("clock", WARN, "no fresh ads to compare with")
    skew = statistics.median(skews)
    detail = f"peers' clocks differ from ours by {skew:+.1f} s (median of {len(skews)})"
    if abs(skew) > MAX_SKEW_S:
        return Finding(
            "clock",
            PROBLEM,
            detail,
            "turn on time synchronisation (e.g. `timedatectl set-ntp true`)",
        )
    return Finding("clock", OK, detail)


def _ports(status: dict[str, Any]) -> Finding:
    ports = status.get("ports", {})
    http = ports.get("http", "")
    detail = f"libp2p {ports.get('listen', '-')}, data channel {ports.get('data') or '-'}, "
    detail += f"API {http or '-'}"
    host = http.rpartition(":")[0]
    if host and host not in ("127.0.0.1", "localhost", "::1"):
        return Finding(
            "ports",
            WARN,
            detail + " (the API is bound beyond loopback: every request needs the token)",
            "bind the API to 127.0.0.1 unless you reach it from another machine",
        )
    return Finding("ports", OK, detail)


def _isolation(status: dict[str, Any]) -> list[Finding]:
    out = []
    for name, state in status.get("sandbox", {}).items():
        good = str(state).startswith("on")
        fix = "" if good else "docs/operations.md (The sandbox) says what the kernel must offer"
        label = f"isolation: {name.replace('_', ' ')}"
        out.append(Finding(label, OK if good else WARN, state, fix))
    return out


def data_dir_findings(data_dir: Path) -> list[Finding]:
    """The data dir is this user's alone: 0700, the key and token 0600."""
    if not data_dir.exists():
        return [Finding("data dir", WARN, f"{data_dir} does not exist yet", "start a node once")]
    out = []
    for path, wanted in ((data_dir, 0o700), (data_dir / "identity.key", 0o600)):
        if not path.exists():
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & ~wanted:
            out.append(
                Finding(
                    f"permissions: {path.name}",
                    PROBLEM,
                    f"{path} is mode {mode:o}; others can read it",
                    f"chmod {wanted:o} {path}",
                )
            )
    token = data_dir / "api.token"
    if token.exists() and stat.S_IMODE(token.stat().st_mode) & 0o077:
        out.append(
            Finding(
                "permissions: api.token",
                PROBLEM,
                f"{token} is readable by others",
                f"chmod 600 {token}",
            )
        )
    return out or [Finding("data dir", OK, f"{data_dir}: 0700, secrets 0600")]


def torch_findings() -> list[Finding]:
    """torch, CUDA and the GPUs this Python sees."""
    try:
        import torch
    except ImportError as exc:
        return [Finding("torch", PROBLEM, f"not importable: {exc}", "make install")]
    version = torch.__version__
    if not torch.cuda.is_available():
        return [
            Finding(
                "torch",
                WARN,
                f"{version}, no CUDA device: this node trains on the CPU",
                "with an NVIDIA GPU, install its driver and a CUDA build of torch",
            )
        ]
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found = Finding("torch", OK, f"{version}, CUDA {torch.version.cuda}: {', '.join(names)}")
    return [found, sandboxed_cuda_finding()]


def sandboxed_cuda_finding() -> Finding:
    """Whether CUDA starts inside the runner's sandbox: where it does not, every unit
    trains on the CPU (`device = "auto"`) although the node advertises its GPU."""
    name = "isolation: CUDA"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "training.run.isolation", "--cuda"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        state = json.loads(done.stdout.strip().splitlines()[-1])["cuda"]
    except (subprocess.TimeoutExpired, IndexError, KeyError, ValueError) as exc:
        state = f"off: the probe failed ({exc})"
    if state == "on":
        return Finding(name, OK, "CUDA starts inside the runner's sandbox")
    return Finding(
        name,
        PROBLEM,
        f"CUDA does not start inside the runner's sandbox, so units train on the CPU ({state})",
        "report it with `python -m training.run.isolation --cuda`'s output and your kernel",
    )


def worst(findings: list[Finding]) -> str:
    states = {f.state for f in findings}
    return PROBLEM if PROBLEM in states else WARN if WARN in states else OK
