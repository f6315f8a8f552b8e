"""`meshminer demo`: a local network of real nodes on loopback, end to end."""

from __future__ import annotations

import contextlib
import signal
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from node.localnet import LocalNetwork


def run_demo(nodes: int, keep: bool, console: Console) -> int:
    root = Path(tempfile.mkdtemp(prefix="meshminer-demo-"))
    console.print(f"Starting {nodes} nodes on 127.0.0.1 (data dirs under {root})")
    started = time.monotonic()
    with LocalNetwork(root, ["--publish-interval", "5"]) as net:
        try:
            for _ in range(nodes):
                node = net.add()
                console.print(f"  {node.name}: {node.peer_id}  API {node.api}")
            net.wait_all_see_each_other(timeout=60)
        except (TimeoutError, RuntimeError) as exc:
            console.print(f"[red]demo failed:[/red] {exc}")
            for node in net.nodes:
                console.print(f"--- {node.name} log ({node.log_path}) ---\n{node.log_tail()}")
            return 1
        console.print(f"All nodes found each other in {time.monotonic() - started:.1f} s.")
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
        first = net.nodes[0]
        console.print(
            f"Look around: {first.api}/api/v1/status, {first.api}/api/v1/peers, "
            f"{first.api}/metrics; logs in {root}/node*/logs/node.log"
        )
        console.print(f"Or: meshminer peers --api {first.api}")
        if keep:
            console.print("Network is running; press Ctrl-C to stop it.")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        console.print("Stopping nodes...")
    console.print("Done: all nodes stopped.")
    return 0
