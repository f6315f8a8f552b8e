"""Design directory (new): volunteers register their ad with a few directories, owners
query those and probe what they get back before offering work.

Only directories gossip their ads, so every node's gossip load is M ads per interval
however many volunteers there are. A volunteer picks its D directories by
highest-random-weight hashing over the directories it knows to be live (their ads
have reached it and not expired, and it has not seen a request to them fail), so all
volunteers spread evenly and a directory's death moves only its own volunteers. A
registration is kept `registration_ttl_s` after its last refresh, so a query can
return a dead volunteer; owners probe every candidate, and offer only to those that
answered (late binding), which is why offers never reach a dead peer here.
"""

from __future__ import annotations

from collections import deque

from benchmarks.simulate.engine import sweep_after
from benchmarks.simulate.network import DIRECTORY, Network
from benchmarks.simulate.placement import Placement, PlacementMixin

MASK = (1 << 64) - 1


def rendezvous_weight(peer: int, directory: int) -> int:
    """A 64-bit hash of (peer, directory) (splitmix64's finaliser): the same in every
    run and process, unlike hash() of a tuple."""
    x = (peer * 0x9E3779B97F4A7C15 + directory * 0xC2B2AE3D27D4EB4F + 1) & MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class DirectoryNetwork(PlacementMixin, Network):
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
            self.choice: list[tuple[int, ...]] = []
            self.choice_epoch: list[int] = []
            self.open_to: list[set[int]] = []  # directories a volunteer is connected to
            self.held_by: list[set[int]] = []  # live directories holding its registration
            self.failed: dict[int, set[int]] = {}  # directories a node saw fail
            self.reg: dict[int, dict[int, float]] = {}  # directory -> volunteer -> refreshed
            self.expiry: dict[int, deque[tuple[float, int]]] = {}
            self.pending_dead: dict[int, tuple[float, list[float]]] = {}
            self.joining: set[int] = set()
            self.connecting: set[tuple[int, int]] = set()
            self.epoch = 0
            self.known: list[int] = []
        self.choice.append(())
        self.choice_epoch.append(-1)
        self.open_to.append(set())
        self.held_by.append(set())
        if self.role[node] == DIRECTORY:
            self.reg[node] = {}
            self.expiry[node] = deque()

    def on_start(self) -> None:
        """Every volunteer registered one interval before its random phase."""
        sc = self.sc
        self.known = list(self.directory_ids)
        interval = sc.register_interval_s
        entries: dict[int, list[tuple[float, int]]] = {d: [] for d in self.directory_ids}
        for node in range(len(self.alive)):
            if self.role[node] == DIRECTORY:
                continue
            phase = self.rng.uniform(0, interval)
            for d in self.chosen(node):
                self.reg[d][node] = phase - interval
                entries[d].append((phase - interval, node))
                self.held_by[node].add(d)
                self.open_to[node].add(d)
                self.conn_change(d, 1)
            self.engine.at(phase, self._tick, node)
        for d, items in entries.items():
            self.expiry[d] = deque(sorted(items))
        self.engine.at(self.costs.sweep_s, self._sweep)

    # -- which directories -------------------------------------------------------------

    def ranked(self, node: int, count: int) -> tuple[int, ...]:
        """The `count` live directories `node` knows, highest rendezvous weight first."""
        failed = self.failed.get(node, ())
        known = [d for d in self.known if d not in failed]
        known.sort(key=lambda d: rendezvous_weight(node, d), reverse=True)
        return tuple(known[:count])

    def chosen(self, node: int) -> tuple[int, ...]:
        """A volunteer's D directories, recomputed only when what it knows changed."""
        if self.choice_epoch[node] != self.epoch:
            self.choice[node] = self.ranked(node, self.sc.directory_peers)
            self.choice_epoch[node] = self.epoch
        return self.choice[node]

    def _bump(self, _: object) -> None:
        """A directory's ad first reached, or expired from, every node's table."""
        now, sweep = self.engine.now, self.costs.sweep_s
        ttl = self.sc.peer_ttl_s * self.sc.directory_ad_factor  # a directory entry's TTL
        self.epoch += 1
        self.known = [
            d
            for d in self.directory_ids
            if self.first_ad[d] <= now and sweep_after(float(self.last_ad[d]), ttl, sweep) > now
        ]

    def on_first_ad(self, node: int, delivered: float) -> None:
        if self.born[node] > 0:
            self.engine.at(delivered, self._bump)

    # -- joining, leaving ----------------------------------------------------------------

    def on_join(self, node: int) -> None:
        """Connect to a random peer, take its table (the directories' ads), then connect
        to the chosen directories and register."""
        check_s = self.costs.table_ad_check_ms * len(self.known) / 1000
        if self.role[node] != DIRECTORY:
            self.joining.add(node)
        self.engine.after(self.join_connect_s + self.rtt_s + check_s, self._fetched, node)

    def _fetched(self, node: int) -> None:
        if not self.alive[node]:
            return
        count = len(self.known)
        self.charge(node, self.costs.table_ad_check_ms * count, self.costs.ad_bytes * count)
        if self.role[node] == DIRECTORY:
            return
        for d in self.chosen(node):
            self._connect(node, d)
        self.engine.after(self.connect_s + self.sc.register_interval_s, self._tick, node)

    def on_leave(self, node: int) -> None:
        now = self.engine.now
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

    # -- registering -------------------------------------------------------------------

    def _tick(self, volunteer: int) -> None:
        """Refresh the registrations; a dead directory shows as a failed request."""
        if not self.alive[volunteer]:
            return
        dirs = self.chosen(volunteer)
        open_to = self.open_to[volunteer]
        for d in dirs:
            if d not in open_to:
                self._connect(volunteer, d)
            elif self.alive[d]:
                self._store(volunteer, d)
            else:
                self._request(volunteer, d, self.costs.dial_timeout_s, self._failed)
        for d in [d for d in open_to if d not in dirs]:  # no longer chosen: hang up
            open_to.discard(d)
            if self.alive[d]:
                self.conn_change(d, -1)
        self.engine.after(self.sc.register_interval_s, self._tick, volunteer)

    def _request(self, volunteer: int, d: int, delay: float, then: object) -> None:
        key = (volunteer, d)
        if key not in self.connecting:
            self.connecting.add(key)
            self.engine.after(delay, then, key)

    def _connect(self, volunteer: int, d: int) -> None:
        if self.alive[d]:
            self._request(volunteer, d, self.connect_s + self.rtt_s / 2, self._connected)
        else:
            self._request(volunteer, d, self.costs.dial_timeout_s, self._failed)

    def _connected(self, key: tuple[int, int]) -> None:
        self.connecting.discard(key)
        volunteer, d = key
        if not self.alive[volunteer]:
            return
        if not self.alive[d]:
            self._failed(key)
            return
        if d not in self.open_to[volunteer]:
            self.open_to[volunteer].add(d)
            self.conn_change(d, 1)
        self._store(volunteer, d)

    def _failed(self, key: tuple[int, int]) -> None:
        """A request to a dead directory timed out: choose again, register at once."""
        self.connecting.discard(key)
        volunteer, d = key
        if not self.alive[volunteer]:
            return
        self.failed.setdefault(volunteer, set()).add(d)
        self.choice_epoch[volunteer] = -1
        self.open_to[volunteer].discard(d)
        for new in self.chosen(volunteer):
            if new not in self.open_to[volunteer]:
                self._connect(volunteer, new)

    def _store(self, volunteer: int, d: int) -> None:
        now, c = self.engine.now, self.costs
        self.reg[d][volunteer] = now
        self.expiry[d].append((now, volunteer))
        self.held_by[volunteer].add(d)
        if now >= self.warmup_s:
            self.cpu[volunteer] += c.register_client_ms
            self.cpu[d] += c.register_server_ms
            self.nbytes[volunteer] += c.register_bytes
            self.nbytes[d] += c.register_bytes
        if volunteer in self.joining:
            self.joining.discard(volunteer)
            born = self.born[volunteer]
            self.join_found.append(now - born)
            self.first_peer.append(now + self.rtt_s / 2 + c.register_server_ms / 1000 - born)

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

    # -- placing -----------------------------------------------------------------------

    def candidates(self, placement: Placement, d: int) -> list[int] | None:
        """Up to 2K random fitting registrations at `d` (None: `d` is dead)."""
        regs = self.reg.get(d)
        if regs is None:
            return None
        owner, fits = placement.owner, self.fits
        fitting = [v for v in regs if fits[v] and v != owner]
        return self.rng.sample(fitting, min(2 * self.sc.k, len(fitting)))
