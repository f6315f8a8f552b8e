"""Design gossip (today's): every node gossips its capacity ad, every node keeps a
table of every peer and places work from it.

All live nodes receive an ad at the same moment (publish + hops x hop latency), so
their tables agree except for what joiners fetched on connecting: a joiner takes up to
`max_table_ads` ads from its first peer and stamps them with the time it took them (as
`PeerTable.accept` does), so a dead peer in that table lives on at the joiner for
another TTL. Such copies are the only per-node state kept; everything else is the
publisher's `last_ad`, shared by all. Owners never churn, so an owner's table is every
peer whose latest ad has not yet been swept.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.simulate.engine import sweep_after
from benchmarks.simulate.network import INF, Network


class GossipNetwork(Network):
    design = "gossip"

    def publishes(self, role: int) -> bool:
        return True

    def on_start(self) -> None:
        self.dead: list[int] = []
        self.dead_present: list[int] = []  # dead peers not yet swept from the common tables
        self.others_at_death: dict[int, int] = {}
        self.copies: dict[int, list[tuple[int, float]]] = {}  # dead peer -> (holder, drop at)
        self.held: dict[int, list[tuple[int, float]]] = {}  # holder -> (dead peer, drop at)

    def _table_ads(self) -> int:
        return min(len(self.live) - 1, self.sc.max_table_ads)

    def on_first_ad(self, node: int, delivered: float) -> None:
        if self.born[node] > 0:  # every owner's table has the joiner once its ad lands
            self.join_found.append(delivered - self.born[node])

    def on_join(self, node: int) -> None:
        fetch_s = self.rtt_s + self.costs.table_ad_check_ms * self._table_ads() / 1000
        self.engine.after(self.join_connect_s + fetch_s, self._fetched, node)

    def on_leave(self, node: int) -> None:
        self.dead.append(node)
        self.dead_present.append(node)
        self.others_at_death[node] = len(self.live)

    def _fetched(self, joiner: int) -> None:
        """The joiner has its first peer's table: it now knows min(N-1, 1024) peers,
        dead ones that the peer still lists among them."""
        if not self.alive[joiner]:
            return
        now, sc = self.engine.now, self.sc
        self.first_peer.append(now - self.born[joiner])
        count = self._table_ads()
        server = self.joiner_server(joiner)
        self.charge(joiner, self.costs.table_ad_check_ms * count, self.costs.ad_bytes * count)
        self.charge(server, 0.0, self.costs.ad_bytes * count)
        dead = self._dead_listed_by(server, now)
        sweep = self.costs.sweep_s
        if not dead:
            return
        table = len(self.live) - 1 + len(dead)  # the server's entries, as it sees them
        sample = self.rng.sample(range(table), min(table, count - 1))  # + its own ad
        for index in sample:
            if index < len(dead):
                peer = dead[index]
                until = sweep_after(max(now, float(self.last_ad[peer])), sc.peer_ttl_s, sweep)
                self.copies.setdefault(peer, []).append((joiner, until))
                self.held.setdefault(joiner, []).append((peer, until))

    def joiner_server(self, joiner: int) -> int:
        """A random live node other than the joiner: its first connection."""
        items = self.live.items
        while True:
            server = items[self.rng.randrange(len(items))]
            if server != joiner:
                return server

    def _dead_listed_by(self, server: int, now: float) -> list[int]:
        """Dead peers in `server`'s table now whose ad a joiner would still accept
        (no older than peer_ttl_s + clock_skew_s)."""
        sc = self.sc
        ttl, sweep = sc.peer_ttl_s, self.costs.sweep_s
        max_age = sc.peer_ttl_s + sc.clock_skew_s
        subscribed = self.born[server] + self.connect_s
        still = []
        listed: dict[int, None] = {}
        for peer in self.dead_present:
            if sweep_after(float(self.last_ad[peer]), ttl, sweep) > now:
                still.append(peer)
                if subscribed <= self.last_ad[peer]:
                    listed[peer] = None
        self.dead_present = still
        held = [(p, until) for p, until in self.held.get(server, ()) if until > now]
        if server in self.held:
            self.held[server] = held
        for peer, _ in held:
            listed[peer] = None
        return [p for p in listed if now - self.pub_time[p] <= max_age]

    def place(self, owner: int) -> None:
        """K fitting peers uniformly from the owner's table, at once and unprobed."""
        now, sc = self.engine.now, self.sc
        n = len(self.alive)
        last_sweep = math.floor(now / self.costs.sweep_s) * self.costs.sweep_s
        present = (
            (self.first_ad[:n] <= now)
            & (self.last_ad[:n] >= last_sweep - sc.peer_ttl_s)
            & self.fits_np[:n]
        )
        present[owner] = False
        candidates = np.flatnonzero(present)
        if len(candidates) < sc.k:
            self.placements_failed += 1
            return
        chosen = candidates[self.rng.sample(range(len(candidates)), sc.k)]
        self.offers_to_dead += sum(1 for peer in chosen.tolist() if not self.alive[peer])
        self.find_k.append(0.0)
        self.rounds.append(0)
        self.units_started(chosen.tolist())

    def finish(self) -> None:
        """Drop times from each dead peer's last ad, and the joiners' copies of it."""
        sc, end = self.sc, self.sc.duration_s
        for peer in self.dead:
            if self.first_ad[peer] == INF:
                continue  # died before its first ad: nobody ever listed it
            death = self.died[peer]
            common = sweep_after(float(self.last_ad[peer]), sc.peer_ttl_s, self.costs.sweep_s)
            copies = [u for j, u in self.copies.get(peer, ()) if self.died[j] > u]
            last = max([common, *copies])
            if last > end:
                continue  # not yet forgotten everywhere when the run ended
            holders = self.others_at_death[peer]
            total = holders * (common - death) + sum(u - death for u in copies)
            self.drop_dead.append(last - death)
            self.drop_dead_node_mean.append(total / (holders + len(copies)))
