"""Turn a finished run's counters into a `Result`: per-node CPU and bytes per minute,
percentiles of the latencies.

Per-node CPU = idle + per-connection cost x open connections + every message it
handled (explicit charges, plus ad_ms for each gossiped ad received, counted
arithmetically), over the node's time alive after warm-up. Nodes seen for less than
`min_observed_s` are left out of the per-node figures: a joiner's table fetch spread
over a few seconds would read as an enormous rate. So are the attacker's peers and
hostile directories: the figures are what honest nodes pay.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.simulate.network import DIRECTORY, OWNER, VOLUNTEER, Network
from benchmarks.simulate.scenario import Result

CORE_MS_PER_MIN = 60_000.0


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile; NaN for no values. Among values that include
    infinity (never happened) the value at that rank, infinite or not."""
    if not values:
        return math.nan
    method = "linear" if math.isfinite(max(values)) else "inverted_cdf"
    return float(np.percentile(values, q, method=method))


def mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def summarize(net: Network, wall_s: float, cpu_s: float) -> Result:
    sc, c = net.sc, net.costs
    cpu: dict[int, list[float]] = {0: [], OWNER: [], DIRECTORY: []}
    receipts_ms: list[float] = []  # volunteers'
    upkeep_ms: list[float] = []
    traffic: dict[int, list[float]] = {0: [], OWNER: [], DIRECTORY: []}
    for node in range(len(net.alive)):
        if net.attacker[node] or node in net.hostile:
            continue
        span = min(net.died[node], sc.duration_s) - max(net.born[node], sc.warmup_s)
        if span < sc.min_observed_s:
            continue
        minutes = span / 60
        received = net.g_end[node] - net.g_start[node] - net.own_ads[node]
        conn_minutes = sc.connections * minutes + net.conn_integral.get(node, 0.0) / 60
        receipts = net.receipts_received(node)
        upkeep = net.upkeep_ms_per_min(node)
        ms = (
            c.idle_ms_per_min * minutes
            + c.conn_ms_per_min * conn_minutes
            + net.cpu[node]
            + c.ad_ms * received
            + c.receipt_ms * receipts
            + upkeep * minutes
        )
        role = net.role[node]
        cpu[role].append(ms / minutes)
        nbytes = net.nbytes[node] + c.ad_bytes * received + c.receipt_bytes * receipts
        traffic[role].append(nbytes / minutes)
        if role == VOLUNTEER:
            receipts_ms.append(c.receipt_ms * receipts / minutes)
            upkeep_ms.append(upkeep)
    volunteer, directory = cpu[0], cpu[DIRECTORY]
    findable = [(round(t, 3), share) for t, share in net.findable]
    shares = [share for _, share in findable]
    return Result(
        design=net.design,
        peers=sc.peers,
        directories=sc.n_directories,
        simulated_s=sc.duration_s,
        volunteer_cpu_ms_per_min_mean=mean(volunteer),
        volunteer_cpu_ms_per_min_p95=pct(volunteer, 95),
        volunteer_cpu_pct_mean=mean(volunteer) / CORE_MS_PER_MIN * 100,
        volunteer_cpu_pct_p95=pct(volunteer, 95) / CORE_MS_PER_MIN * 100,
        directory_cpu_ms_per_min_mean=mean(directory),
        directory_cpu_ms_per_min_max=max(directory, default=math.nan),
        directory_cpu_pct_mean=mean(directory) / CORE_MS_PER_MIN * 100,
        directory_cpu_pct_max=max(directory, default=math.nan) / CORE_MS_PER_MIN * 100,
        owner_cpu_ms_per_min_mean=mean(cpu[OWNER]),
        volunteer_bytes_per_min_mean=mean(traffic[0]),
        directory_bytes_per_min_mean=mean(traffic[DIRECTORY]),
        placements=net.placements,
        placements_failed=net.placements_failed,
        find_k_s_p50=pct(net.find_k, 50),
        find_k_s_p95=pct(net.find_k, 95),
        find_k_s_p99=pct(net.find_k, 99),
        find_k_s_max=max(net.find_k, default=math.nan),
        query_rounds_mean=mean(net.rounds),
        drop_dead_s_p50=pct(net.drop_dead, 50),
        drop_dead_s_p95=pct(net.drop_dead, 95),
        drop_dead_s_max=max(net.drop_dead, default=math.nan),
        drop_dead_node_mean_s=mean(net.drop_dead_node_mean),
        dead_measured=len(net.drop_dead),
        join_found_s_p50=pct(net.join_found, 50),
        join_found_s_p95=pct(net.join_found, 95),
        join_found_s_p99=pct(net.join_found, 99),
        first_peer_s_p50=pct(net.first_peer, 50),
        joins=net.joins,
        deaths=net.deaths,
        offers_to_dead=net.offers_to_dead,
        dead_candidates_probed=net.dead_candidates_probed,
        findable_share_mean=mean(shares),
        findable_share_min=min(shares, default=math.nan),
        findable_series=findable,
        attacker_placement_share=net.bound_to_attacker / net.bound if net.bound else math.nan,
        attacker_capacity_share=mean(net.attacker_capacity),
        fallback_nodes=net.fallback_nodes,
        listing_checks=net.listing_checks,
        hiding_found=net.hiding_found,
        volunteer_receipts_pct_mean=mean(receipts_ms) / CORE_MS_PER_MIN * 100,
        volunteer_upkeep_pct_mean=mean(upkeep_ms) / CORE_MS_PER_MIN * 100,
        relay_slots_max=max(map(len, net.reserved_on.values()), default=0),
        relay_refused=net.relay_refused,
        directory_wait_s_p50=pct(net.directory_waits, 50),
        directory_wait_s_p99=pct(net.directory_waits, 99),
        directory_timeouts=net.directory_timeouts,
        events=net.engine.events,
        wall_s=wall_s,
        cpu_s=cpu_s,
    )
