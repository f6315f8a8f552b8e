"""Design directory's placement: query, probe every candidate, offer to K that answered.

Kept apart from the registrations (directory.py) because it is the owner's side: what
a placement waits for and what it pays. A round queries Q directories in parallel;
each answer's new candidates are probed at once; the placement has its K peers when
the K-th live probe answers. If a round ends (every query and probe answered or timed
out) with fewer than K live peers, the owner queries again, up to `max_rounds`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.simulate.directory import DirectoryNetwork


class Placement:
    """One owner's search for K live peers."""

    __slots__ = ("owner", "start", "round", "probed", "live", "outstanding", "dialled")

    def __init__(self, owner: int, start: float) -> None:
        self.owner = owner
        self.start = start
        self.round = 0
        self.probed: set[int] = set()
        self.live = 0
        self.outstanding = 0  # queries and probes not yet answered or timed out
        # new connections so far: their handshakes share the owner's one thread, whichever
        # directory's answer named the peer
        self.dialled = 0


class PlacementMixin:
    """The owner's side of design directory, mixed into DirectoryNetwork."""

    def place(self: DirectoryNetwork, owner: int) -> None:
        self._round(Placement(owner, self.engine.now))

    def _round(self: DirectoryNetwork, placement: Placement) -> None:
        placement.round += 1
        dirs = self.ranked(placement.owner, self.sc.n_queries)
        if not dirs:  # knows no live directory: nothing to ask
            self._give_up(placement)
            return
        query_s = self.rtt_s + self.costs.query_server_ms / 1000
        for d in dirs:
            placement.outstanding += 1
            if self.alive[d]:
                self.engine.after(query_s, self._answer, (placement, d))
            else:
                self.engine.after(self.costs.dial_timeout_s, self._query_failed, (placement, d))

    def _answer(self: DirectoryNetwork, arg: tuple[Placement, int]) -> None:
        placement, d = arg
        got = self.candidates(placement, d)
        if got is None:  # died while the query was on its way
            self._query_failed(arg)
            return
        c, owner = self.costs, placement.owner
        checking_ms = c.query_client_ms + c.ad_check_ms * len(got)
        self.charge(owner, checking_ms, c.ad_bytes * len(got))
        self.charge(d, c.query_server_ms + c.query_per_ad_ms * len(got), c.ad_bytes * len(got))
        # the owner is one thread: it checks the answer, then each probe's answer in turn
        start_s = checking_ms / 1000
        answered = 0
        for peer in got:
            if peer in placement.probed:
                continue
            placement.probed.add(peer)
            placement.outstanding += 1
            self.charge(owner, c.probe_client_ms, c.probe_bytes)
            if self.alive[peer]:
                self.charge(peer, c.probe_server_ms, c.probe_bytes)
                connected = self.probe_rng.random() < self.sc.connected_share
                answered += 1
                probe_s = self.rtt_s + start_s + answered * c.probe_client_ms / 1000
                if not connected:  # a new connection: the handshakes queue on the owner
                    placement.dialled += 1
                    self.charge(owner, c.dial_ms, 0)
                    self.charge(peer, c.dial_ms, 0)
                    probe_s += self.connect_s + placement.dialled * c.dial_ms / 1000
                # the peer's own work: at once, or in turn when N nodes share a few cores
                shared = self.sc.shared_cores
                probe_s += c.probe_server_ms / 1000 * (answered / shared if shared else 1)
                self.engine.after(probe_s, self._probe_live, placement)
            else:
                self.dead_candidates_probed += 1
                self.engine.after(c.dial_timeout_s, self._probe_done, placement)
        self._probe_done(placement)

    def _query_failed(self: DirectoryNetwork, arg: tuple[Placement, int]) -> None:
        placement, d = arg
        self.failed.setdefault(placement.owner, set()).add(d)
        self.choice_epoch[placement.owner] = -1
        self._probe_done(placement)

    def _probe_live(self: DirectoryNetwork, placement: Placement) -> None:
        placement.live += 1
        if placement.live == self.sc.k:  # offers go to these K now
            self.find_k.append(self.engine.now - placement.start)
            self.rounds.append(placement.round)
        self._probe_done(placement)

    def _probe_done(self: DirectoryNetwork, placement: Placement) -> None:
        placement.outstanding -= 1
        if placement.outstanding or placement.live >= self.sc.k:
            return
        if placement.round < self.sc.max_rounds:
            self._round(placement)
        else:
            self._give_up(placement)

    def _give_up(self: DirectoryNetwork, placement: Placement) -> None:
        self.placements_failed += 1
        self.rounds.append(placement.round)
