"""Hostile directories (S of them, beside the M honest ones) and what they cost the
network: whether honest volunteers can still be found, and by whom placements are won.

A hostile directory signs its own ads and is gossiped like any other, so every node
knows it. What it does with the requests it gets (`Scenario.hostile_behaviour`):

- silent_drop: takes registrations and answers a plausible count (what it holds, or
  `hostile_count`), but never returns a registrant: queries get nothing, or only the
  attacker's own peers when it has some;
- zero_counts: answers every registration and query with 0 peers, a count no node
  hears (1..16384 only), so the node rests it as one that failed;
- friends_only: takes registrations, answers a plausible count, and answers queries
  only with the attacker's own peers, which are alive and answer probes;
- dead_ads: its ads carry unroutable addresses, so every request to it times out
  (the node's 3 s).

A hostile directory answers at once (no server time), so it is first among answers.
The attacker's own peers (`attacker_peers`, a share of the volunteers) never leave,
register with honest directories only, and are listed by every hostile one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.simulate.network import VOLUNTEER
from benchmarks.simulate.scenario import BEHAVIOURS

if TYPE_CHECKING:
    from benchmarks.simulate.directory import DirectoryNetwork
    from benchmarks.simulate.placement import Placement

SILENT_DROP, ZERO_COUNTS, FRIENDS_ONLY, DEAD_ADS = BEHAVIOURS


class HostileMixin:
    """The hostile directories' side and the attack's measurements, mixed into
    DirectoryNetwork."""

    def start_hostile(self: DirectoryNetwork) -> None:
        """Pick the attacker's peers; neither they nor hostile directories leave."""
        volunteers = [v for v in range(len(self.alive)) if self.role[v] == VOLUNTEER]
        count = round(self.sc.attacker_share * len(volunteers))
        self.attackers: list[int] = sorted(self.rng.sample(volunteers, count))
        for v in self.attackers:
            self.attacker[v] = True
            self.churnable.remove(v)
        self.attackers_fitting: list[int] = [v for v in self.attackers if self.fits[v]]
        for d in self.hostile:
            self.churnable.remove(d)
        self.engine.at(self.warmup_s, self._sample)

    # -- what a directory answers ------------------------------------------------------

    def reachable(self: DirectoryNetwork, d: int) -> bool:
        return self.hostile.get(d) != DEAD_ADS

    def reg_count(self: DirectoryNetwork, d: int) -> int:
        """The count a registration's (or query's) answer carries."""
        behaviour = self.hostile.get(d)
        if behaviour == ZERO_COUNTS:
            return 0
        if behaviour is not None and self.sc.hostile_count is not None:
            return self.sc.hostile_count
        return len(self.reg[d])

    def lists(self: DirectoryNetwork, d: int, node: int) -> bool:
        """Whether `d` returns `node` to a stranger whose seed ranks it first."""
        if d in self.hostile:
            return self.attacker[node]
        return node in self.reg[d]

    def answer(self: DirectoryNetwork, placement: Placement, d: int) -> list[int]:
        """The peers `d` returns to an owner's query."""
        behaviour = self.hostile.get(d)
        if behaviour is None:
            return self.candidates(placement, d)
        if behaviour in (SILENT_DROP, FRIENDS_ONLY):
            pool = self.attackers_fitting
            return self.pick_rng.sample(pool, min(placement.want, len(pool)))
        return []

    # -- measuring -----------------------------------------------------------------------

    def _sample(self: DirectoryNetwork, _: object) -> None:
        """The share of live honest volunteers that an honest directory holds (and so
        lists), and the attacker's share of the live fitting volunteers."""
        honest = held = fitting = 0
        hostile = self.hostile
        for v in self.live.items:
            if self.role[v] != VOLUNTEER:
                continue
            fitting += self.fits[v]
            if self.attacker[v]:
                continue
            honest += 1
            held += any(d not in hostile for d in self.held_by[v])
        if honest:
            self.findable.append((self.engine.now, held / honest))
        if fitting:
            self.attacker_capacity.append(len(self.attackers_fitting) / fitting)
        self.engine.after(self.sc.sample_s, self._sample)

    def placed(self: DirectoryNetwork, peers: list[int]) -> None:
        """A placement was bound to `peers` (the first K that answered)."""
        self.bound += len(peers)
        self.bound_to_attacker += sum(self.attacker[p] for p in peers)
