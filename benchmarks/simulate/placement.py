"""Design directory's placement: query, probe 2K candidates, offer to K that answered.

Kept apart from the registrations (directory.py) because it is the owner's side: what
a placement waits for and what it pays. As `node/net/finder.py` does it, a round asks
Q directories at once and waits for every answer (or failure); the owner checks every
ad it got, then probes up to 2K candidates it has not probed yet, all at once; the
placement has its K peers when the K-th live probe answers. A round that ends (every
probe answered or timed out) with fewer than K live peers starts another, up to
`max_rounds`.

What a probe waits for (measured on real owners, docs/performance.md): the owner is
one thread, so it first sends every probe (`probe_client_ms` each, in turn), and it
pays each new connection's handshakes (`dial_ms`) in turn too. The peers' side of
those handshakes is paid at once on their own machines, or in turn where they share a
few cores with the owner (the validation runs). A dial is about six round trips (TCP,
multistream, Noise's two, the muxer's multistream, identify) whose steps interleave on
the owner with everyone else's; a probe over an open connection is two (multistream,
the request), so its answer comes about a third of the way through that dial work, and
a dialled probe's at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.simulate.directory import DirectoryNetwork

DIAL_ROUND_TRIPS = 6
PROBE_ROUND_TRIPS = 2


class Placement:
    """One owner's search for K live peers."""

    __slots__ = ("owner", "start", "round", "probed", "live", "outstanding", "got", "asked")

    def __init__(self, owner: int, start: float) -> None:
        self.owner = owner
        self.start = start
        self.round = 0
        self.probed: set[int] = set()
        self.live = 0
        self.outstanding = 0  # queries, then probes, not yet answered or timed out
        self.got: list[int] = []  # this round's candidates, from every answer
        self.asked = 0  # directories that answered this round


class PlacementMixin:
    """The owner's side of design directory, mixed into DirectoryNetwork."""

    def place(self: DirectoryNetwork, owner: int) -> None:
        self._round(Placement(owner, self.engine.now))

    def _round(self: DirectoryNetwork, placement: Placement) -> None:
        placement.round += 1
        placement.got, placement.asked = [], 0
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
        c = self.costs
        self.charge(d, c.query_server_ms + c.query_per_ad_ms * len(got), c.ad_bytes * len(got))
        self.charge(placement.owner, 0, c.ad_bytes * len(got))
        placement.got += got
        placement.asked += 1
        self._query_done(placement)

    def _query_failed(self: DirectoryNetwork, arg: tuple[Placement, int]) -> None:
        placement, d = arg
        self.failed.setdefault(placement.owner, set()).add(d)
        self.choice_epoch[placement.owner] = -1
        self._query_done(placement)

    def _query_done(self: DirectoryNetwork, placement: Placement) -> None:
        placement.outstanding -= 1
        if placement.outstanding == 0:
            self._probe_candidates(placement)

    def _probe_candidates(self: DirectoryNetwork, placement: Placement) -> None:
        """Every answer is in: check the ads, probe up to 2K new candidates at once."""
        c, owner = self.costs, placement.owner
        new = list(dict.fromkeys(p for p in placement.got if p not in placement.probed))
        chosen = new[: 2 * self.sc.k]
        checking_ms = c.query_client_ms * placement.asked + c.ad_check_ms * len(placement.got)
        sending_ms = checking_ms + c.probe_client_ms * len(chosen)
        self.charge(owner, sending_ms, c.probe_bytes * len(chosen))
        live = [p for p in chosen if self.alive[p]]
        dialled = [p for p in live if self.probe_rng.random() >= self.sc.connected_share]
        dial_wall_ms = self._dial_wall_ms(owner, dialled)
        sent_s = (sending_ms + c.rtt_ms + self._serving_ms(live)) / 1000
        answered_open_s = sent_s + dial_wall_ms * PROBE_ROUND_TRIPS / DIAL_ROUND_TRIPS / 1000
        answered_new_s = sent_s + dial_wall_ms / 1000 + self.connect_s
        dialled_set = set(dialled)
        for peer in chosen:
            placement.probed.add(peer)
            placement.outstanding += 1
            if not self.alive[peer]:
                self.dead_candidates_probed += 1
                self.engine.after(c.dial_timeout_s, self._probe_done, placement)
                continue
            self.charge(peer, c.probe_server_ms, c.probe_bytes)
            wait_s = answered_new_s if peer in dialled_set else answered_open_s
            self.engine.after(wait_s, self._probe_live, placement)
        if not chosen:  # nothing new to probe: this round is over
            placement.outstanding += 1
            self._probe_done(placement)

    def _dial_wall_ms(self: DirectoryNetwork, owner: int, dialled: list[int]) -> float:
        """Charge each end its handshakes; the ms they take: the owner's in turn, then
        the dialled peers' side, at once on their own machines, or queued on the cores
        they share with the owner."""
        dial_ms, shared = self.costs.dial_ms, self.sc.shared_cores
        self.charge(owner, dial_ms * len(dialled), 0)
        for peer in dialled:
            self.charge(peer, dial_ms, 0)
        if not dialled:
            return 0.0
        peers_ms = dial_ms * len(dialled) / shared if shared else dial_ms
        return dial_ms * len(dialled) + peers_ms

    def _serving_ms(self: DirectoryNetwork, live: list[int]) -> float:
        """The probed peers answering: at once, or in turn on a few shared cores."""
        shared = self.sc.shared_cores
        n = len(live) / shared if shared else min(1, len(live))
        return self.costs.probe_server_ms * n

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
