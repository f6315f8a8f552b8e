"""What one simulation run is asked (`Scenario`) and what it answers (`Result`).

Defaults are the node's own defaults where it has one (publish every 30 s, a peer
forgotten after 90 s without an ad, 8 connections, tables of at most 1024 ads on
connect, 60 s of allowed clock skew), so a run with defaults describes today's network.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

VOLUNTEER, OWNER, DIRECTORY = 0, 1, 2  # a node's role
DESIGNS = ("gossip", "directory")
MIDWAY: Literal["midway"] = "midway"
# what a hostile directory does (benchmarks/simulate/hostile.py)
BEHAVIOURS = ("silent_drop", "zero_counts", "friends_only", "dead_ads")
# when a node falls back to gossiping its ad to every node: once "every" known
# directory's fresh count says the network is small, or (`gossip_own_ad` in
# node/net/discovery/registration.py on 2026-11-26) once "two" fresh counts do
FALLBACK_RULES = ("every", "two")


@dataclass(frozen=True)
class Scenario:
    """One network and workload. Times in seconds, rates per hour or minute as named."""

    design: str = "directory"  # "gossip" (every node gossips its ad) or "directory"
    peers: int = 1000  # N: all nodes, directories and owners included
    duration_s: float = 3600.0
    seed: int = 1
    warmup_s: float = 120.0  # CPU and byte figures count only after this
    # capacity gossip (all ads in design gossip, the directories' ads in design directory)
    publish_interval_s: float = 30.0
    peer_ttl_s: float = 90.0
    clock_skew_s: float = 60.0  # an ad older than peer_ttl_s + this is refused (the node's)
    gossip_degree: int = 6
    connections: int = 8  # connections a node keeps (a volunteer's directories among them)
    max_table_ads: int = 1024  # ads a peer serves a joiner on connect
    # design directory
    directories: int | None = None  # M; None: max(1, N // 1000), at most 16
    directory_peers: int = 2  # D: directories each volunteer registers with
    directory_ad_factor: float = 10.0  # directories gossip every publish_interval_s x this
    register_interval_s: float = 30.0
    registration_ttl_s: float = 90.0
    queries: int | None = None  # Q: directories an owner asks at once; None: 3 (the node's)
    query_answers: int = 2  # answers used, unless they hold fewer ads than wanted
    ask_listed_only: bool = True  # an owner listed by 2+ directories asks only those
    listing_check: bool = True  # a node asks each directory, as a stranger, whether it lists it
    listing_check_every_s: float = 1800.0
    hiding_rest_s: float = 6 * 3600.0  # a directory caught hiding is left alone this long
    gossip_max_peers: int = 100  # a network counted smaller gossips every ad
    gossip_fallback: str = "every"  # FALLBACK_RULES
    # hostile directories, on top of the M honest ones
    hostile_directories: int = 0  # S
    hostile_behaviour: str = "silent_drop"  # BEHAVIOURS
    # the count they report; None: what they hold (few, once honest nodes left them)
    hostile_count: int | None = None
    # share of volunteers run by the attacker; None: 0.05 with friends_only, else 0
    attacker_peers: float | None = None
    sample_s: float = 60.0  # how often the share of findable volunteers is sampled
    max_rounds: int = 5  # query rounds before a placement is given up
    # share of probed candidates the owner is already connected to (a probe then needs no
    # new connection); None: connections / peers, at most 1
    probe_connected: float | None = None
    # the cores all nodes share (a test machine running every node): probed peers then
    # answer in turn; None: each node has its own machine
    shared_cores: int | None = None
    # workload
    k: int = 8  # peers a placement needs
    fit_fraction: float = 1.0  # share of peers that fit the job
    owners: int = 10
    placements_per_owner_per_min: float = 1.0
    unit_minutes: float = 30.0  # a bound unit trains this long; then its receipt is gossiped
    receipt_gossip: bool = True  # receipts go to every node (meshminer/receipts/1)
    nat_share: float = 0.0  # share of volunteers behind NATs: relay slots, relayed probes
    saturation: bool = True  # a directory answers in turn, on one thread (a queue)
    cold_start: bool = False  # nodes start remembering no directory that answered them
    # churn
    churn_per_hour: float = 0.05  # share of volunteers replaced per hour (Poisson)
    directory_churn: bool = False  # directories churn (and can be hit by the burst) too
    burst_at_s: float | Literal["midway"] | None = MIDWAY  # None: no burst
    burst_fraction: float = 0.2  # share of volunteers that leave at once (not replaced)
    min_observed_s: float = 60.0  # per-node CPU figures only for nodes seen this long

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ValueError(f"design must be one of {DESIGNS}, got {self.design!r}")
        if self.peers < self.owners + self.n_directories + self.n_hostile + 2:
            raise ValueError(f"{self.peers} peers leave no volunteers beside owners/directories")
        if not 0 <= self.burst_fraction < 1 or not 0 < self.fit_fraction <= 1:
            raise ValueError("burst_fraction must be in [0, 1) and fit_fraction in (0, 1]")
        if self.duration_s <= self.warmup_s:
            raise ValueError("duration_s must be longer than warmup_s")
        if self.hostile_behaviour not in BEHAVIOURS:
            raise ValueError(f"hostile_behaviour must be one of {BEHAVIOURS}")
        if self.gossip_fallback not in FALLBACK_RULES:
            raise ValueError(f"gossip_fallback must be one of {FALLBACK_RULES}")
        if self.hostile_directories and self.design != "directory":
            raise ValueError("hostile directories need design directory")
        if not 0 <= self.attacker_share < 1:
            raise ValueError("attacker_peers must be in [0, 1)")
        if not 0 <= self.nat_share < 1 or self.unit_minutes <= 0:
            raise ValueError("nat_share must be in [0, 1) and unit_minutes > 0")

    @property
    def n_directories(self) -> int:
        """M: 0 in design gossip."""
        if self.design != "directory":
            return 0
        if self.directories is not None:
            return self.directories
        return max(1, min(16, self.peers // 1000))

    @property
    def n_hostile(self) -> int:
        """S: 0 in design gossip."""
        return self.hostile_directories if self.design == "directory" else 0

    @property
    def n_queries(self) -> int:
        return self.queries if self.queries is not None else 3

    @property
    def attacker_share(self) -> float:
        if self.attacker_peers is not None:
            return self.attacker_peers
        return 0.05 if self.hostile_behaviour == "friends_only" and self.n_hostile else 0.0

    @property
    def connected_share(self) -> float:
        if self.probe_connected is not None:
            return self.probe_connected
        return min(1.0, self.connections / self.peers)

    @property
    def burst_time(self) -> float | None:
        if self.burst_fraction == 0 or self.burst_at_s is None:
            return None
        return self.duration_s / 2 if self.burst_at_s == MIDWAY else float(self.burst_at_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Result:
    """What a run measured. NaN where a figure does not apply (no directories in design
    gossip) or nothing was observed (no peer died). CPU is ms per minute of simulated
    time after warm-up, per node; % is of one core."""

    design: str
    peers: int
    directories: int
    simulated_s: float
    volunteer_cpu_ms_per_min_mean: float
    volunteer_cpu_ms_per_min_p95: float
    volunteer_cpu_pct_mean: float
    volunteer_cpu_pct_p95: float
    directory_cpu_ms_per_min_mean: float
    directory_cpu_ms_per_min_max: float
    directory_cpu_pct_mean: float
    directory_cpu_pct_max: float
    owner_cpu_ms_per_min_mean: float
    volunteer_bytes_per_min_mean: float  # in + out
    directory_bytes_per_min_mean: float
    placements: int
    placements_failed: int  # fewer than K live peers after max_rounds
    find_k_s_p50: float  # from the first query (or the table look-up) to K live peers
    find_k_s_p95: float
    find_k_s_p99: float
    find_k_s_max: float
    query_rounds_mean: float  # 0 in design gossip: nothing is queried
    drop_dead_s_p50: float  # death until the last holder forgets the peer
    drop_dead_s_p95: float
    drop_dead_s_max: float
    drop_dead_node_mean_s: float  # death until forgotten, mean over every holder
    dead_measured: int  # dead peers whose drop completed within the run
    join_found_s_p50: float  # join until an honest directory holds the joiner
    join_found_s_p95: float
    join_found_s_p99: float
    first_peer_s_p50: float  # join until the joiner itself is placed in the network
    joins: int
    deaths: int
    offers_to_dead: int  # offers sent to a dead peer (design gossip; 0 by construction else)
    dead_candidates_probed: int  # design directory: probes that timed out
    # honest volunteers registered with an honest directory (which lists them), sampled
    # every sample_s after warm-up
    findable_share_mean: float
    findable_share_min: float
    findable_series: list[tuple[float, float]]  # (s, share)
    attacker_placement_share: float  # of the peers placements were bound to
    attacker_capacity_share: float  # of the live fitting volunteers, mean over samples
    fallback_nodes: int  # honest nodes that gossiped their ad to every node after warm-up
    listing_checks: int
    hiding_found: int  # listing checks that caught a directory hiding the node
    # of the volunteers' mean CPU: receipt gossip, and dial-backs and relay slots
    volunteer_receipts_pct_mean: float
    volunteer_upkeep_pct_mean: float
    relay_slots_max: int  # reservations held on the busiest relay
    relay_refused: int  # reservations wanted when no public peer tried had room
    # a directory's answer: waiting in its queue and being served (saturation)
    directory_wait_s_p50: float
    directory_wait_s_p99: float
    directory_timeouts: int  # requests it answered after the asker gave up
    events: int
    wall_s: float
    cpu_s: float  # process CPU time of the simulation

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
