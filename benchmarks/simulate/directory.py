"""Design directory (new): volunteers register their ad with a few directories, owners
query those and probe what they get back before offering work.

Only directories gossip their ads, so every node's gossip load is M ads per interval
however many volunteers there are. A volunteer picks its D directories by
highest-random-weight hashing over the directories it knows (registration.py has its
side: which ones, rests after failures, the listing check), so volunteers spread
evenly and a directory's death moves only its own volunteers. A registration is kept
`registration_ttl_s` after its last refresh, so a query can return a dead volunteer;
owners probe every candidate, and offer only to those that answered (late binding),
which is why offers never reach a dead peer here.

The run starts warm: every node has just started, knows every directory and remembers
the two that answered it before (node.db: honest ones, unless nothing it checks gave a
hostile one away), so it registers with those; with `cold_start` it remembers none and
registers with up to eight at once, as every node did before 2026-11-26 (the warm-up
leaves either out of the figures). A joiner connects to `connections` peers, takes its
first peer's ad table (its own ad and the directories'), and registers the same way;
it gossips nothing.
"""

from __future__ import annotations

import random
from collections import deque

from benchmarks.simulate.engine import sweep_after
from benchmarks.simulate.hostile import HostileMixin
from benchmarks.simulate.network import DIRECTORY, INF, Network
from benchmarks.simulate.placement import MAX_ANSWER, Placement, PlacementMixin
from benchmarks.simulate.registration import REQUEST_TIMEOUT_S, NodeState, RegistrationMixin


