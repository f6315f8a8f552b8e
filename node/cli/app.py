"""The `meshminer` command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import typer
from rich.table import Table

from node import __version__
from node.cli import doctor as cli_doctor
from node.cli import jobs as cli_jobs
from node.cli import ledger as cli_ledger
from node.cli import service as cli_service
from node.cli import tokenize as cli_tokenize
from node.cli.common import ApiOption, DataDirOption, console, err, fail, get, short

app = typer.Typer(
    help="meshminer: a peer-to-peer volunteer GPU compute network.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
node_app = typer.Typer(
    help="Run and control the local node daemon.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(node_app, name="node")


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", help="print the version")] = False,
) -> None:
    if version:
        console.print(f"meshminer {__version__}")
        raise typer.Exit()


@node_app.command("run")
def node_run(
    data_dir: DataDirOption = None,
    listen: Annotated[
        str | None, typer.Option(help="libp2p listen multiaddr [default /ip4/0.0.0.0/tcp/4470]")
    ] = None,
    http: Annotated[
        str | None, typer.Option(help="HTTP API HOST:PORT [default 127.0.0.1:8470]")
    ] = None,
    bootstrap: Annotated[
        list[str] | None,
        typer.Option(help="peer multiaddr ending in /p2p/<id> to join through (repeatable)"),
    ] = None,
    mdns: Annotated[
        bool | None, typer.Option("--mdns/--no-mdns", help="LAN discovery [default on]")
    ] = None,
    reachability: Annotated[
        str | None,
        typer.Option(help="auto|public|private: behind a NAT, hold relay slots [default auto]"),
    ] = None,
    relay: Annotated[
        bool | None,
        typer.Option("--relay/--no-relay", help="relay for NATed peers when public [default on]"),
    ] = None,
    serve_directory: Annotated[
        bool | None,
        typer.Option(
            "--directory/--no-directory",
            help="keep volunteers' registered ads and answer owners' queries [default off]",
        ),
    ] = None,
    directory_peers: Annotated[
        int | None, typer.Option(help="directories to register this node's ad with [default 2]")
    ] = None,
    gossip_max_peers: Annotated[
        int | None,
        typer.Option(
            help="network size (as directories count it) above which this node's ad is no "
            "longer gossiped [default 100]"
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug|info|warning|error")] = None,
    publish_interval: Annotated[
        float | None, typer.Option(help="seconds between capacity ad refreshes [default 30]")
    ] = None,
    peer_ttl: Annotated[
        float | None,
        typer.Option(help="seconds before a silent peer is dropped [default 3 x publish interval]"),
    ] = None,
    gossip_rate_limit: Annotated[
        float | None, typer.Option(help="gossip msgs/s accepted per peer and topic [default 20]")
    ] = None,
    target_peers: Annotated[
        int | None, typer.Option(help="connections to keep open [default 8]")
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(help="above this many connections, close idle ones [default 16]"),
    ] = None,
    connection_idle: Annotated[
        float | None,
        typer.Option(help="seconds without a new stream before a connection is idle [default 60]"),
    ] = None,
    accepting: Annotated[
        bool | None,
        typer.Option("--accepting/--not-accepting", help="accept work from peers [default yes]"),
    ] = None,
    load_limit: Annotated[
        int | None,
        typer.Option(help="train at most this percent of the time (duty cycle) [default 100]"),
    ] = None,
    max_job_hours: Annotated[
        float | None, typer.Option(help="longest job accepted, hours [default 24]")
    ] = None,
    max_gpu_memory_share: Annotated[
        float | None, typer.Option(help="largest GPU memory share per job (0-1] [default 0.9]")
    ] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            help="seconds without a worker heartbeat before its unit is re-offered [default 15]"
        ),
    ] = None,
    max_upload_mb: Annotated[
        int | None, typer.Option(help="largest data file accepted with a job [default 1024]")
    ] = None,
    max_units: Annotated[
        int | None, typer.Option(help="units this node trains at once [default 1]")
    ] = None,
    allow_owner: Annotated[
        list[str] | None,
        typer.Option(help="take work only from this peer id (repeatable)"),
    ] = None,
    deny_owner: Annotated[
        list[str] | None, typer.Option(help="never take work from this peer id (repeatable)")
    ] = None,
    hours: Annotated[
        str | None,
        typer.Option(help='train only in these local-time windows, e.g. "22:00-07:00"'),
    ] = None,
    idle_minutes: Annotated[
        float | None,
        typer.Option(help="train only after this many minutes without input [default 0: off]"),
    ] = None,
    daily_gpu_hours: Annotated[
        float | None, typer.Option(help="most hours of training a day [default 0: no cap]")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option(help='CUDA devices training may use, e.g. "0,1" [default all]')
    ] = None,
    rebenchmark: Annotated[
        bool, typer.Option(help="re-measure TFLOP/s instead of using the cached figure")
    ] = False,
) -> None:
    """Run the node daemon in the foreground (Ctrl-C or SIGTERM stops it).

    Settings come from meshminer.toml in the data dir; flags override them.
    """
    import trio

    from ledger import LedgerError
    from node.config import ConfigError, data_dir_from, load_settings
    from node.daemon import run_node
    from node.identity import KEY_FILE, IdentityError, load_or_create_identity
    from node.logs import setup_logging
    from node.net.host import HostError
    from node.store import DataDirInUse

    directory = data_dir_from(data_dir)
    overrides: dict[str, Any] = {
        "listen": listen,
        "http": http,
        "bootstrap": bootstrap or None,
        "mdns": mdns,
        "reachability": reachability,
        "relay": relay,
        "directory": serve_directory,
        "directory_peers": directory_peers,
        "gossip_max_peers": gossip_max_peers,
        "log_level": log_level,
        "publish_interval_s": publish_interval,
        "peer_ttl_s": peer_ttl,
        "gossip_rate_limit": gossip_rate_limit,
        "target_peers": target_peers,
        "max_connections": max_connections,
        "connection_idle_s": connection_idle,
        "accepting": accepting,
        "load_limit_pct": load_limit,
        "max_job_hours": max_job_hours,
        "max_gpu_memory_share": max_gpu_memory_share,
        "lease_s": lease,
        "max_upload_mb": max_upload_mb,
        "max_units": max_units,
        "allow_owners": allow_owner or None,
        "deny_owners": deny_owner or None,
        "hours": hours,
        "idle_minutes": idle_minutes,
        "daily_gpu_hours": daily_gpu_hours,
        "gpus": _gpu_list(gpus),
    }
    first_start = not (directory / KEY_FILE).exists()
    try:
        settings = load_settings(directory, overrides)
        identity = load_or_create_identity(directory)
    except (ConfigError, IdentityError) as exc:
        raise fail(f"{exc}\nThe node did not start.", 2) from None
    log_file = setup_logging(settings.log_level, directory)
    _banner(settings, identity.peer_id, directory, log_file, first_start)
    try:
        trio.run(lambda: run_node(settings, identity, directory, rebenchmark=rebenchmark))
    except (HostError, DataDirInUse) as exc:
        raise fail(str(exc)) from None
    except (LedgerError, IdentityError) as exc:
        raise fail(f"{exc}\nThe node did not start.", 2) from None
    except OSError as exc:
        raise fail(
            f"{exc}\nIs another node using this port? Pick another with --http or --listen."
        ) from None


@app.command()
def status(api: ApiOption = None) -> None:
    """Show this node: identity, addresses, capacity, policy."""
    show_status(get(api, "/api/v1/status"))


def show_status(s: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    table.add_row("peer id", s["peer_id"])
    table.add_row("addresses", "\n".join(s["addrs"]))
    gpus = s["capacity"]["gpus"]
    table.add_row("devices", "\n".join(_device(g) for g in gpus))
    table.add_row("throughput", f"{s['capacity']['tflops']:.3f} TFLOP/s")
    table.add_row(
        "torch",
        f"{s['capacity']['torch_version']} (CUDA {s['capacity']['cuda_version'] or 'none'})",
    )
    table.add_row("policy", _policy(s["policy"]))
    paused = s.get("availability", {}).get("paused")
    if paused:
        table.add_row("training", f"not now: {paused}")
    table.add_row("load", f"{s['load']}%")
    for name, state in s.get("sandbox", {}).items():
        table.add_row(f"sandbox: {name.replace('_', ' ')}", state)
    table.add_row("peers", f"{s['peers']} known, {s['connections']} connected")
    d = s.get("discovery") or {}
    if "window_s" in d:
        table.add_row(
            "discovery",
            f"{d['ads_in']:g} ads/min in, {d['ads_out']:g} out, "
            f"{d['check_cpu_ms']:g} ms CPU/min checking them; node CPU {d['node_cpu_pct']:g}%",
        )
    if d.get("directories") or "directory_holds" in d:
        mode = "its ad gossiped" if d.get("gossips_own_ad", True) else "its ad to directories only"
        held = f"; a directory holding {d['directory_holds']}" if "directory_holds" in d else ""
        table.add_row(
            "directories",
            f"{d.get('directories', 0)} known, registered with {len(d.get('registered_with', []))}"
            f"; ~{d.get('network_size', 0)} peers, {mode}{held}",
        )
    table.add_row("uptime", f"{s['uptime_s']:.0f} s")
    table.add_row("version", s["version"])
    console.print(table)


@app.command()
def peers(
    api: ApiOption = None,
    find: Annotated[
        int | None,
        typer.Option(
            help="instead: find up to this many peers that could take a job now (asks "
            "directories, probes each)",
        ),
    ] = None,
    gpu: Annotated[str, typer.Option(help="with --find: preferred|required|none")] = "preferred",
    min_gpu_memory_gb: Annotated[float, typer.Option(help="with --find")] = 0.0,
    max_hours: Annotated[float, typer.Option(help="with --find: the job's max_hours")] = 1.0,
) -> None:
    """List the peers this node knows, from their signed capacity ads."""
    if find is not None:
        query = urlencode(
            {"k": find, "gpu": gpu, "min_gpu_memory_gb": min_gpu_memory_gb, "max_hours": max_hours}
        )
        found = get(api, f"/api/v1/peers/find?{query}", timeout=60)
        title = (
            f"{len(found['peers'])} of {find} found in {found['seconds']:.2f} s "
            f"({found['probed']} probed, {found['dead']} did not answer, "
            f"{found['from_directories']} from directories)"
        )
        _peer_table(found["peers"], title)
        for note in found["notes"]:
            console.print(note)
        return
    rows = get(api, "/api/v1/peers")
    _peer_table(rows, f"{len(rows)} peers")


def _peer_table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for column in ("peer", "GPUs", "TFLOP/s", "load", "policy", "last seen"):
        table.add_column(column, justify="right" if column in ("TFLOP/s", "load") else "left")
    now = time.time()
    for p in rows:
        seen = f"{max(0.0, now - p['last_seen']):.0f} s ago" + (" (stale)" if p["stale"] else "")
        table.add_row(
            short(p["peer_id"]),
            "\n".join(_device(g) for g in p["gpus"]),
            f"{p['tflops']:.3f}",
            f"{p['load']}%",
            _policy(p["policy"]) + (" (directory)" if p.get("directory") else ""),
            seen,
        )
    console.print(table)


cli_jobs.register(app, node_app)
cli_ledger.register(app)
cli_doctor.register(app)
cli_tokenize.register(app)
cli_service.register(node_app, show_status)


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="leave the network running until Ctrl-C")] = False,
    nodes: Annotated[
        int | None, typer.Option(help="how many nodes to start (3; elastic: 4)")
    ] = None,
    mode: Annotated[
        str, typer.Option(help="single: one peer trains the job; elastic: several, in rounds")
    ] = "single",
    rounds: Annotated[int, typer.Option(help="rounds of the elastic job (3 or more)")] = 6,
) -> None:
    """Start a local network on loopback, train a job across it and show where to look."""
    from node.demo import run_demo

    if mode not in ("single", "elastic"):
        raise typer.BadParameter("--mode must be single or elastic", param_hint="--mode")
    count = nodes if nodes is not None else (4 if mode == "elastic" else 3)
    if mode == "elastic" and count < 3:
        raise typer.BadParameter("the elastic demo needs at least 3 nodes", param_hint="--nodes")
    if rounds < 3:
        raise typer.BadParameter("the elastic demo needs 3 rounds or more", param_hint="--rounds")
    sys.exit(run_demo(nodes=count, keep=keep, console=console, mode=mode, rounds=rounds))


def _banner(settings: Any, peer_id: str, directory: Path, log_file: Path, first: bool) -> None:
    """Where things are; on the first start, also how to join a network."""
    host, _, port = settings.http.rpartition(":")
    page = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/"
    err.print(
        f"meshminer {__version__}\n"
        f"  peer id   {peer_id}\n"
        f"  data dir  {directory}  (settings: {directory / 'meshminer.toml'})\n"
        f"  log       {log_file}\n"
        f"  status    {page}",
        highlight=False,
    )
    if not first:
        return
    port = settings.listen.rsplit("/", 1)[-1]
    err.print(
        "First start: this node has a new identity.\n"
        "  To join a network, start with --bootstrap /ip4/<host>/tcp/<port>/p2p/<peer id> of "
        "a node in it\n  (nodes on this LAN are found without it, by mDNS).\n"
        f"  Others join this node with --bootstrap /ip4/<this machine's IP>/tcp/{port}/p2p/"
        f"{peer_id}",
        highlight=False,
    )


def _gpu_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [p for p in text.replace(",", " ").split() if p]
    if not all(p.isdigit() for p in parts):
        raise typer.BadParameter('device indexes like "0,1"', param_hint="--gpus")
    return [int(p) for p in parts]


def _device(g: dict) -> str:
    if g["kind"] == "cpu":
        return f"CPU {g['name']}"
    return f"{g['name']} {g['memory_total_mb'] / 1024:.0f} GiB (sm {g['compute_capability']})"


def _policy(p: dict) -> str:
    if not p["accepting"]:
        return "paused"
    return (
        f"accepting, training ≤{p['load_limit_pct']}% of the time, ≤{p['max_job_hours']:g} h jobs"
    )
