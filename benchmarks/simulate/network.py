"""Nodes, churn, owners and gossiped ads: what both designs share.

A node is an index into per-node lists (ids are never reused: a joiner is a new node).
Gossip is accounted for arithmetically: every live node receives every gossiped ad, so
rather than one event per delivery there is a running count of ads published
(`ads_published`), and a node's ads received are that count's growth while it was
alive less its own publishes. That keeps 10,000 gossiping nodes (300 M deliveries an
hour) to one event per publish. A design subclasses `Network` and fills in the hooks
(`on_start`, `on_join`, `on_leave`, `on_first_ad`, `place`, `finish`).
"""

from __future__ import annotations

import math
import random

import numpy as np

from benchmarks.simulate.costs import Costs
from benchmarks.simulate.engine import Engine
from benchmarks.simulate.scenario import DIRECTORY, OWNER, VOLUNTEER, Scenario
from benchmarks.simulate.upkeep import UpkeepMixin

__all__ = ["DIRECTORY", "INF", "OWNER", "VOLUNTEER", "IndexedSet", "Network"]

INF = math.inf


class IndexedSet:
    """A set of ints with O(1) add, remove and uniform random choice (swap-remove)."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self._pos: dict[int, int] = {}

    def add(self, item: int) -> None:
        self._pos[item] = len(self.items)
        self.items.append(item)

    def remove(self, item: int) -> None:
        pos = self._pos.pop(item, None)
        if pos is None:
            return
        last = self.items.pop()
        if last != item:
            self.items[pos] = last
            self._pos[last] = pos

    def __len__(self) -> int:
        return len(self.items)


class Network(UpkeepMixin):
    """The shared machinery; a design subclass decides who publishes and how work is
    placed. Call `run()` once, then read the lists of observations."""

    design = ""

    def __init__(self, scenario: Scenario, costs: Costs) -> None:
        sc = self.sc = scenario
        self.costs = costs
        self.rng = random.Random(scenario.seed)
        # its own stream, so that probing does not shift churn, phases and choices
        self.probe_rng = random.Random(scenario.seed + 10**6)
        self.engine = Engine()
        hops = max(1, math.ceil(math.log(sc.peers) / math.log(sc.gossip_degree)))
        self.gossip_latency_s = hops * costs.gossip_hop_ms / 1000
        self.connect_s = costs.connect_ms / 1000
        self.join_connect_s = costs.join_connect_ms / 1000
        self.rtt_s = costs.rtt_ms / 1000
        self.warmup_s = sc.warmup_s
        # per node
        self.alive: list[bool] = []
        self.born: list[float] = []
        self.died: list[float] = []
        self.role: list[int] = []
        self.fits: list[bool] = []
        self.cpu: list[float] = []  # ms of CPU for messages, after warm-up
        self.nbytes: list[float] = []  # bytes in + out for messages, after warm-up
        self.own_ads: list[int] = []  # own publishes after warm-up
        self.g_start: list[int] = []  # ads_published when the node's window began
        self.g_end: list[int] = []  # ... and when it ended (death or end of run)
        self.pub_time: list[float] = []  # when the node last published (its ad's timestamp)
        self.attacker: list[bool] = []  # run by the attacker (hostile.py): not measured
        # numpy mirrors for the design-gossip table look-ups (vectorised over all nodes)
        self.last_ad = np.full(0, -INF)  # delivery time of the node's latest ad
        self.first_ad = np.full(0, INF)  # delivery time of its first ad
        self.fits_np = np.zeros(0, dtype=bool)
        self.live = IndexedSet()
        self.churnable = IndexedSet()
        self.directory_ids: list[int] = []
        self.hostile: dict[int, str] = {}  # hostile directory -> its behaviour (hostile.py)
        self.ads_published = 0
        # connection-seconds beyond `connections` (a directory's registrants), after warm-up
        self.conn_integral: dict[int, float] = {}
        self._conn_count: dict[int, int] = {}
        self._conn_since: dict[int, float] = {}
        # observations
        self.placements = 0
        self.placements_failed = 0
        self.find_k: list[float] = []
        self.rounds: list[int] = []
        self.drop_dead: list[float] = []
        self.drop_dead_node_mean: list[float] = []
        self.join_found: list[float] = []
        self.first_peer: list[float] = []
        self.offers_to_dead = 0
        self.dead_candidates_probed = 0
        self.joins = 0
        self.deaths = 0
        self.findable: list[tuple[float, float]] = []  # (s, share of honest volunteers)
        self.attacker_capacity: list[float] = []  # attacker's share of live fitting peers
        self.bound = 0  # peers placements were bound to
        self.bound_to_attacker = 0
        self.listing_checks = 0
        self.hiding_found = 0  # listing checks that caught a directory hiding the node
        self.fallback_nodes = 0  # honest nodes that fell back to gossiping their ad
        self.directory_waits: list[float] = []  # a request's queue and service, after warm-up
        self.directory_timeouts = 0
        self.init_upkeep()

    # -- hooks -----------------------------------------------------------------------

    def publishes(self, role: int) -> bool:
        """Whether nodes of this role gossip their ad."""
        raise NotImplementedError

    @property
    def ad_interval_s(self) -> float:
        """How often a node that gossips its ad publishes it."""
        return self.sc.publish_interval_s

    def on_add(self, node: int) -> None:
        """A node was created (at the start or joining): extend per-node state."""

    def on_start(self) -> None:
        """All initial nodes exist: set up the steady state the run starts from."""

    def on_join(self, node: int) -> None:
        """A node joined after the start (its publishing is already scheduled)."""

    def on_leave(self, node: int) -> None:
        """A node died (already marked dead)."""

    def on_first_ad(self, node: int, delivered: float) -> None:
        """A node's first ad will be delivered to every live node at `delivered`."""

    def place(self, owner: int) -> None:
        """An owner wants `k` fitting peers now; record what it takes."""
        raise NotImplementedError

    def finish(self) -> None:
        """The run is over: compute whatever is measured after the fact."""

    # -- run ---------------------------------------------------------------------------

    def run(self) -> None:
        sc, rng, engine = self.sc, self.rng, self.engine
        m = sc.n_directories + sc.n_hostile
        roles = [DIRECTORY] * m + [OWNER] * sc.owners + [VOLUNTEER] * (sc.peers - m - sc.owners)
        interval = self.ad_interval_s
        for role in roles:
            node = self._add(role, 0.0)
            if self.publishes(role):  # steady state: published one interval ago at its phase
                phase = rng.uniform(0, interval)
                self.pub_time[node] = phase - interval
                self.last_ad[node] = phase - interval + self.gossip_latency_s
                self.first_ad[node] = -interval
                engine.at(phase, self._publish, node)
        self.on_start()
        for node in range(len(self.alive)):  # behind a NAT: slots within its first seconds
            engine.at(rng.uniform(0, 10), self.reserve, node)
        period = 60.0 / sc.placements_per_owner_per_min
        for owner in range(m, m + sc.owners):
            engine.at(rng.uniform(0, period), self._place_tick, owner)
        rate = sc.churn_per_hour * sc.peers / 3600
        if rate > 0:
            engine.at(rng.expovariate(rate), self._churn, rate)
        if sc.burst_time is not None:
            engine.at(sc.burst_time, self._burst)
        engine.at(self.warmup_s, self._warmup)
        engine.run(sc.duration_s)
        for node in self.live.items:
            self.g_end[node] = self.ads_published
            self.r_end[node] = self.receipts_published
        for node in self._conn_count:
            self.conn_change(node, 0)
        self.finish()

    def _add(self, role: int, born: float) -> int:
        node = len(self.alive)
        fits = role != DIRECTORY and self.rng.random() < self.sc.fit_fraction
        for values, value in (
            (self.alive, True),
            (self.born, born),
            (self.died, INF),
            (self.role, role),
            (self.fits, fits),
            (self.cpu, 0.0),
            (self.nbytes, 0.0),
            (self.own_ads, 0),
            (self.g_start, self.ads_published),
            (self.g_end, self.ads_published),
            (self.pub_time, -INF),
            (self.attacker, False),
        ):
            values.append(value)
        if node >= len(self.last_ad):
            grow = max(64, len(self.last_ad))
            self.last_ad = np.concatenate([self.last_ad, np.full(grow, -INF)])
            self.first_ad = np.concatenate([self.first_ad, np.full(grow, INF)])
            self.fits_np = np.concatenate([self.fits_np, np.zeros(grow, dtype=bool)])
        self.fits_np[node] = fits
        self.add_upkeep(node)
        self.live.add(node)
        if role == VOLUNTEER or (role == DIRECTORY and self.sc.directory_churn):
            self.churnable.add(node)
        if role == DIRECTORY:
            self.directory_ids.append(node)
        self.on_add(node)
        return node

    def _kill(self, node: int) -> None:
        self.alive[node] = False
        self.died[node] = self.engine.now
        self.g_end[node] = self.ads_published
        self.r_end[node] = self.receipts_published
        self.release(node)
        self.live.remove(node)
        self.churnable.remove(node)
        if node in self._conn_count:  # its connections close with it
            self.conn_change(node, -self._conn_count[node])
        self.deaths += 1
        self.on_leave(node)

    def _join(self, role: int) -> None:
        node = self._add(role, self.engine.now)
        self.joins += 1
        if self.publishes(role):  # on its first connection, so peers beyond it learn of it
            self.engine.after(self.connect_s, self._publish, node)
        self.on_join(node)
        self.engine.after(self.join_connect_s + 1.0, self.reserve, node)

    def _churn(self, rate: float) -> None:
        """One Poisson departure, replaced at once by a newcomer of the same role."""
        if len(self.churnable):
            node = self.churnable.items[self.rng.randrange(len(self.churnable))]
            self._kill(node)
            self._join(self.role[node])
        self.engine.after(self.rng.expovariate(rate), self._churn, rate)

    def _burst(self, _: object) -> None:
        count = round(self.sc.burst_fraction * len(self.churnable))
        for node in self.rng.sample(self.churnable.items, count):
            self._kill(node)

    def _warmup(self, _: object) -> None:
        for node in self.live.items:
            self.g_start[node] = self.ads_published
            self.r_start[node] = self.receipts_published

    def _publish(self, node: int) -> None:
        if not self.alive[node]:
            return
        now = self.engine.now
        self.ads_published += 1
        if now >= self.warmup_s:
            self.own_ads[node] += 1
            self.nbytes[node] += self.costs.ad_bytes
        delivered = now + self.gossip_latency_s
        self.pub_time[node] = now
        self.last_ad[node] = delivered
        if self.first_ad[node] == INF:
            self.first_ad[node] = delivered
            self.on_first_ad(node, delivered)
        self.engine.at(now + self.ad_interval_s, self._publish, node)

    def _place_tick(self, owner: int) -> None:
        if self.engine.now >= self.warmup_s:
            self.placements += 1
            self.place(owner)
        self.engine.after(60.0 / self.sc.placements_per_owner_per_min, self._place_tick, owner)

    # -- helpers for designs -----------------------------------------------------------

    def charge(self, node: int, ms: float, nbytes: float = 0.0) -> None:
        """Add a message's CPU and bytes to a node (only once warm-up is over)."""
        if self.engine.now >= self.warmup_s:
            self.cpu[node] += ms
            self.nbytes[node] += nbytes

    def conn_change(self, node: int, delta: int) -> None:
        """A node's extra open connections change by `delta` now (0: just integrate)."""
        now = self.engine.now
        since = max(self._conn_since.get(node, 0.0), self.warmup_s)
        count = self._conn_count.get(node, 0)
        if now > since:
            self.conn_integral[node] = self.conn_integral.get(node, 0.0) + count * (now - since)
        self._conn_since[node] = now
        self._conn_count[node] = count + delta
