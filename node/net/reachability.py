"""Whether other peers can dial this node: learned from real dial-backs (AutoNAT).

A node asks peers it is directly connected to to dial it back on a fresh connection
(`libp2p_fixes` makes the library's dial-back really dial), at its own addresses and
at the IP they see it by with its listen port. One success: `public`. Every asked
peer failing to reach it: `private` (behind a NAT or a firewall), and the node then
holds slots on relays. Until a peer has answered: `unknown`.

Settings can fix the answer (`reachability = "public" | "private"`), for a node whose
operator knows better, or a test.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import multiaddr
from libp2p.abc import IHost
from libp2p.host.autonat import AutoNATService
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID

from node.net import libp2p_fixes

log = logging.getLogger(__name__)

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"
ASK_AT_MOST = 3
QUERY_TIMEOUT_S = 15.0


@dataclass
class Reachability:
    """The node's answer, and how it got it (shown by `meshminer doctor`)."""

    state: str = UNKNOWN
    how: str = "not checked yet"
    checked_at: float = 0.0
    answers: dict[str, str] = field(default_factory=dict)  # peer -> what its dial-back found


class ReachabilityProbe:
    def __init__(self, host: IHost, fixed: str = "auto") -> None:
        libp2p_fixes.apply()
        self._host = host
        self._autonat = AutoNATService(host, serve=True, confirmations=1)
        self.fixed = fixed
        self.now = Reachability()
        if fixed != "auto":
            self.now = Reachability(fixed, "set by the reachability setting", time.time())

    def candidates(self) -> list[bytes]:
        """Our listen addresses, and each IP peers see us by with our listen port."""
        listen = list(self._host.get_transport_addrs())
        ports = {a.value_for_protocol("tcp") for a in listen}
        out = {a.to_bytes() for a in listen if "0.0.0.0" not in str(a)}
        observed = getattr(self._host, "_observed_addr_manager", None)
        if observed is not None:
            for addr in observed.addrs(min_observers=1):
                try:
                    ip = addr.value_for_protocol("ip4")
                except Exception:
                    continue
                for port in ports:
                    out.add(multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}").to_bytes())
        return sorted(out)

    async def check(self, peers: list[str]) -> Reachability:
        """Ask up to `ASK_AT_MOST` of `peers` (directly connected ones) to dial us back."""
        if self.fixed != "auto":
            return self.now
        answers: dict[str, str] = {}
        for peer in peers[:ASK_AT_MOST]:
            try:
                status, _ = await self._autonat.query_server(
                    ID.from_base58(peer), self.candidates(), timeout=QUERY_TIMEOUT_S
                )
            except Exception as exc:
                answers[peer] = f"no answer ({type(exc).__name__})"
                continue
            answers[peer] = {
                int(Message.OK): "reached us",
                int(Message.E_DIAL_ERROR): "could not reach us",
                int(Message.E_DIAL_REFUSED): "refused to try",
            }.get(status, f"status {status}")
        reached = [p for p, a in answers.items() if a == "reached us"]
        failed = [p for p, a in answers.items() if a == "could not reach us"]
        if reached:
            state, how = PUBLIC, f"{len(reached)} of {len(answers)} peers dialled us back"
        elif failed:
            state, how = PRIVATE, f"{len(failed)} of {len(answers)} peers could not dial us back"
        else:
            state, how = self.now.state, "no peer could try a dial-back"
        self.now = Reachability(state, how, time.time(), answers)
        log.info("reachability: %s (%s)", state, how)
        return self.now
