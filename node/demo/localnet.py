"""A network of real node processes on loopback: for `meshminer demo`, the tests and
the benchmarks. Each node is `python -m node node run` with its own data dir and ports.

The nodes share one machine's cores, so each node's training runs one torch thread
(unless the environment sets the thread counts): runners of several nodes that each
spawn a thread per core spin against each other, and a round of an elastic job took
10 to 20 times longer that way on 2 cores.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from node.client import ApiError, NodeUnreachable, request_json
from node.machine import CACHE_FILE as CAPACITY_CACHE

T = TypeVar("T")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the first node's TFLOP/s measurement (`capacity.json`), given to the nodes started
# after it: they run on the same machine, and measuring costs each ~1-2 s of CPU
# while its neighbours start too
_measured: dict[str, bytes] = {}


def _port_slice() -> range:
    """Ports below the kernel's ephemeral range, one slice per pytest-xdist worker.

    A port from bind(0) is an ephemeral one: an outbound connection's local end can take it
    between our probe and the node's bind ("address already in use" under parallel tests).
    The kernel never hands out ports below the range, so only callers of `free_port` compete
    for them, and parallel test workers draw from disjoint slices.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = min(10000, low // 2)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker) if worker.isdigit() else 0
    size = (low - first) // max(workers, 1)
    return range(first + index * size, first + (index + 1) * size)


_next_port: list[int] = []  # this process's cursor in its slice, so no port is handed out twice


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that this process has not handed out
    before (until it has cycled through its whole slice of thousands of ports)."""
    ports = _port_slice()
    if not _next_port:
        _next_port.append(random.randrange(len(ports)))
    for _ in range(len(ports)):
        port = ports[_next_port[0] % len(ports)]
        _next_port[0] += 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {ports.start}-{ports.stop - 1}")


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `condition` until it returns something truthy; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (NodeUnreachable, ApiError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


@dataclass
class LocalNode:
    name: str
    data_dir: Path
    p2p_port: int
    http_port: int
    args: list[str]
    http_host: str = "127.0.0.1"  # what the API binds to; clients always use loopback
    env: dict[str, str] = field(default_factory=dict)  # over this process's environment
    listen_ip: str = "127.0.0.1"  # libp2p's
    netns: str = ""  # a network namespace to run in (`ip netns exec`), for NAT tests
    proc: subprocess.Popen | None = None
    peer_id: str = ""
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "stderr.log"

    @property
    def api(self) -> str:
        host = "127.0.0.1" if self.http_host in ("127.0.0.1", "0.0.0.0") else self.http_host
        return f"http://{host}:{self.http_port}"

    @property
    def multiaddr(self) -> str:
        return f"/ip4/{self.listen_ip}/tcp/{self.p2p_port}/p2p/{self.peer_id}"

    @property
    def token(self) -> str | None:
        """The node's API token (every request needs it on a non-loopback bind)."""
        path = self.data_dir / "api.token"
        return path.read_text().strip() if path.exists() else None

    def get(self, path: str) -> Any:
        return request_json(self.api, "GET", path, token=self.token)

    def submit_spec(self, spec_toml: str) -> str:
        """Submit a job whose spec needs no data file; its id."""
        body = {"spec": spec_toml}
        return request_json(self.api, "POST", "/api/v1/jobs", body, token=self.token)["id"]

    def wait_job_end(self, job_id: str, timeout: float) -> dict:
        """Job `job_id` of this node once it has ended (completed, failed, cancelled)."""

        def ended() -> dict | None:
            job = self.get(f"/api/v1/jobs/{job_id}")
            return job if job["state"] in ("completed", "failed", "cancelled") else None

        return wait_for(ended, timeout, f"job {job_id} to end")

    def peer_ids(self) -> set[str]:
        return {p["peer_id"] for p in self.get("/api/v1/peers")}

    def start(self, ready_timeout: float = 60) -> LocalNode:
        self.launch()
        return self.wait_ready(ready_timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (see `wait_ready`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cache = self.data_dir / CAPACITY_CACHE
        if "capacity" in _measured and not cache.exists():
            cache.write_bytes(_measured["capacity"])
        cmd = [
            *(["ip", "netns", "exec", self.netns] if self.netns else []),
            sys.executable,
            "-m",
            "node",
            "node",
            "run",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"/ip4/{self.listen_ip}/tcp/{self.p2p_port}",
            "--http",
            f"{self.http_host}:{self.http_port}",
            "--no-mdns",
            "--train-on-battery",  # a laptop running the demo or the tests trains anyway
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**ONE_THREAD, **os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )

    def wait_ready(self, timeout: float = 60) -> LocalNode:
        status = wait_for(self._ready, timeout, f"node {self.name} to answer on {self.api}")
        self.peer_id = status["peer_id"]
        cache = self.data_dir / CAPACITY_CACHE
        if "capacity" not in _measured and cache.exists():
            _measured["capacity"] = cache.read_bytes()
        return self

    def _ready(self) -> dict | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"node {self.name} exited with {self.proc.returncode}; log:\n{self.log_tail()}"
            )
        try:
            return self.get("/api/v1/status")
        except NodeUnreachable:
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        """Send `sig` and wait for exit (SIGKILL after `timeout`); returns the exit code.

        The node bounds its own stop (`node.shutdown.SHUTDOWN_S`, 10 s); the default
        here is well beyond it, so that only a node that ignores its deadline is killed,
        however loaded the machine."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class LocalNetwork:
    """Nodes on 127.0.0.1 under `root`; the first one is everybody's bootstrap peer."""

    def __init__(self, root: Path, node_args: list[str] | None = None) -> None:
        self.root = root
        self.node_args = list(node_args or [])
        self.nodes: list[LocalNode] = []

    def add(
        self,
        extra_args: list[str] | None = None,
        bootstrap: bool = True,
        http_host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> LocalNode:
        """Start one more node (joining through the first) and wait until it answers."""
        return self.add_many(1, extra_args, bootstrap, http_host=http_host, env=env)[0]

    def add_many(
        self,
        count: int,
        extra_args: list[str] | None = None,
        bootstrap: bool = True,
        ready_timeout: float = 90,
        http_host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ) -> list[LocalNode]:
        """Start `count` nodes at once (they boot in parallel), then wait for all."""
        new = []
        for _ in range(count):
            name = f"node{len(self.nodes) + 1}"
            args = [*self.node_args, *(extra_args or [])]
            if bootstrap and self.nodes and self.nodes[0].peer_id:
                args += ["--bootstrap", self.nodes[0].multiaddr]
            node = LocalNode(
                name, self.root / name, free_port(), free_port(), args, http_host, dict(env or {})
            )
            self.nodes.append(node)
            node.launch()
            new.append(node)
        for node in new:
            node.wait_ready(ready_timeout)
        return new

    def start(self, count: int) -> list[LocalNode]:
        """The first node, then the rest in parallel, all bootstrapping from the first."""
        self.add()
        if count > 1:
            self.add_many(count - 1)
        return self.nodes

    def wait_all_see_each_other(self, timeout: float) -> None:
        def complete() -> bool:
            running = [n for n in self.nodes if n.proc and n.proc.poll() is None]
            ids = {n.peer_id for n in running}
            return all(ids - {n.peer_id} <= n.peer_ids() for n in running)

        wait_for(complete, timeout, f"{len(self.nodes)} nodes to discover each other", 0.25)

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
