"""A small internet in Linux network namespaces: a public host and homes behind NATs.

    pub 10.0.0.1 ----+ (pub2 10.0.0.101, ... when asked for)
                     |  wan bridge (10.0.0.0/24, in namespace "wan")
    rA  10.0.0.2 ----+---- rB 10.0.0.3
     | masquerade            | masquerade
    A 192.168.1.2          B 192.168.2.2

Each router masquerades its home behind its WAN address and drops what nobody inside
asked for (conntrack), silently, as a home router does. A "cone" router keeps source ports
(Linux masquerade's default), which is what lets hole punching work; a "symmetric"
one picks a random port for every connection (`fully-random`), so the port a peer
sees is never the one the next connection gets: hole punching fails, and only a
relay reaches that home. Each node namespace also has a management
link to the test (172.<m>.<n>.2, the test's side .1) that carries only the HTTP API:
nothing routes between management links and the lab. Those links live in the root
namespace, so two labs at once (two test processes) must not share their addresses:
each lab holds a slot (a lock file) for its life, and slot k's links are 172.<31 - k>.

Needs root, `ip` and `nft`. `Lab.up()` raises `LabUnavailable` (with the reason)
where they are missing; everything is removed on `down()`, also after a failure.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import IO

WAN = "10.0.0"
SLOTS = 8  # labs at once on one machine


class LabUnavailable(Exception):
    """Network namespaces cannot be built here (not root, or a tool is missing)."""


@dataclass
class Lab:
    prefix: str = field(default_factory=lambda: f"mm{os.getpid() % 100000}-")
    made: list[str] = field(default_factory=list)  # namespaces, in order made
    links: list[str] = field(default_factory=list)  # root-side management veths
    homes: dict[str, str] = field(default_factory=dict)  # home name -> its node's IP
    publics: dict[str, str] = field(default_factory=dict)  # public host name -> its IP
    mgmt: dict[str, str] = field(default_factory=dict)  # namespace -> its management IP
    slot: int = -1  # which management addresses this lab holds (172.<31 - slot>.*)
    _slot_lock: IO[bytes] | None = field(default=None, init=False, repr=False)

    def ns(self, name: str) -> str:
        return self.prefix + name

    def up(self, homes: dict[str, str] | None = None, publics: int = 1) -> Lab:
        """Build the lab; `homes` maps each home's name to its NAT, "cone" or
        "symmetric" (default: homes a and b, both cone). `publics` public hosts:
        "pub" (10.0.0.1), then "pub2" (10.0.0.101), ..."""
        homes = homes or {"a": "cone", "b": "cone"}
        missing = [t for t in ("ip", "nft") if shutil.which(t) is None]
        if os.geteuid() != 0 or missing:
            why = "not root" if os.geteuid() != 0 else f"missing {', '.join(missing)}"
            raise LabUnavailable(f"network namespaces need root, ip and nft ({why})")
        self._take_slot()
        try:
            self._build(homes, publics)
        except Exception:
            self.down()
            raise
        return self

    def _build(self, homes: dict[str, str], publics: int) -> None:
        self._add_ns("wan")
        self._run("wan", "ip link add br0 type bridge")
        self._run("wan", "ip link set br0 up")
        for k in range(publics):
            name, host = ("pub", 1) if k == 0 else (f"pub{k + 1}", 100 + k)
            self._add_ns(name)
            self._wan_port(name, host)
            self._manage(name, host)
            self.publics[name] = f"{WAN}.{host}"
        for i, (home, nat) in enumerate(homes.items()):
            router, inside = f"r{home}", home
            self._add_ns(router)
            self._add_ns(inside)
            self._wan_port(router, 2 + i)
            lan = f"192.168.{i + 1}"
            self._veth(router, "lan0", f"{lan}.1/24", inside, "eth0", f"{lan}.2/24")
            self._run(inside, f"ip route add default via {lan}.1")
            self._run(router, "sysctl -q -w net.ipv4.ip_forward=1")
            self._masquerade(router, "fully-random" if nat == "symmetric" else "")
            self._manage(inside, 2 + i)
            self.homes[home] = f"{lan}.2"

    # -- pieces ------------------------------------------------------------------------

    def _add_ns(self, name: str) -> None:
        _sh(f"ip netns add {self.ns(name)}")
        self.made.append(self.ns(name))
        self._run(name, "ip link set lo up")

    def _veth(self, a: str, a_dev: str, a_ip: str, b: str, b_dev: str, b_ip: str) -> None:
        _sh(f"ip link add {a_dev}-{self.prefix}x type veth peer name {b_dev}-{self.prefix}y")
        _sh(f"ip link set {a_dev}-{self.prefix}x netns {self.ns(a)}")
        _sh(f"ip link set {b_dev}-{self.prefix}y netns {self.ns(b)}")
        for ns, tmp, dev, ip in ((a, "x", a_dev, a_ip), (b, "y", b_dev, b_ip)):
            self._run(ns, f"ip link set {dev}-{self.prefix}{tmp} name {dev}")
            if ip:
                self._run(ns, f"ip addr add {ip} dev {dev}")
            self._run(ns, f"ip link set {dev} up")

    def _wan_port(self, name: str, host: int) -> None:
        port = f"p{host}"
        self._veth(name, "wan0", f"{WAN}.{host}/24", "wan", port, "")
        self._run("wan", f"ip link set {port} master br0")

    def _masquerade(self, router: str, flags: str) -> None:
        nat = f'oifname "wan0" masquerade {flags}'.strip()
        rules = (
            "table ip nat {\n"
            f"  chain post {{ type nat hook postrouting priority 100; {nat}; }}\n"
            "}\n"
            "table ip filter {\n"
            "  chain homefw {\n"
            "    type filter hook forward priority 0; policy drop;\n"
            "    ct state established,related accept\n"
            '    iifname "lan0" accept\n'
            "  }\n"
            # a home router answers nothing from outside: a SYN that no mapping
            # expects is dropped, not refused (a refusal would end a hole punch)
            "  chain homein {\n"
            "    type filter hook input priority 0; policy drop;\n"
            "    ct state established,related accept\n"
            '    iifname "lan0" accept\n'
            "  }\n"
            "}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.ns(router), "nft", "-f", "-"],
            input=rules.encode(),
            check=True,
            capture_output=True,
        )

    def _take_slot(self) -> None:
        """Hold the first free slot's lock file, released by `down()` (or this
        process's exit)."""
        for slot in range(SLOTS):
            lock = open(f"/tmp/meshminer-netlab-{slot}.lock", "wb")  # noqa: SIM115
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            self.slot, self._slot_lock = slot, lock
            return
        raise LabUnavailable(f"{SLOTS} labs are up on this machine already")

    def _manage(self, name: str, n: int) -> None:
        """A link from the test to `name`'s namespace, for its HTTP API only."""
        outside, inside = f"mm{n}-{os.getpid() % 10000}", "mgmt0"
        _sh(f"ip link add {outside} type veth peer name {inside}-{self.prefix}y")
        self.links.append(outside)
        _sh(f"ip link set {inside}-{self.prefix}y netns {self.ns(name)}")
        self._run(name, f"ip link set {inside}-{self.prefix}y name {inside}")
        net = f"172.{31 - self.slot}.{n}"
        _sh(f"ip addr add {net}.1/30 dev {outside}")
        _sh(f"ip link set {outside} up")
        self._run(name, f"ip addr add {net}.2/30 dev {inside}")
        self._run(name, f"ip link set {inside} up")
        self.mgmt[self.ns(name)] = f"{net}.2"

    def _run(self, name: str, command: str) -> None:
        _sh(f"ip netns exec {self.ns(name)} {command}")

    def exec(
        self, name: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run `command` inside namespace `name` (with `env` over this environment)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(name), *command],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=120,
        )

    def down(self) -> None:
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in reversed(self.made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()
        self.links.clear()
        if self._slot_lock is not None:
            self._slot_lock.close()  # releases the flock
            self._slot_lock, self.slot = None, -1


def _sh(command: str) -> None:
    done = subprocess.run(command.split(), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{command}: {done.stderr.strip()}")
