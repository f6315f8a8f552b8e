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
from node.cli.settings_options import with_setting_options

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
@with_setting_options
def node_run(
    overrides: dict[str, Any],
    data_dir: DataDirOption = None,
    rebenchmark: Annotated[
        bool, typer.Option(help="re-measure TFLOP/s instead of using the cached figure")
    ] = False,
) -> None:
    """Run the node daemon in the foreground (Ctrl-C or SIGTERM stops it).

    Settings come from meshminer.toml in the data dir; flags override them
    (docs/settings.md lists them all).
    """
    from node.identity import KEY_FILE, IdentityError, load_or_create_identity
    from node.machine.capacity import measure_elsewhere
    from node.settings import ConfigError, data_dir_from, load_settings

    directory = data_dir_from(data_dir)
    first_start = not (directory / KEY_FILE).exists()
    try:
        settings = load_settings(directory, overrides)
        identity = load_or_create_identity(directory)
    except (ConfigError, IdentityError) as exc:
        raise fail(f"{exc}\nThe node did not start.", 2) from None
    measuring = measure_elsewhere(directory, rebenchmark)  # meanwhile, the imports below

    import trio

    from ledger import LedgerError
    from node.daemon import run_node
    from node.logs import setup_logging
    from node.net.host import HostError
    from node.shutdown import exit_now
    from node.store import DataDirInUse

    log_file = setup_logging(settings.log_level, directory)
    _banner(settings, identity.peer_id, directory, log_file, first_start)
    try:
        trio.run(
            lambda: run_node(
                settings, identity, directory, rebenchmark=rebenchmark, measuring=measuring
            )
        )
    except (HostError, DataDirInUse) as exc:
        raise fail(str(exc)) from None
    except (LedgerError, IdentityError) as exc:
        raise fail(f"{exc}\nThe node did not start.", 2) from None
    except OSError as exc:
        raise fail(
            f"{exc}\nIs another node using this port? Pick another with --http or --listen."
        ) from None
    # stopped and its stores closed: leave without the interpreter's teardown, which
    # took seconds of CPU time on a loaded machine (node.shutdown)
    exit_now(0)


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
        if d.get("directory_crowded"):
            held += " (crowded: the network needs another directory)"
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
    from node.demo.run import run_demo

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
