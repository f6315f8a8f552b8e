"""Design directory's placement: query, probe 2K candidates, offer to K that answered.

Kept apart from the registrations (directory.py) because it is the owner's side: what
a placement waits for and what it pays. As `node/net/finder.py` and
`node/net/discovery/search.py` do it, a round asks Q = 3 directories at once: first
those that listed the owner (passed its listing check; only those, when two or more
did), then those that answered before, then untried ones, in random order within each
group; it uses the first two answers, all
three while those two hold fewer ads than wanted (a directory that hides everyone
answers fastest), takes their ads one from each in turn, checks each ad, and probes up
to 2K candidates it has not probed yet, in random order, all at once; the placement
has its K peers when the K-th live probe answers. A round that ends (every probe
answered or timed out) with fewer than K live peers starts another, up to
`max_rounds`. A directory whose returned peers mostly fail their probes (after 8, fewer
than half answered) rests like one that failed.

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

from benchmarks.simulate.registration import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from benchmarks.simulate.directory import DirectoryNetwork

MAX_ANSWER = 64  # peers a directory returns at most
PROBE_TIMEOUT_S = 3.0  # node.net.finder: a probe's budget
DIAL_ROUND_TRIPS = 6
PROBE_ROUND_TRIPS = 2


class Placement:
    """One owner's search for K live peers."""

    __slots__ = (
        "owner", "start", "round", "probed", "live", "outstanding", "pool", "answers",
        "asked", "pending", "closed", "want", "bound",
    )  # fmt: skip

    def __init__(self, owner: int, start: float) -> None:
        self.owner = owner
        self.start = start
        self.round = 0
        self.probed: set[int] = set()
        self.live = 0
        self.outstanding = 0  # probes not yet answered or timed out
        self.pool: dict[int, int] = {}  # candidates from every answer -> their directory
        self.answers: list[tuple[int, list[int]]] = []  # this round's, in arrival order
        self.asked = 0  # directories asked this round
        self.pending = 0  # ... not yet answered or failed
        self.closed = False  # this round's answers are in (later ones are not read)
        self.want = 0  # ads asked for
        self.bound: list[int] = []  # the first K peers that answered


