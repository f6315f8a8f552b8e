"""`meshminer demo`: a local network of real nodes on loopback that trains a real job.

Three nodes start and find each other; node 1 submits a digits classifier; a peer
trains it in a sandboxed subprocess and returns signed weights, which node 1 checks
and stores; both sides keep the receipt. `--mode elastic` trains one job on several
peers at once instead (`node.demo.elastic`).
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from node.client import ApiError, NodeUnreachable, request_json
from node.demo.elastic import run_elastic
from node.demo.localnet import LocalNetwork, LocalNode
from training.spec.examples import digits_toml

DEMO_SPEC = digits_toml()


def run_demo(
    nodes: int, keep: bool, console: Console, mode: str = "single", rounds: int = 6
) -> int:
    """Start `nodes` nodes and train the demo job of `mode` ("single" or "elastic",
    for `rounds` rounds)."""
    root = Path(tempfile.mkdtemp(prefix="meshminer-demo-"))
    started = time.monotonic()
    with LocalNetwork(root, ["--publish-interval", "5"]) as net:
        try:
            net.start(nodes)
            console.print(
                f"[bold]Status page: {net.nodes[0].api}/[/bold]  (open it to watch the job)",
                highlight=False,
            )
            console.print(f"Started {nodes} nodes on 127.0.0.1 (data dirs under {root})")
            for node in net.nodes:
                console.print(f"  {node.name}: {node.peer_id}  API {node.api}")
            net.wait_all_see_each_other(timeout=60)
            console.print(f"All nodes found each other in {time.monotonic() - started:.1f} s.")
            _show_peers(net, console)
            owner = net.nodes[0]
            if mode == "elastic":
                job = run_elastic(net, root, console, rounds)
            else:
                job = _train(owner, root, console)
        except (TimeoutError, RuntimeError, ApiError, NodeUnreachable) as exc:
            console.print(f"[red]demo failed:[/red] {exc}")
            for node in net.nodes:
                console.print(f"--- {node.name} log ({node.log_path}) ---\n{node.log_tail()}")
            return 1
        if job["state"] != "completed":
            console.print(f"[red]the job {job['state']}:[/red] {job['reason']}")
            return 1
        if mode != "elastic":
            _report(owner, job, net, root, console)
        console.print(
            f"  status page: {owner.api}/   API: {owner.api}/api/v1/status"
            f"   peers: {owner.api}/api/v1/peers"
            f"   metrics: {owner.api}/metrics"
        )
        console.print(f"  logs: {root}/node*/logs/node.log")
        console.print(f"  try: meshminer jobs --api {owner.api}")
        if keep:
            console.print("Network is running; press Ctrl-C to stop it.")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        console.print("Stopping nodes...")
    console.print("Done: all nodes stopped.")
    return 0


def _report(owner: LocalNode, job: dict, net: LocalNetwork, root: Path, console: Console) -> None:
    trainer = next((n.name for n in net.nodes if n.peer_id == job["worker"]), "?")
    weights = root / "digits-mlp.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job['id']}/weights", weights)
    metrics = job["metrics"]
    console.print(
        f"\n[bold green]Job {job['id']} completed[/bold green]: trained by "
        f"{trainer} ({job['worker']}) on {metrics.get('device', '?')}"
    )
    console.print(
        f"  validation accuracy {metrics.get('val_accuracy', float('nan')):.3f}, "
        f"validation loss {metrics.get('val_loss', float('nan')):.4f}, "
        f"{metrics.get('steps', 0)} steps"
    )
    console.print(f"  weights (checked, sha256 {job['weights_sha256'][:16]}…): {weights}")
    console.print(f"  job details: {owner.api}/api/v1/jobs/{job['id']}")


def _show_peers(net: LocalNetwork, console: Console) -> None:
    table = Table(title="What each node knows (GET /api/v1/peers)")
    for column in ("node", "peer id", "sees", "TFLOP/s of peers"):
        table.add_column(column)
    for node in net.nodes:
        peers = node.get("/api/v1/peers")
        table.add_row(
            node.name,
            node.peer_id[-10:],
            ", ".join(p["peer_id"][-6:] for p in peers),
            ", ".join(f"{p['tflops']:.3f}" for p in peers),
        )
    console.print(table)


def _train(owner: LocalNode, root: Path, console: Console, timeout: float = 600) -> dict:
    """Submit the demo job on `owner` and follow it to the end."""
    (root / "digits-mlp.toml").write_text(DEMO_SPEC)
    job = request_json(owner.api, "POST", "/api/v1/jobs", {"spec": DEMO_SPEC})
    console.print(
        f"\n{owner.name} submitted job {job['id']} (digits MLP, 500 steps; spec in "
        f"{root / 'digits-mlp.toml'})"
    )
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("queued", total=None, loss="")
        while time.monotonic() < deadline:
            job = owner.get(f"/api/v1/jobs/{job['id']}")
            p = job["progress"]
            where = f" on {job['worker'][-6:]}" if job["worker"] else ""
            total = p.get("total_steps") or None
            # a short job ends between two heartbeats: its last step was never reported
            done = job["state"] == "completed" and total
            bar.update(
                task,
                description=f"{job['state']}{where}",
                total=total,
                completed=total if done else p.get("step", 0),
                loss=f"loss {p['loss']:.4f}" if p.get("loss") is not None else "",
            )
            if job["state"] in ("completed", "failed", "cancelled"):
                return job
            time.sleep(0.3)
    raise TimeoutError(f"the demo job did not finish within {timeout:.0f} s")
