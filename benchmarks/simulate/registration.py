"""A node's side of the directories in design directory, step by step as
`node/net/discovery/registration.py` takes it: which directories it registers with,
what it makes of their answers, the listing check, and whether it would fall back to
gossiping its own ad to every node.

Each node keeps its own view (`NodeState`), since what a hostile directory does shows
only per node: whom it answered, whom it failed, who caught it hiding. The node's
registration loop looks at least once a second; here it runs only when something is
due or changed (a refresh falls due, an answer or a failure came, a rest ran out), at
the node's next whole-second tick, so a steady network costs one event per node and
registration interval. A refresh of a directory already connected and answering is
taken at once, without its round trip: nothing the node decides depends on those
milliseconds, and a 10,000-node run stays a few seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.simulate.network import DIRECTORY, INF

if TYPE_CHECKING:
    from benchmarks.simulate.directory import DirectoryNetwork

# the node's constants (registration.py)
TRIED_AT_ONCE = 8  # untried directories registered with at once while too few answered
RETRY_FIRST_S = 5.0  # a directory that did not answer rests this long, doubling
FAILED_PAUSE_S = 120.0  # up to this
REQUEST_TIMEOUT_S = 3.0  # a directory request to an address nobody answers
COUNT_FRESH_S = 900.0  # a directory's count is used this long after it was heard
MAX_REGISTRATIONS = 16384  # a count above this could not be held: not heard
RATED_AFTER = 8  # peers a directory returned, probed, before its answers are judged
MIN_LIVE_SHARE = 0.5  # of those, at least this share must answer
CHECK_WANT = 64  # a listing check asks for this many ads (MAX_WANT)
CHECK_RANK = 8  # its ground seed ranks the node about here: ads checked before its own
LOOP_S = 1.0  # the registration loop looks at least this often
EPS = 1e-9
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


class NodeState:
    """What one node knows of the directories (the node's `Registration` fields)."""

    __slots__ = (
        "phase", "ready", "wake", "good", "failures", "rest_until", "registered_at",
        "in_flight", "counts", "listed", "checked_at", "vouched", "large", "gossiping",
        "order", "order_epoch", "cached", "cache_until", "dialled",
    )  # fmt: skip

    def __init__(self) -> None:
        self.phase = 0.0  # where in each second its loop looks
        self.ready = False  # has its first peer's table, which names the directories
        self.wake = INF  # the loop's next look already scheduled
        self.good: set[int] = set()  # answered with a count it could hold
        self.failures: dict[int, int] = {}  # failures in a row
        self.rest_until: dict[int, float] = {}  # failed (or caught hiding): skipped until
        self.registered_at: dict[int, float] = {}  # when the last answered one was sent
        self.in_flight: set[int] = set()
        self.counts: dict[int, tuple[int, float]] = {}  # count heard, when
        self.listed: set[int] = set()  # passed this node's listing check
        self.checked_at: dict[int, float] = {}
        self.vouched: dict[int, tuple[int, int]] = {}  # (answered, probed) of its peers
        self.large = False  # heard a large network (remembered for a day: the whole run)
        self.gossiping = False  # fell back to gossiping its ad to every node
        self.order: list[int] = []  # known directories by rendezvous weight
        self.order_epoch = -1
        self.cached: list[int] | None = None  # chosen(), until something changes
        self.cache_until = INF
        self.dialled: set[int] = set()  # directories an owner opened a query connection to


class RegistrationMixin:
    """The node side, mixed into DirectoryNetwork."""

    # -- which directories -------------------------------------------------------------

    def order(self: DirectoryNetwork, node: int) -> list[int]:
        """The directories `node` knows, highest rendezvous weight first (the attacker's
        own peers leave out the attacker's directories)."""
        st = self.regs[node]
        if st.order_epoch != self.epoch:
            known = self.known
            if self.attacker[node]:
                known = [d for d in known if d not in self.hostile]
            st.order = sorted(known, key=lambda d: rendezvous_weight(node, d), reverse=True)
            st.order_epoch = self.epoch
            st.cached = None
        return st.order

    def chosen(self: DirectoryNetwork, node: int) -> list[int]:
        """The node's `chosen()`: by rendezvous among the usable directories that
        answered, then among untried ones; while fewer than D answered, up to
        TRIED_AT_ONCE untried ones at once."""
        st, now = self.regs[node], self.engine.now
        order = self.order(node)
        if st.cached is not None and now < st.cache_until:
            return st.cached
        want = self.sc.directory_peers
        good: list[int] = []
        untried: list[int] = []
        next_usable = INF
        for d in order:
            until = st.rest_until.get(d, 0.0)
            if until > now:
                next_usable = min(next_usable, until)
            else:
                (good if d in st.good else untried).append(d)
        picked = good[:want]
        st.cache_until = INF
        if len(picked) < want:
            more = TRIED_AT_ONCE if len(st.good) < want else 0
            picked += untried[: max(want - len(picked), more)]
            st.cache_until = next_usable  # a rested one may be picked again then
        st.cached = picked
        self.choice[node] = tuple(picked)
        return picked

    # -- the loop ----------------------------------------------------------------------

    def wake_at(self: DirectoryNetwork, node: int, time: float) -> None:
        st = self.regs[node]
        if time < st.wake:
            st.wake = time
            self.engine.at(time, self._loop, node)

    def soon(self: DirectoryNetwork, node: int, after: float | None = None) -> None:
        """The loop's next look at or after `after` (default now)."""
        phase = self.regs[node].phase
        time = self.engine.now if after is None else after
        self.wake_at(node, time + (phase - time) % LOOP_S)

    def _loop(self: DirectoryNetwork, node: int) -> None:
        st, now = self.regs[node], self.engine.now
        if not self.alive[node] or now != st.wake:
            return  # dead, or a look superseded by an earlier one
        st.wake = INF
        chosen = self.chosen(node)
        for d in [d for d in st.registered_at if d not in chosen]:
            del st.registered_at[d]
        open_to = self.open_to[node]
        for d in [d for d in open_to if d not in chosen and d not in st.in_flight]:
            open_to.discard(d)  # no longer chosen: hang up
            if self.alive[d]:
                self.conn_change(d, -1)
        interval = self.sc.register_interval_s
        for d in chosen:
            if d not in st.in_flight and st.registered_at.get(d, -INF) + interval <= now + EPS:
                self._register(node, d)
        due = [st.registered_at[d] for d in chosen if d in st.registered_at]
        next_due = min((t for t in due if t + interval > now + EPS), default=INF) + interval
        if next_due < INF:  # (one in flight wakes the loop when it is answered)
            self.wake_at(node, next_due)
        if st.cache_until < INF:
            self.soon(node, st.cache_until)

    # -- registering -------------------------------------------------------------------

    def _register(self: DirectoryNetwork, node: int, d: int) -> None:
        st, c, now = self.regs[node], self.costs, self.engine.now
        self.charge(node, c.register_client_ms, c.register_bytes)
        connected = d in self.open_to[node]
        if connected and d in st.good and self.alive[d]:  # a refresh: at once, if in time
            if self.served_in(d, c.register_server_ms) + self.rtt_s > REQUEST_TIMEOUT_S:
                self.charge(d, c.register_server_ms, c.register_bytes)  # done too late
                st.in_flight.add(d)
                self.engine.after(REQUEST_TIMEOUT_S, self._reg_failed, (node, d))
                return
            self.store(node, d)
            if self.heard(node, d, self.reg_count(d)):
                st.registered_at[d] = now
                self._maybe_check(node, d)
            return
        st.in_flight.add(d)
        if not self.alive[d]:
            self.engine.after(c.dial_timeout_s, self._reg_failed, (node, d))
        elif not self.reachable(d):
            self.engine.after(REQUEST_TIMEOUT_S, self._reg_failed, (node, d))
        else:
            delay = self.rtt_s / 2 + (0.0 if connected else self.connect_s)
            self.engine.after(delay, self._reg_arrived, (node, d, now))

    def _reg_arrived(self: DirectoryNetwork, arg: tuple[int, int, float]) -> None:
        node, d, sent = arg
        if not self.alive[node] or not self.alive[d]:
            self._reg_failed((node, d))
            return
        if d not in self.open_to[node]:
            self.open_to[node].add(d)
            self.conn_change(d, 1)
            self.dial(node, d)
        server_s = self.served_in(d, self.costs.register_server_ms)
        timeout_at = sent + REQUEST_TIMEOUT_S
        if self.engine.now + server_s + self.rtt_s / 2 > timeout_at:
            self.charge(d, self.costs.register_server_ms, self.costs.register_bytes)
            self.engine.at(timeout_at, self._reg_failed, (node, d))  # done too late
            return
        self.store(node, d)
        answer = (node, d, sent, self.reg_count(d))
        self.engine.after(self.rtt_s / 2 + server_s, self._reg_answered, answer)

    def _reg_answered(self: DirectoryNetwork, arg: tuple[int, int, float, int]) -> None:
        node, d, sent, count = arg
        st = self.regs[node]
        st.in_flight.discard(d)
        if not self.alive[node]:
            return
        if self.heard(node, d, count):
            st.registered_at[d] = sent
            self._maybe_check(node, d)
        else:
            st.registered_at.pop(d, None)
        self.soon(node)

    def _reg_failed(self: DirectoryNetwork, arg: tuple[int, int]) -> None:
        node, d = arg
        st = self.regs[node]
        st.in_flight.discard(d)
        if not self.alive[node]:
            return
        st.registered_at.pop(d, None)
        if d in self.open_to[node]:
            self.open_to[node].discard(d)
            if self.alive[d]:
                self.conn_change(d, -1)
        self.failed(node, d)

    def failed(self: DirectoryNetwork, node: int, d: int) -> None:
        """`d` did not answer (or answered a count it could not hold): it rests 5 s,
        doubling to 120 s, and is no longer one that answered."""
        st = self.regs[node]
        failures = st.failures.get(d, 0) + 1
        st.failures[d] = failures
        pause = min(FAILED_PAUSE_S, RETRY_FIRST_S * 2 ** (failures - 1))
        # (never shortening the rest of one caught hiding, whose peers may still be probed)
        st.rest_until[d] = max(st.rest_until.get(d, 0.0), self.engine.now + pause)
        st.good.discard(d)
        st.counts.pop(d, None)
        st.cached = None
        self.soon(node)

    def heard(self: DirectoryNetwork, node: int, d: int, count: int) -> bool:
        """`d` said it holds `count` peers: kept if it could hold that many and holds
        this node; else it failed. True when kept."""
        if not 1 <= count <= MAX_REGISTRATIONS:
            self.failed(node, d)
            return False
        st = self.regs[node]
        st.failures.pop(d, None)
        if d not in st.good:
            st.good.add(d)
            st.cached = None
        st.counts[d] = (count, self.engine.now)
        self._judge_size(node)
        return True

    # -- the listing check -------------------------------------------------------------

    def _maybe_check(self: DirectoryNetwork, node: int, d: int) -> None:
        st, now = self.regs[node], self.engine.now
        if not self.sc.listing_check or self.attacker[node]:
            return
        if now - st.checked_at.get(d, -INF) < self.sc.listing_check_every_s:
            return
        st.checked_at[d] = now
        self.listing_checks += 1
        c = self.costs
        # a fresh identity on a fresh connection (node/net/discovery/listing.py): a dial
        # and a query on each side; the answer is up to 64 ads, the node's own about 8th
        ads = min(CHECK_WANT, len(self.reg[d])) if d not in self.hostile else 0
        nbytes = c.register_bytes + c.ad_bytes * ads
        self.charge(node, c.dial_ms + c.query_client_ms + c.ad_check_ms * CHECK_RANK, nbytes)
        server_ms = c.query_server_ms + c.query_per_ad_ms * ads
        self.charge(d, c.dial_ms + server_ms, nbytes)
        wait_s = self.connect_s + self.rtt_s + self.served_in(d, server_ms)
        if wait_s > REQUEST_TIMEOUT_S:  # no answer in time: a check that failed
            self.engine.after(REQUEST_TIMEOUT_S, self._check_failed, (node, d))
            return
        self.engine.after(wait_s, self._checked, (node, d))

    def _check_failed(self: DirectoryNetwork, arg: tuple[int, int]) -> None:
        node, d = arg
        if self.alive[node]:
            self.regs[node].checked_at.pop(d, None)
            self.failed(node, d)

    def _checked(self: DirectoryNetwork, arg: tuple[int, int]) -> None:
        node, d = arg
        if not self.alive[node]:
            return
        if not self.alive[d]:  # died meanwhile: a check that failed
            self._check_failed(arg)
            return
        st = self.regs[node]
        if self.lists(d, node):
            st.listed.add(d)
            return
        self.hiding_found += 1
        st.rest_until[d] = self.engine.now + self.sc.hiding_rest_s
        st.good.discard(d)
        st.listed.discard(d)
        st.counts.pop(d, None)
        st.registered_at.pop(d, None)
        st.cached = None
        self.soon(node)

    # -- gossip or not -----------------------------------------------------------------

    def _judge_size(self: DirectoryNetwork, node: int) -> None:
        """The node's `large()` / `gossip_own_ad()` after a count was heard: a large
        verdict is kept (for a day: the run); the fallback to gossip needs every known
        directory's fresh count ("every") or two of them ("two") to say small."""
        st = self.regs[node]
        if st.large or st.gossiping or self.attacker[node] or self.role[node] == DIRECTORY:
            return
        now, known = self.engine.now, self.known_set
        fresh = [
            count
            for d, (count, at) in st.counts.items()
            if d in known and now - at <= COUNT_FRESH_S
        ]
        if fresh:
            size = round(max(fresh) * len(known) / min(self.sc.directory_peers, len(known)))
            if size >= self.sc.gossip_max_peers:
                st.large = True
                return
        if self.sc.gossip_fallback == "every":
            gossip = bool(known) and len(known) <= TRIED_AT_ONCE and len(fresh) == len(known)
        else:
            gossip = not known or len(fresh) >= min(2, len(known))
        if gossip:
            st.gossiping = True
            # while the run starts cold the directories do count a small network
            self.fallback_nodes += now >= self.warmup_s

    # -- rating by probes --------------------------------------------------------------

    def vouched(self: DirectoryNetwork, node: int, d: int, live: bool) -> None:
        """A peer `d` returned was probed: after RATED_AFTER, a directory whose peers
        mostly did not answer rests as one that failed."""
        st = self.regs[node]
        answered, probed = st.vouched.get(d, (0, 0))
        answered, probed = answered + live, probed + 1
        if probed >= RATED_AFTER and answered < MIN_LIVE_SHARE * probed:
            del st.vouched[d]
            self.failed(node, d)
        else:
            st.vouched[d] = (answered, probed)
