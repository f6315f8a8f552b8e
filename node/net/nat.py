"""Staying reachable from behind a NAT: learn whether peers can dial us, and if not,
hold slots on relays and advertise the circuit addresses.

The relays are the bootstrap peers and peers whose ads say they relay (`relay` and
`reachability = "public"`); up to `RELAYS` of them at once. A reservation whose relay
connection dropped is made again (the library's refresher does not reconnect).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from node.net.host import MeshHost
from node.net.reachability import PRIVATE, UNKNOWN
from node.net.relay import is_circuit

log = logging.getLogger(__name__)

RELAYS = 2
SCAN_S = 2.0
RECHECK_S = 300.0  # reachability, once known
RETRY_UNKNOWN_S = 10.0
RETRY_MAX_S = 300.0  # a relay that refused us or is gone, asked again at most this rarely


async def keep_reachable(
    host: MeshHost,
    bootstrap: list[str],
    relay_ads: Callable[[], Iterable[str]],
    on_change: Callable[[], None],
) -> None:
    """Run for the node's life. `relay_ads()` gives the direct addresses of peers
    whose ads offer relaying; `on_change()` is told when our addresses changed."""
    next_check = 0.0
    retry_at: dict[str, tuple[float, float]] = {}
    while True:
        now = trio.current_time()
        direct = [p for p in host.connected_peers() if host.path_to(p) == "direct"]
        if now >= next_check and direct:
            ordered = sorted(direct, key=lambda p: not any(a.endswith(p) for a in bootstrap))
            before = host.reachability.now.state
            state = (await host.reachability.check(ordered)).state
            next_check = now + (RETRY_UNKNOWN_S if state == UNKNOWN else RECHECK_S)
            if state != before:
                on_change()
        if _drop_lost_reservations(host):
            on_change()
        wanted = host.reachability.now.state == PRIVATE and len(host.relay.reservations) < RELAYS
        if wanted and await _reserve_one(host, [*bootstrap, *relay_ads()], retry_at):
            on_change()
        await trio.sleep(SCAN_S)


def _drop_lost_reservations(host: MeshHost) -> bool:
    connected = host.connected_peers()
    lost = [relay for relay in host.relay.reservations if relay not in connected]
    for relay in lost:
        log.info("relay %s is gone; its reservation with it", relay)
        del host.relay.reservations[relay]
    return bool(lost)


async def _reserve_one(
    host: MeshHost, candidates: list[str], retry_at: dict[str, tuple[float, float]]
) -> bool:
    """Reserve on the first candidate relay (a direct address) that takes us; one
    that did not is asked again only after a backoff (`retry_at`: relay -> (when,
    backoff)), doubling to `RETRY_MAX_S`."""
    now = trio.current_time()
    for addr in candidates:
        relay = addr.rsplit("/p2p/", 1)[-1]
        if is_circuit(addr) or relay in host.relay.reservations or relay == host.peer_id:
            continue
        if retry_at.get(relay, (0.0, 0.0))[0] > now:
            continue
        try:
            if relay not in host.connected_peers():
                host.allow_redial(relay)
                await host.connect(addr)
            circuit = await host.relay.reserve(addr)
        except Exception as exc:
            backoff = min(retry_at.get(relay, (0.0, SCAN_S / 2))[1] * 2, RETRY_MAX_S)
            retry_at[relay] = (now + backoff, backoff)
            log.info("no reservation on %s (asking again in %.0f s): %s", addr, backoff, exc)
            continue
        retry_at.pop(relay, None)
        log.info("reachable through relay %s: %s", relay, circuit)
        return True
    return False
