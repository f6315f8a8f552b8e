"""Keeping open connections few: above a high water mark, the connections idle longest
are closed until a low water mark remains.

Every open connection costs a node CPU whether or not it carries anything (10-21 ms a
minute measured: the muxer's keep-alives, GossipSub's heartbeats), and connections
come from many places besides our own dials: peers bootstrapping through us, owners'
probes, reachability dial-backs. Without a limit a long-lived volunteer ends up
connected to every peer it ever spoke with, and a bootstrap node to every joiner of
its network. The limits are go-libp2p's connection manager's idea: nothing
happens up to `high`, so small networks (the demo, a LAN, the tests) never lose a
connection, and trimming down to `low` leaves room to grow before the next trim.

Work needs no protection of its own: a unit in flight heartbeats every second, and a
volunteer registers with its directories every third of a peer TTL, so those
connections are never the idle ones. What is protected is what carries no regular
requests but must stay: relays holding our reservations, and whatever the caller names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from node.metrics import NodeMetrics
from node.net.host import MeshHost

log = logging.getLogger(__name__)

TRIM_EVERY_S = 10.0
HIGH_PER_LOW = 2
MIN_HIGH = 16
MIN_IDLE_S = 60.0


@dataclass(frozen=True)
class ConnectionLimits:
    low: int  # trimming stops when this many remain
    high: int  # trimming starts above this many
    idle_s: float  # a connection that opened a stream more recently is never closed

    @classmethod
    def for_node(
        cls, target_peers: int, register_interval_s: float, high: int = 0, idle_s: float = 0.0
    ) -> ConnectionLimits:
        """`target_peers` is how many connections discovery dials, so it is the low mark
        (at most `high`); `high` and `idle_s` of 0 mean the defaults: twice the low
        mark (at least 16), and two registration intervals (at least 60 s)."""
        high = high or max(HIGH_PER_LOW * target_peers, MIN_HIGH)
        idle_s = idle_s or max(MIN_IDLE_S, 2 * register_interval_s)
        return cls(min(target_peers, high), high, idle_s)


def connections_to_close(
    idle_s: dict[str, float], protected: set[str], limits: ConnectionLimits
) -> list[str]:
    """The peers whose connections to close, longest idle first: none while at most
    `limits.high` are open; else unprotected ones idle at least `limits.idle_s`, until
    `limits.low` remain (or no more qualify)."""
    if len(idle_s) <= limits.high:
        return []
    idle = [
        peer
        for peer, seconds in idle_s.items()
        if peer not in protected and seconds >= limits.idle_s
    ]
    idle.sort(key=idle_s.__getitem__, reverse=True)
    return idle[: len(idle_s) - limits.low]


async def trim_connections(
    host: MeshHost,
    limits: ConnectionLimits,
    metrics: NodeMetrics,
    protected: Callable[[], set[str]] = set,
) -> None:
    """Every `TRIM_EVERY_S` (or `limits.idle_s`, if shorter), close what
    `connections_to_close` picks. Runs until cancelled."""
    while True:
        await trio.sleep(min(TRIM_EVERY_S, limits.idle_s))
        idle_s = host.connection_idle_s()
        keep = protected() | set(host.relay.reservations)
        closing = connections_to_close(idle_s, keep, limits)
        for peer in closing:
            await host.disconnect(peer)
        if closing:
            metrics.connections_trimmed.inc(len(closing))
            log.info(
                "closed %d idle connections (%d were open, more than %d)",
                len(closing),
                len(idle_s),
                limits.high,
            )
