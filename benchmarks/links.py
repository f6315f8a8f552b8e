"""Links through NATs: a blob over the direct channel, a hole-punched connection and a
relay, against iperf3 on the same shaped links.

    .venv/bin/python -m benchmarks.links [--mib 256] [--rates 100mbit 1gbit]

Needs root, `ip`, `nft`, `tc` and `iperf3`. Builds the namespaces of
`tests/netlab/lab.py` (a public host, home A behind a cone NAT, home B behind a
symmetric one, home C behind a cone one) and shapes every WAN link with `tc tbf` to
each `--rates` value (each direction crosses one shaped egress). Then, per rate:

- **iperf3**, the baseline: TCP from the public host to home A (`-R`), 5 s.
- **direct channel**: a blob server on the public host, fetched from A with
  `fetch_blob_direct` (as a node fetches from a reachable peer).
- **hole-punched**: the blob in C, which holds a slot on the public relay; A dials it
  through the relay, waits for DCUtR's direct connection, and fetches over libp2p.
- **relayed**: the blob in B (symmetric NAT: no hole punch), fetched over libp2p
  through the relay (its circuit limit raised for the run).

Goal: the direct channel at >= 0.9 of iperf3. Prints a table and writes
benchmarks/results/links.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nacl.signing import SigningKey

from benchmarks.harness import Result, run_parts
from node.identity import Identity
from node.work.blobs import BlobStore
from protocol import seal
from protocol.blobs import BlobGrant
from protocol.crypto import new_job_key

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "netlab"))
from lab import Lab  # noqa: E402

JOB, UNIT = "ab" * 8, "cd" * 8
SHAPED = (("pub", "wan0"), ("ra", "wan0"), ("rb", "wan0"), ("rc", "wan0"))
TRANSFER_TIMEOUT_S = 600.0


def _shape(lab: Lab, rate: str) -> None:
    bits = {"mbit": 1e6, "gbit": 1e9}[rate[-4:]] * float(rate[:-4])
    burst = f"{max(32, int(bits / 8 / 100 / 1024))}kb"  # 10 ms at the rate
    for ns, dev in SHAPED:
        done = lab.exec(ns, ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                             rate, "burst", burst, "latency", "100ms"])  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"tc in {ns}: {done.stderr.strip()}")


def _iperf3(lab: Lab, seconds: int = 5) -> float:
    """Bytes/s from the public host to home A."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", lab.ns("pub"), "iperf3", "-s", "-1", "-B", lab.publics["pub"]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            done = lab.exec("a", ["iperf3", "-c", lab.publics["pub"], "-R", "-t", str(seconds),
                                  "-J"])  # fmt: skip
            if done.returncode == 0:
                report = json.loads(done.stdout)
                return report["end"]["sum_received"]["bits_per_second"] / 8
            time.sleep(0.2)  # the server is not listening yet
        raise RuntimeError(f"iperf3 failed: {done.stderr or done.stdout}")
    finally:
        server.kill()
        server.wait()


class _Peers:
    """`benchmarks.link_peer` processes in the lab's namespaces; all stopped at the end."""

    def __init__(self, lab: Lab, folder: Path) -> None:
        self.lab, self.folder, self.procs = lab, folder, []

    def start(self, ns: str, role: str, name: str, cfg: dict[str, Any]) -> None:
        path = self.folder / f"{role}-{name}.cfg.json"
        path.write_text(json.dumps(cfg))
        log = open(self.folder / f"{role}-{name}.log", "wb")  # noqa: SIM115 (kept for the process)
        self.procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.lab.ns(ns),
                    sys.executable,
                    "-m",
                    "benchmarks.link_peer",
                    role,
                    str(path),
                ],  # fmt: skip
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def result(self, name: str) -> dict[str, Any]:
        path = self.folder / f"fetched-{name}.json"
        deadline = time.monotonic() + TRANSFER_TIMEOUT_S
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result for {name}; logs in {self.folder}")
            time.sleep(0.2)
        return json.loads(path.read_text())

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.procs.clear()


def _transfers(lab: Lab, folder: Path, mib: int) -> dict[str, dict[str, Any]]:
    """The blob over each path, one fetch each; {path: {"seconds", "path"}}."""
    owner, worker = Identity(SigningKey.generate()), Identity(SigningKey.generate())
    size, key = mib << 20, new_job_key()
    data = os.urandom(size)
    base = {"owner_seed": owner.seed.hex(), "worker_seed": worker.seed.hex(), "job_key": key.hex()}
    cases = {  # name: (server namespace, its IP, behind a NAT)
        "direct channel": ("pub", lab.publics["pub"], False),
        "hole-punched": ("c", lab.homes["c"], True),
        "relayed": ("b", lab.homes["b"], True),
    }
    peers = _Peers(lab, folder)
    found = {}
    try:
        relay = {"relay_seed": SigningKey.generate().encode().hex(), "ip": lab.publics["pub"]}
        peers.start("pub", "relay", "relay", relay)
        for name, (ns, ip, nated) in cases.items():
            store = folder / f"store-{ns}"
            sha = BlobStore(store, durable=False).put_bytes(data)
            grant = seal(
                BlobGrant(
                    JOB, UNIT, owner.peer_id, worker.peer_id, [sha], size, time.time() + 3600
                ),
                owner.signing_key,
            )
            port = 4471 if ns == "pub" else 4470  # the relay has 4470 there
            serve = {**base, "ip": ip, "port": port, "store": str(store), "name": ns,
                     "relayed": nated}  # fmt: skip
            peers.start(ns, "serve", ns, serve)
            how = {"direct channel": "direct", "hole-punched": "punched"}.get(name, "relayed")
            fetched = folder / f"fetched-by-a-from-{ns}"
            fetch = {**base, "ip": lab.homes["a"], "port": 4472, "store": str(fetched),
                     "sha": sha, "grant": grant.hex(), "server": ns, "server_ip": ip,
                     "how": how, "name": ns}  # fmt: skip
            peers.start("a", "fetch", ns, fetch)
            found[name] = peers.result(ns)
    finally:
        peers.stop()
    return found


def links(mib: int, rates: list[str]) -> Result:
    result = Result(
        "links through NATs",
        ["rate", "path", "MiB/s", "vs iperf3", "went over"],
    )
    lab = Lab().up({"a": "cone", "b": "symmetric", "c": "cone"})
    try:
        for rate in rates:
            _shape(lab, rate)
            baseline = _iperf3(lab)
            result.add(rate, "iperf3 (baseline)", baseline / 2**20, 1.0, "TCP")
            with tempfile.TemporaryDirectory(prefix="meshminer-links-") as tmp:
                for name, got in _transfers(lab, Path(tmp), mib).items():
                    rate_bps = (mib << 20) / got["seconds"]
                    result.add(rate, name, rate_bps / 2**20, rate_bps / baseline, got["path"])
                    result.meta[f"{rate} {name}"] = {**got, "bytes_per_s": rate_bps}
            result.meta[f"{rate} iperf3"] = {"bytes_per_s": baseline}
    finally:
        lab.down()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    args = parser.parse_args()
    run_parts("links", ["links"], {"links": lambda: links(args.mib, args.rates)})


if __name__ == "__main__":
    main()
