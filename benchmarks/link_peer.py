"""One end of a `benchmarks.links` transfer, run inside a network namespace.

    python -m benchmarks.link_peer ROLE CONFIG.json

Roles: `relay` (a public relay), `serve` (holds the blob; behind a NAT it holds a
slot on the relay), `fetch` (fetches the blob one way: `direct` channel, `punched`
libp2p stream over a hole-punched connection, or `relayed`). Each writes what the
others need (addresses, ports, results) as JSON files in the config's folder.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import trio
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.host import MeshHost
from node.net.relay import RelayOptions
from node.work.blobs import (
    BlobServer,
    BlobStore,
    fetch_blob_direct,
    fetch_blob_libp2p,
    make_request,
    serve_blobs_libp2p,
)

PUNCH_WAIT_S = 30.0


def _write(folder: Path, name: str, value: dict[str, Any]) -> None:
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(value))
    tmp.replace(folder / f"{name}.json")


async def _read(folder: Path, name: str, timeout: float = 60.0) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while not (folder / f"{name}.json").exists():
            await trio.sleep(0.1)
    return json.loads((folder / f"{name}.json").read_text())


async def relay(cfg: dict[str, Any], folder: Path) -> None:
    identity = Identity(SigningKey(bytes.fromhex(cfg["relay_seed"])))
    options = RelayOptions(serve=True, circuit_bytes=4 << 30)
    listen = f"/ip4/{cfg['ip']}/tcp/4470"
    async with MeshHost.start(identity, listen, relay=options) as host:
        _write(folder, "relay", {"addr": host.addrs()[0]})
        await trio.sleep_forever()


async def serve(cfg: dict[str, Any], folder: Path) -> None:
    owner = Identity(SigningKey(bytes.fromhex(cfg["owner_seed"])))
    store = BlobStore(Path(cfg["store"]), durable=False)
    key = bytes.fromhex(cfg["job_key"])
    server = BlobServer(store, owner, cfg["ip"], 0, lambda j, u: key)
    port = await trio.to_thread.run_sync(server.start)
    async with MeshHost.start(owner, f"/ip4/{cfg['ip']}/tcp/{cfg['port']}") as host:
        serve_blobs_libp2p(host, store, lambda j, u: key)
        circuit = ""
        if cfg.get("relayed"):
            relay_addr = (await _read(folder, "relay"))["addr"]
            await host.connect(relay_addr)
            circuit = await host.relay.reserve(relay_addr)
        _write(folder, f"serve-{cfg['name']}", {"port": port, "circuit": circuit})
        await trio.sleep_forever()


async def fetch(cfg: dict[str, Any], folder: Path) -> None:
    worker = Identity(SigningKey(bytes.fromhex(cfg["worker_seed"])))
    store = BlobStore(Path(cfg["store"]), durable=False)
    key, sha, grant = bytes.fromhex(cfg["job_key"]), cfg["sha"], bytes.fromhex(cfg["grant"])
    served = await _read(folder, f"serve-{cfg['server']}")
    how = cfg["how"]
    async with MeshHost.start(worker, f"/ip4/{cfg['ip']}/tcp/{cfg['port']}") as host:
        request = make_request(worker, grant, sha)
        if how == "direct":
            began = time.perf_counter()
            await trio.to_thread.run_sync(
                lambda: fetch_blob_direct(
                    cfg["server_ip"], served["port"], request, key, store, sha, 1 << 40
                )
            )
            path = "direct channel"
        else:
            peer = await host.connect(served["circuit"])
            if how == "punched":
                with trio.fail_after(PUNCH_WAIT_S):
                    while host.path_to(peer) != "direct":
                        await trio.sleep(0.1)
            path = host.path_to(peer)
            began = time.perf_counter()
            await fetch_blob_libp2p(host, peer, request, key, store, sha, 1 << 40)
        seconds = time.perf_counter() - began
    _write(folder, f"fetched-{cfg['name']}", {"seconds": seconds, "path": path})


def main() -> None:
    role, config = sys.argv[1], Path(sys.argv[2])
    cfg = json.loads(config.read_text())
    trio.run({"relay": relay, "serve": serve, "fetch": fetch}[role], cfg, config.parent)


if __name__ == "__main__":
    main()
