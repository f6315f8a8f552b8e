"""What every benchmark shares: real node processes on loopback, deadline waits, results.

Benchmarks drive `meshminer node run` subprocesses, one per node as users run them, so
the figures include the process, HTTP and libp2p costs a user pays. Results are shown
with rich and kept as JSON in benchmarks/results/ (git-ignored) so docs can cite a run.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from node.demo.localnet import free_port

RESULTS_DIR = Path(__file__).parent / "results"
MESHMINER = str(Path(sys.executable).with_name("meshminer"))
STATUS = "/api/v1/status"
T = TypeVar("T")
console = Console()


@dataclass
class Result:
    """One benchmark's table plus the raw numbers behind it (`meta`)."""

    name: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def show(self) -> None:
        table = Table(title=self.name)
        for column in self.columns:
            table.add_column(column)
        for row in self.rows:
            table.add_row(*(_fmt(v) for v in row))
        console.print(table)

    def save(self) -> Path:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"{self.name}.json"
        data = {"name": self.name, "columns": self.columns, "rows": self.rows, "meta": self.meta}
        path.write_text(json.dumps(data, indent=2, default=str))
        return path


def run_parts(name: str, parts: Sequence[str], runs: dict[str, Callable[[], Result]]) -> None:
    """Run the named parts in order, showing each as it ends and saving all of them so
    far as `results/<name>.json` (a later part's failure keeps what came before)."""
    meta: dict[str, Any] = {}
    for part_name in parts:
        part = runs[part_name]()
        part.show()
        meta[part.name] = {"rows": part.rows, **part.meta}
        print(f"results: {Result(name, ['part'], meta=meta).save()}")


def _fmt(v: Any) -> str:
    """Three significant digits, without switching to exponents below a million."""
    if not isinstance(v, float) or math.isnan(v):
        return str(v)
    return f"{v:.0f}" if 1000 <= abs(v) < 1e6 else f"{v:.3g}"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values, never an error."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def wait_for(cond: Callable[[], T | None], timeout: float, what: str, every: float = 0.25) -> T:
    """Poll `cond` until it returns a truthy value; a node still starting (refused
    connection, 503) counts as "not yet". Raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
            if value:
                return value
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(every)


def snapshot(rev: str) -> tuple[Path, str]:
    """Export commit `rev` to a temp dir (returns it and the full sha): nodes run from it
    via PYTHONPATH, so a run measures one named commit while others edit the tree."""
    repo = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(repo)]
    sha = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True, check=True)
    dest = Path(tempfile.mkdtemp(prefix="meshminer-src-"))
    tree = subprocess.run([*git, "archive", sha.stdout.strip()], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=tree.stdout, check=True)
    return dest, sha.stdout.strip()


def _die_with_parent() -> None:
    """Own session (a Ctrl-C reaches only us; we stop the nodes) and SIGKILL if we die."""
    os.setsid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned nodes


@dataclass
class Node:
    """One node process and its HTTP API."""

    index: int
    proc: subprocess.Popen[bytes]
    data_dir: Path
    http: httpx.Client
    peer_id: str = ""

    def get(self, path: str) -> Any:
        """GET JSON (or text); a node that died raises at once with its log tail, rather than
        failing a wait at its deadline; an HTTP error names the node."""
        if self.proc.poll() is not None:
            tail = (self.data_dir / "stderr.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"node {self.index} exited ({self.proc.returncode}):\n{tail}")
        try:
            response = self.http.get(path).raise_for_status()
        except httpx.HTTPError as exc:
            exc.add_note(f"node {self.index}: GET {path}, process exit code {self.proc.poll()}")
            raise
        json = response.headers.get("content-type", "").startswith("application/json")
        return response.json() if json else response.text

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by full name, labels included."""
        lines = [
            ln.rsplit(" ", 1) for ln in self.get("/metrics").splitlines() if ln[:1] not in ("", "#")
        ]
        return {name: float(value) for name, value in lines}

    def cpu_s(self) -> float:
        """User + system CPU seconds of the node process (all its threads)."""
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def problems(self) -> list[str]:
        """WARNING/ERROR/traceback lines from the node's stderr log."""
        text = (self.data_dir / "stderr.log").read_text(errors="replace")
        keys = ("WARNING", "ERROR", "CRITICAL", "Traceback", "Error:")
        return [line for line in text.splitlines() if any(k in line for k in keys)]


def total(metrics: dict[str, float], name: str) -> float:
    """Sum of a metric over all its label sets."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


class Cluster:
    """N nodes on 127.0.0.1 bootstrapping from node 0; stopped on exit, even on error."""

    def __init__(self, node_args: Sequence[str], keep: bool = False, src: Path | None = None):
        self.args = list(node_args)
        self.env = {**os.environ, "PYTHONPATH": str(src)} if src else None
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="meshminer-bench-"))
        self.nodes: list[Node] = []
        self.bootstrap = ""
        self.killed: list[int] = []  # nodes that ignored SIGTERM for 5 s (a finding)
        self.start_s = 0.0

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, n: int, timeout: float = 180.0, first: Sequence[str] = ()) -> list[Node]:
        """Start n nodes (node 0 with the extra flags `first`); returns once every API
        answers (`start_s` says how long that took)."""
        t0, node0 = time.monotonic(), self.add(first)
        self.bootstrap = wait_for(lambda: node0.get(STATUS)["addrs"][0], timeout, "node 0 API")
        for _ in range(n - 1):
            self.add()
        for nd in self.nodes:
            nd.peer_id = wait_for(lambda nd=nd: nd.get(STATUS)["peer_id"], timeout, "node APIs")
        self.start_s = time.monotonic() - t0
        return self.nodes

    def add(self, extra: Sequence[str] = (), data_dir: Path | None = None) -> Node:
        """Start one more node (bootstrapping from node 0 once there is one); with
        `data_dir`, a node that ran before restarts from it (its identity, its node.db)."""
        index = len(self.nodes)
        if data_dir is None:
            data_dir = self.root / f"n{index}"
            data_dir.mkdir()
        if self.nodes and (self.nodes[0].data_dir / "capacity.json").exists():
            # reuse node 0's cached TFLOP/s: N startup matmul benchmarks on 2 cores measure
            # nothing gossip-related and would delay and skew the start
            shutil.copy(self.nodes[0].data_dir / "capacity.json", data_dir)
        listen, http = free_port(), free_port()
        # cold runners: a cluster measures discovery, and a fork server warming at every
        # node's start (`warm_runners`) would take the CPU its joins are timed by
        cmd = [MESHMINER, "node", "run", "--no-mdns", "--cold-runners", "--data-dir", str(data_dir)]
        cmd += ["--listen", f"/ip4/127.0.0.1/tcp/{listen}", "--http", f"127.0.0.1:{http}"]
        cmd += [*self.args, *extra, *(["--bootstrap", self.bootstrap] if self.bootstrap else [])]
        with open(data_dir / "stderr.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=log, env=self.env, preexec_fn=_die_with_parent
            )
        client = httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=10.0)
        self.nodes.append(Node(index, proc, data_dir, client))
        return self.nodes[-1]

    def stop(self) -> None:
        """SIGTERM every node, SIGKILL whatever still runs 5 s later; remove the temp dir."""
        alive = [n for n in self.nodes if n.proc.poll() is None]
        for node in alive:
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for node in alive:
            try:
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
                self.killed.append(node.index)
        for node in self.nodes:
            node.http.close()
        if self.keep:
            console.print(f"node data dirs and logs kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)
