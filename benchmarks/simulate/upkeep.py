"""What a node does beside finding peers, whose cost the network's size or shape sets:
receipt gossip, reachability dial-backs, and relays for volunteers behind NATs, as
`node/net/receipts_gossip.py`, `node/net/reachability.py` and `node/net/nat.py` do it.

Receipts: each unit a placement binds ends `unit_minutes` later (if its worker is
still there) with one co-signed receipt published on `meshminer/receipts/1`, which
every subscriber validates, forwards and keeps in its audit table (`receipt_ms`):
every node in a small network, only directories in a large one (`audits`). They are
counted as gossiped ads are: a node's receipts received are the count's growth while
it was alive.

Dial-backs: every volunteer learns whether it is reachable by asking `ASK_AT_MOST`
connected peers to dial it back, every `RECHECK_S`. Each asks that many and, on
average, is asked that many: a request and an answer each way, and a dial by the
asked peer, which the dialled one pays too where it is public.

Relays: a volunteer behind a NAT (`nat_share` of them, drawn at birth) holds
`RELAYS` reservations on public volunteers it is connected to, at most
`MAX_RESERVATIONS` on one relay: a connection kept open at both ends, refreshed every
`REFRESH_S`, and made again on another relay when one dies. A probe to it over a new
connection goes through a relay: `relayed_probe_ms` longer than a direct one (the
private addresses tried first, then the circuit, as measured in the NAT lab), and the
relay pays `relay_circuit_ms`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from benchmarks.simulate.scenario import VOLUNTEER

if TYPE_CHECKING:
    from benchmarks.simulate.network import Network

# the node's constants
ASK_AT_MOST = 3  # node.net.reachability: peers asked to dial back
RECHECK_S = 300.0  # node.net.nat: reachability, once known
RELAYS = 2  # node.net.nat: reservations a NAT'd node holds
MAX_RESERVATIONS = 64  # node.net.relay.RelayOptions: slots on one relay
REFRESH_S = 570.0  # py-libp2p refreshes a 600 s reservation 30 s before it lapses
SCAN_S = 2.0  # node.net.nat: a lost reservation is noticed this soon
RETRY_S = 60.0  # no relay had room: asked again (node.net.nat backs off 1 s to 300 s)


class UpkeepMixin:
    """Receipts, dial-backs and relays, mixed into `Network` (both designs)."""

    def init_upkeep(self: Network) -> None:
        self.behind_nat: list[bool] = []
        self.relays_of: dict[int, list[int]] = {}  # NAT'd volunteer -> its relays
        self.reserved_on: dict[int, set[int]] = {}  # relay -> volunteers holding a slot
        self.receipts_published = 0
        self.r_start: list[int] = []  # receipts_published when the node's window began
        self.r_end: list[int] = []
        self.relay_refused = 0  # reservations wanted with no public peer that had room

    def add_upkeep(self: Network, node: int) -> None:
        nat = self.role[node] == VOLUNTEER and self.rng.random() < self.sc.nat_share
        self.behind_nat.append(nat)
        self.r_start.append(self.receipts_published)
        self.r_end.append(self.receipts_published)

    # -- receipts ----------------------------------------------------------------------

    def units_started(self: Network, workers: list[int]) -> None:
        """A placement bound `workers`: each trains a unit whose receipt follows."""
        if not self.sc.receipt_gossip:
            return
        for worker in workers:
            self.engine.after(self.sc.unit_minutes * 60, self._unit_ended, worker)

    def _unit_ended(self: Network, worker: int) -> None:
        if self.alive[worker]:  # a worker gone has no receipt to co-sign
            self.receipts_published += 1

    def receipts_received(self: Network, node: int) -> int:
        """Receipts `node` took while it was alive after warm-up, if it audits them."""
        if not self.audits(node):
            return 0
        end = self.receipts_published if self.alive[node] else self.r_end[node]
        return end - self.r_start[node]

    def audits(self: Network, node: int) -> bool:
        """Whether `node` takes every receipt (`Registration.audits_receipts`)."""
        return True

    # -- dial-backs and relays -----------------------------------------------------------

    def upkeep_ms_per_min(self: Network, node: int) -> float:
        """The node's dial-back CPU per minute (every node checks its reachability)."""
        c = self.costs
        asked = c.probe_client_ms + c.probe_server_ms + c.dial_ms  # asks, answers, dials
        dialled = 0.0 if self.behind_nat[node] else c.dial_ms
        return ASK_AT_MOST * (asked + dialled) * 60 / RECHECK_S

    def reserve(self: Network, node: int) -> None:
        """A NAT'd volunteer takes slots on public volunteers, as many as it lacks."""
        if not self.behind_nat[node] or not self.alive[node]:
            return
        held = self.relays_of.setdefault(node, [])
        items = self.live.items
        for _ in range(8 * RELAYS):  # a few random peers, as its connections give them
            if len(held) >= RELAYS:
                return
            relay = items[self.rng.randrange(len(items))]
            if self.role[relay] != VOLUNTEER or self.behind_nat[relay] or relay in held:
                continue
            slots = self.reserved_on.setdefault(relay, set())
            if len(slots) >= MAX_RESERVATIONS:
                continue
            slots.add(node)
            held.append(relay)
            self.conn_change(relay, 1)  # the relay keeps it open beyond its own choice
            self._refresh((node, relay))
        if len(held) < RELAYS:
            self.relay_refused += 1
            self.engine.after(RETRY_S, self.reserve, node)

    def _refresh(self: Network, arg: tuple[int, int]) -> None:
        node, relay = arg
        if not self.alive[node] or relay not in self.relays_of.get(node, ()):
            return
        c = self.costs
        self.charge(node, c.probe_client_ms, c.probe_bytes)
        self.charge(relay, c.probe_server_ms, c.probe_bytes)
        self.engine.after(REFRESH_S, self._refresh, arg)

    def release(self: Network, node: int) -> None:
        """`node` died: its slots free up, and those that held a slot on it reserve again."""
        for relay in self.relays_of.pop(node, ()):
            if self.alive[relay]:
                self.reserved_on[relay].discard(node)
                self.conn_change(relay, -1)
        for holder in self.reserved_on.pop(node, ()):
            held = self.relays_of.get(holder)
            if held and node in held:
                held.remove(node)
                self.engine.after(SCAN_S, self.reserve, holder)

    def probe_path_s(self: Network, peer: int, new_connection_s: float) -> float:
        """How long a probe over a new connection takes to answer: through a relay, which
        pays for the circuit, when `peer` is behind a NAT."""
        if not self.behind_nat[peer]:
            return new_connection_s
        held = self.relays_of.get(peer)
        if not held:
            return math.inf  # no slot anywhere: unreachable until it gets one
        self.charge(held[0], self.costs.relay_circuit_ms, 0)
        return new_connection_s + self.costs.relayed_probe_ms / 1000