class DirectoryNetwork(PlacementMixin, RegistrationMixin, HostileMixin, Network):
    design = "directory"

    def publishes(self, role: int) -> bool:
        return role == DIRECTORY

    @property
    def ad_interval_s(self) -> float:
        """Directories refresh their ads `DIRECTORY_TTL_FACTOR` times more slowly in a
        large network (node.net.peers): only they gossip, and only to be known."""
        return self.sc.publish_interval_s * self.sc.directory_ad_factor

    def on_add(self, node: int) -> None:
        if len(self.alive) == 1:  # first node: create the per-node lists
            self.choice: list[tuple[int, ...]] = []  # a node's chosen directories, last look
            self.open_to: list[set[int]] = []  # directories a node is connected to
            self.held_by: list[set[int]] = []  # live directories holding its registration
            self.regs: list[NodeState] = []
            self.reg: dict[int, dict[int, float]] = {}  # directory -> volunteer -> refreshed
            self.expiry: dict[int, deque[tuple[float, int]]] = {}
            self.pending_dead: dict[int, tuple[float, list[float]]] = {}
            self.joining: set[int] = set()  # joiners no honest directory holds yet
            self.unplaced: set[int] = set()  # joiners no directory holds yet
            self.epoch = 0
            self.known: list[int] = []
            self.known_set: set[int] = set()
            # its own stream for whom a joiner dials and what a directory answers, so
            # that churn is the same whether nodes check their directories or not
            self.pick_rng = random.Random(self.sc.seed + 2 * 10**6)
            self.busy_until: dict[int, float] = {}  # a directory's queue empties then
        self.choice.append(())
        self.open_to.append(set())
        self.held_by.append(set())
        self.regs.append(NodeState())
        if self.role[node] == DIRECTORY:
            self.reg[node] = {}
            self.expiry[node] = deque()
            if self.born[node] == 0 and len(self.directory_ids) > self.sc.n_directories:
                self.hostile[node] = self.sc.hostile_behaviour

    def on_start(self) -> None:
        """Every node starts now, knowing the directories, at a random phase. They ran
        before, so they remember a large network (node.db keeps that a day) and the
        directories that answered them (their first D by rendezvous among those that
        answer at all), unless the run starts `cold`; joiners are new and remember
        nothing."""
        self._set_known(list(self.directory_ids))
        self.start_hostile()
        interval = self.sc.register_interval_s
        large = self.sc.peers >= self.sc.gossip_max_peers
        for node in range(len(self.alive)):
            if self.role[node] == DIRECTORY:
                continue
            start = self.rng.uniform(0, interval)
            st = self.regs[node]
            st.ready, st.phase, st.large = True, start % 1.0, large
            if not self.sc.cold_start:
                kept = [d for d in self.order(node) if self.kept_before(d)]
                st.good = set(kept[: self.sc.directory_peers])
            self.wake_at(node, start)
        self.engine.at(self.costs.sweep_s, self._sweep)

    def _set_known(self, known: list[int]) -> None:
        self.epoch += 1
        self.known = known
        self.known_set = set(known)

    def _bump(self, _: object) -> None:
        """A directory's ad first reached, or expired from, every node's table."""
        now, sweep = self.engine.now, self.costs.sweep_s
        ttl = self.sc.peer_ttl_s * self.sc.directory_ad_factor  # a directory entry's TTL
        self._set_known(
            [
                d
                for d in self.directory_ids
                if self.first_ad[d] <= now and sweep_after(float(self.last_ad[d]), ttl, sweep) > now
            ]
        )
        for node in self.live.items:
            if self.role[node] != DIRECTORY and self.regs[node].ready:
                self.soon(node)

    def on_first_ad(self, node: int, delivered: float) -> None:
        if self.born[node] > 0:
            self.engine.at(delivered, self._bump)

    # -- joining, leaving ----------------------------------------------------------------

    def on_join(self, node: int) -> None:
        """Connect to a random peer and take its table (its own ad and the
        directories'); then register (registration.py)."""
        ads = len(self.known) + 1
        check_s = self.costs.table_ad_check_ms * ads / 1000
        if self.role[node] != DIRECTORY:
            self.joining.add(node)
            self.unplaced.add(node)
        self.regs[node].phase = self.engine.now % 1.0
        self.engine.after(self.join_connect_s + self.rtt_s + check_s, self._fetched, node)

    def _fetched(self, node: int) -> None:
        """The first table is in. The joiner paid that connection and the table's
        checks, its first peer the connection, serving the table and taking the
        joiner's (its own ad). It then dials peers until it holds `connections` (its
        directories among them: those are paid when registering opens them), each
        such connection an exchange of tables both ways, new ads only their own."""
        if not self.alive[node]:
            return
        c, ads = self.costs, len(self.known) + 1
        server = self.random_peer(node)
        self.charge(node, c.dial_ms + c.table_ad_check_ms * ads, c.ad_bytes * ads)
        self.charge(server, c.dial_ms + c.table_ad_check_ms, c.ad_bytes * (ads + 1))
        if self.role[node] == DIRECTORY:
            return
        for _ in range(max(0, self.sc.connections - 1 - self.sc.directory_peers)):
            self.dial(node, self.random_peer(node))
        self.regs[node].ready = True
        self.soon(node)

    def random_peer(self, node: int) -> int:
        """A random live node other than `node` and not a directory."""
        items = self.live.items
        while True:
            peer = items[self.pick_rng.randrange(len(items))]
            if peer != node and self.role[peer] != DIRECTORY:
                return peer

    def dial(self, a: int, b: int) -> None:
        """A new connection: both ends pay its handshakes and check the other's table
        (the directories' ads, which they hold, and the other's own, which is new)."""
        c = self.costs
        ms = c.dial_ms + c.ad_check_ms * len(self.known) + c.table_ad_check_ms
        nbytes = c.ad_bytes * (len(self.known) + 1) * 2
        self.charge(a, ms, nbytes)
        self.charge(b, ms, nbytes)

    def on_leave(self, node: int) -> None:
        now = self.engine.now
        self.joining.discard(node)
        self.unplaced.discard(node)
        if self.role[node] != DIRECTORY:
            for d in self.open_to[node]:
                if self.alive[d]:
                    self.conn_change(d, -1)
            self.open_to[node] = set()
            if self.held_by[node]:
                self.pending_dead[node] = (now, [])
            return
        # a directory: its registrations go with it; nodes stop knowing it when its ad expires
        for v in self.reg.pop(node):
            self._unhold(v, node, now)
        del self.expiry[node]
        if self.first_ad[node] <= now:
            ttl = self.sc.peer_ttl_s * self.sc.directory_ad_factor
            expires = sweep_after(float(self.last_ad[node]), ttl, self.costs.sweep_s)
            self.engine.at(expires, self._bump)

    def _unhold(self, volunteer: int, directory: int, now: float) -> None:
        held = self.held_by[volunteer]
        held.discard(directory)
        pending = self.pending_dead.get(volunteer)
        if pending is None:
            return
        death, drops = pending
        drops.append(now - death)
        if not held:
            del self.pending_dead[volunteer]
            self.drop_dead.append(now - death)
            self.drop_dead_node_mean.append(sum(drops) / len(drops))

    # -- the directory's side ------------------------------------------------------------

    def store(self, volunteer: int, d: int) -> None:
        """`d` takes a registration (every behaviour keeps it: it may count it)."""
        now, c = self.engine.now, self.costs
        self.reg[d][volunteer] = now
        self.expiry[d].append((now, volunteer))
        self.held_by[volunteer].add(d)
        self.charge(d, c.register_server_ms, c.register_bytes)
        born = self.born[volunteer]
        if volunteer in self.unplaced:
            self.unplaced.discard(volunteer)
            self.first_peer.append(now + self.rtt_s / 2 + c.register_server_ms / 1000 - born)
        if volunteer in self.joining and d not in self.hostile:
            self.joining.discard(volunteer)
            self.join_found.append(now - born)

    def _sweep(self, _: object) -> None:
        """Each directory forgets registrations not refreshed within the TTL."""
        now = self.engine.now
        cutoff = now - self.sc.registration_ttl_s
        for d, queue in self.expiry.items():
            regs = self.reg[d]
            while queue and queue[0][0] < cutoff:
                refreshed, volunteer = queue.popleft()
                if regs.get(volunteer) == refreshed:
                    del regs[volunteer]
                    self._unhold(volunteer, d, now)
        self.engine.after(self.costs.sweep_s, self._sweep)

    def finish(self) -> None:
        """A joiner no honest directory held by the end, a minute or more after it
        joined, counts as never found (infinite), so the percentiles say so."""
        end = self.sc.duration_s - 60.0
        self.join_found += [INF for v in self.joining if self.alive[v] and self.born[v] <= end]

    def kept_before(self, d: int) -> bool:
        """Whether a node that ran before still counts `d` as a directory that
        answered: an honest one; a hostile one only if it answers and nothing the
        node checks gave it away (its count is believable, and without the listing
        check its hiding goes unseen)."""
        behaviour = self.hostile.get(d)
        if behaviour is None:
            return True
        if not self.reachable(d) or behaviour == "zero_counts":
            return False
        return not self.sc.listing_check

    def audits(self, node: int) -> bool:
        """A directory takes every receipt; another node only while it has not heard
        that the network is large."""
        return self.role[node] == DIRECTORY or not self.regs[node].large

    def served_in(self, d: int, ms: float) -> float:
        """Seconds from now until directory `d` has answered a request that costs it
        `ms` of CPU. A node is one thread: a request waits for those before it, and
        what its connections and its idling take (`background_share`) slows each one;
        a directory whose background alone fills its core never answers. At once
        without `saturation`, and from a hostile directory (which does no work)."""
        if d in self.hostile:
            return 0.0
        now, busy = self.engine.now, self.background_share(d)
        if not self.sc.saturation:
            wait = ms / 1000
        elif busy >= 1:
            wait = INF
        else:
            start = max(now, self.busy_until.get(d, 0.0))
            self.busy_until[d] = start + ms / 1000 / (1 - busy)
            wait = self.busy_until[d] - now
        if now >= self.warmup_s:
            self.directory_waits.append(wait)
            self.directory_timeouts += wait + self.rtt_s > REQUEST_TIMEOUT_S
        return wait

    def background_share(self, d: int) -> float:
        """The share of `d`'s core its idling and open connections take."""
        c = self.costs
        conns = self.sc.connections + self._conn_count.get(d, 0)
        return (c.idle_ms_per_min + c.conn_ms_per_min * conns) / 60_000

    def candidates(self, placement: Placement, d: int) -> list[int]:
        """An honest answer: up to `want` (at most 64) random fitting registrations."""
        owner, fits = placement.owner, self.fits
        fitting = [v for v in self.reg[d] if fits[v] and v != owner]
        return self.pick_rng.sample(fitting, min(placement.want, MAX_ANSWER, len(fitting)))