class PlacementMixin:
    """The owner's side of design directory, mixed into DirectoryNetwork."""

    def place(self: DirectoryNetwork, owner: int) -> None:
        self._round(Placement(owner, self.engine.now))

    def _round(self: DirectoryNetwork, placement: Placement) -> None:
        placement.round += 1
        owner, now, c = placement.owner, self.engine.now, self.costs
        st = self.regs[owner]
        groups: tuple[list[int], list[int], list[int]] = ([], [], [])
        for d in self.order(owner):
            if st.rest_until.get(d, 0.0) <= now:
                groups[0 if d in st.listed else 1 if d in st.good else 2].append(d)
        for group in groups:
            self.probe_rng.shuffle(group)
        # only directories that listed the owner, when enough did (the node's rule:
        # a third one could answer first with its friends and take half the list)
        listed_only = self.sc.ask_listed_only and len(groups[0]) >= self.sc.query_answers
        order = groups[0] if listed_only else groups[0] + groups[1] + groups[2]
        asked = order[: self.sc.n_queries]
        if not asked:  # knows no usable directory: nothing to ask
            self._give_up(placement)
            return
        placement.answers, placement.closed = [], False
        placement.asked = placement.pending = len(asked)
        placement.want = 2 * self.sc.k + len(placement.probed)
        for d in asked:
            key = (placement, d, placement.round)
            if not self.alive[d]:
                self.engine.after(c.dial_timeout_s, self._query_failed, key)
                continue
            if not self.reachable(d):
                self.engine.after(REQUEST_TIMEOUT_S, self._query_failed, key)
                continue
            server_ms = c.query_server_ms + c.query_per_ad_ms * min(placement.want, MAX_ANSWER)
            delay = self.rtt_s + self.served_in(d, server_ms)
            if d not in self.open_to[owner] and d not in st.dialled:
                st.dialled.add(d)  # kept open: an owner asks every minute
                self.dial(owner, d)
                delay += self.connect_s
            if delay > REQUEST_TIMEOUT_S:  # answered after the owner gave up
                self.charge(d, server_ms, 0)
                self.engine.after(REQUEST_TIMEOUT_S, self._query_failed, key)
                continue
            self.engine.after(delay, self._answer, key)

    def _answer(self: DirectoryNetwork, key: tuple[Placement, int, int]) -> None:
        placement, d, round_ = key
        if not self.alive[d]:  # died while the query was on its way
            self._query_failed(key)
            return
        got = self.answer(placement, d)
        c, owner = self.costs, placement.owner
        self.charge(d, c.query_server_ms + c.query_per_ad_ms * len(got), c.ad_bytes * len(got))
        if round_ != placement.round or placement.closed:
            return  # the owner had enough answers: this one is not read
        self.charge(owner, 0, c.ad_bytes * len(got))
        count = self.reg_count(d)
        if not count or self.heard(owner, d, count):  # a count it could not hold: dropped
            placement.answers.append((d, got))
        placement.pending -= 1
        enough = len(placement.answers) >= self.sc.query_answers and (
            sum(len(g) for _, g in placement.answers) >= placement.want
        )
        if enough or placement.pending == 0:
            self._probe_candidates(placement)

    def _query_failed(self: DirectoryNetwork, key: tuple[Placement, int, int]) -> None:
        placement, d, round_ = key
        if round_ != placement.round or placement.closed:
            return
        self.failed(placement.owner, d)
        placement.pending -= 1
        if placement.pending == 0:
            self._probe_candidates(placement)

    def _probe_candidates(self: DirectoryNetwork, placement: Placement) -> None:
        """The answers used are in: merge them one from each in turn, check the ads,
        probe up to 2K new candidates at once, in random order."""
        placement.closed = True
        c, owner = self.costs, placement.owner
        merged: dict[int, int] = {}
        rows = [got for _, got in placement.answers]
        for i in range(max(map(len, rows), default=0)):
            for (d, _), got in zip(placement.answers, rows, strict=True):
                if i < len(got):
                    merged.setdefault(got[i], d)
        ads = list(merged.items())[: placement.want]
        for peer, d in ads:
            if peer not in placement.probed:
                placement.pool.setdefault(peer, d)
        new = [p for p in placement.pool if p not in placement.probed]
        self.probe_rng.shuffle(new)
        chosen = new[: 2 * self.sc.k]
        checking_ms = c.query_client_ms * placement.asked + c.ad_check_ms * len(ads)
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
                self.engine.after(c.dial_timeout_s, self._probe_dead, (placement, peer))
                continue
            self.charge(peer, c.probe_server_ms, c.probe_bytes)
            wait_s = answered_open_s
            if peer in dialled_set:
                wait_s = self.probe_path_s(peer, answered_new_s)
            if wait_s > PROBE_TIMEOUT_S:  # behind a NAT with no relay slot: unreachable
                self.engine.after(PROBE_TIMEOUT_S, self._probe_dead, (placement, peer))
                continue
            self.engine.after(wait_s, self._probe_live, (placement, peer))
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

    def _probe_live(self: DirectoryNetwork, arg: tuple[Placement, int]) -> None:
        placement, peer = arg
        self.vouched(placement.owner, placement.pool[peer], True)
        placement.live += 1
        if placement.live <= self.sc.k:
            placement.bound.append(peer)
        if placement.live == self.sc.k:  # offers go to these K now
            self.find_k.append(self.engine.now - placement.start)
            self.rounds.append(placement.round)
            self.placed(placement.bound)
            self.units_started(placement.bound)
        self._probe_done(placement)

    def _probe_dead(self: DirectoryNetwork, arg: tuple[Placement, int]) -> None:
        placement, peer = arg
        self.vouched(placement.owner, placement.pool[peer], False)
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
