"""Compare the designs at chosen network sizes and print one table.

    .venv/bin/python -m benchmarks.simulate --peers 1000 10000 --design gossip directory \
        [--minutes 60] [--churn 0.05 ...] [--burst 0.2] [--owners 10] [--seed 1] \
        [--hostile S ... --behaviour NAME ... --listing-check on off] \
        [--nat-share F ... --unit-minutes 30 --no-receipts --no-saturation --cold-start] \
        [--costs PATH] [--json OUT]

Every combination of the listed values is one run. With hostile directories (design
directory only) the figures are what honest nodes see; more than four runs are shown
one per line, with the figures that the attacks move. Figures use the costs in
costs.json (or --costs); a file still marked "placeholder" is said so in the output,
since its numbers were not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.simulate import Scenario, load_costs, simulate
from benchmarks.simulate.costs import DEFAULT_PATH
from benchmarks.simulate.scenario import BEHAVIOURS, FALLBACK_RULES

RESULTS = Path(__file__).resolve().parent.parent / "results" / "simulate.json"
# rows of the table: (label, Result field); the JSON has every field
ROWS = [
    ("directories", "directories"),
    ("volunteer CPU ms/min mean", "volunteer_cpu_ms_per_min_mean"),
    ("volunteer CPU ms/min p95", "volunteer_cpu_ms_per_min_p95"),
    ("volunteer CPU % core mean", "volunteer_cpu_pct_mean"),
    ("  of it receipts", "volunteer_receipts_pct_mean"),
    ("  of it dial-backs, relays", "volunteer_upkeep_pct_mean"),
    ("directory CPU ms/min mean", "directory_cpu_ms_per_min_mean"),
    ("directory CPU ms/min max", "directory_cpu_ms_per_min_max"),
    ("directory CPU % core max", "directory_cpu_pct_max"),
    ("owner CPU ms/min mean", "owner_cpu_ms_per_min_mean"),
    ("volunteer bytes/min", "volunteer_bytes_per_min_mean"),
    ("directory bytes/min", "directory_bytes_per_min_mean"),
    ("directory answer s p50", "directory_wait_s_p50"),
    ("directory answer s p99", "directory_wait_s_p99"),
    ("directory answers too late", "directory_timeouts"),
    ("relay slots, busiest relay", "relay_slots_max"),
    ("find K s p50", "find_k_s_p50"),
    ("find K s p95", "find_k_s_p95"),
    ("find K s p99", "find_k_s_p99"),
    ("find K s max", "find_k_s_max"),
    ("query rounds mean", "query_rounds_mean"),
    ("placements (failed)", None),
    ("drop dead s p50", "drop_dead_s_p50"),
    ("drop dead s p95", "drop_dead_s_p95"),
    ("drop dead s max", "drop_dead_s_max"),
    ("drop dead s, node mean", "drop_dead_node_mean_s"),
    ("joiner found s p50", "join_found_s_p50"),
    ("joiner found s p95", "join_found_s_p95"),
    ("joiner found s p99", "join_found_s_p99"),
    ("findable share mean", "findable_share_mean"),
    ("findable share min", "findable_share_min"),
    ("to attacker: placements", "attacker_placement_share"),
    ("to attacker: live capacity", "attacker_capacity_share"),
    ("nodes that fell back to gossip", "fallback_nodes"),
    ("listing checks (hiding found)", None),
    ("joiner first peer s p50", "first_peer_s_p50"),
    ("joins / deaths", None),
    ("offers to dead", "offers_to_dead"),
    ("dead candidates probed", "dead_candidates_probed"),
    ("events", "events"),
    ("CPU s of the run", "cpu_s"),
]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--design", nargs="+", default=["gossip", "directory"])
    parser.add_argument("--minutes", type=float, default=60.0, help="simulated minutes")
    parser.add_argument(
        "--churn", type=float, nargs="+", default=[0.05], help="share replaced per hour"
    )
    parser.add_argument("--burst", type=float, default=0.2, help="share leaving midway (0: none)")
    parser.add_argument("--directory-churn", action="store_true", help="directories churn too")
    parser.add_argument("--owners", type=int, default=10)
    parser.add_argument(
        "--directories", type=int, default=None, help="M (default: one per 1,000 peers, <= 16)"
    )
    parser.add_argument("--k", type=int, default=8, help="peers per placement")
    parser.add_argument(
        "--connections",
        type=int,
        default=8,
        help="connections a node keeps (target_peers; 50 real nodes kept 10 on average)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--costs", type=Path, default=DEFAULT_PATH)
    parser.add_argument(
        "--dial-timeout",
        type=float,
        default=3.0,
        help="seconds a probe of a dead peer takes to fail: the node's probe timeout, as "
        "on the Internet (on loopback a dead port refuses at once: costs.json)",
    )
    parser.add_argument(
        "--hostile", type=int, nargs="+", default=[0], help="S: hostile directories beside M"
    )
    parser.add_argument("--behaviour", nargs="+", default=["silent_drop"], choices=BEHAVIOURS)
    parser.add_argument(
        "--listing-check", nargs="+", default=["on"], choices=["on", "off"],
        help="whether nodes check that a directory lists them",
    )  # fmt: skip
    parser.add_argument(
        "--attacker-peers", type=float, default=None,
        help="share of volunteers run by the attacker (default 0.05 with friends_only)",
    )  # fmt: skip
    parser.add_argument(
        "--hostile-count", type=int, default=None,
        help="the count hostile directories report (default: what they hold)",
    )  # fmt: skip
    parser.add_argument("--fallback", default="every", choices=FALLBACK_RULES)
    parser.add_argument(
        "--ask-listed-only", default="on", choices=["on", "off"],
        help="an owner listed by two or more directories asks only those",
    )  # fmt: skip
    parser.add_argument(
        "--nat-share", type=float, nargs="+", default=[0.0],
        help="share of volunteers behind NATs (relay slots, probes through relays)",
    )  # fmt: skip
    parser.add_argument(
        "--unit-minutes", type=float, default=30.0,
        help="a unit's length; each ends in a receipt gossiped to every node",
    )  # fmt: skip
    parser.add_argument("--no-receipts", action="store_true", help="leave receipt gossip out")
    parser.add_argument(
        "--no-saturation", action="store_true",
        help="directories answer at once, however loaded (the simulator before 2026-11-26)",
    )  # fmt: skip
    parser.add_argument(
        "--cold-start", action="store_true",
        help="nodes start remembering no directory that answered them (each tries eight)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS, help=f"default {RESULTS}")
    return parser.parse_args()


def main() -> None:
    from benchmarks.harness import Result as Table  # rich table, as the other benchmarks
    from benchmarks.harness import console

    args = parse()
    costs = dataclasses.replace(load_costs(args.costs), dial_timeout_s=args.dial_timeout)
    runs: list[dict[str, Any]] = []
    combos = itertools.product(
        args.peers,
        args.design,
        args.churn,
        args.hostile,
        args.behaviour,
        args.listing_check,
        args.nat_share,
    )
    for peers, design, churn, hostile, behaviour, check, nat_share in combos:
        if hostile and design != "directory":
            continue
        if not hostile and behaviour != args.behaviour[0]:
            continue  # without hostile directories the behaviour changes nothing
        scenario = Scenario(
            design=design,
            peers=peers,
            duration_s=args.minutes * 60,
            seed=args.seed,
            churn_per_hour=churn,
            burst_fraction=args.burst,
            directory_churn=args.directory_churn,
            owners=args.owners,
            k=args.k,
            connections=args.connections,
            directories=args.directories,
            hostile_directories=hostile,
            hostile_behaviour=behaviour,
            listing_check=check == "on",
            attacker_peers=args.attacker_peers,
            hostile_count=args.hostile_count,
            gossip_fallback=args.fallback,
            ask_listed_only=args.ask_listed_only == "on",
            nat_share=nat_share,
            unit_minutes=args.unit_minutes,
            receipt_gossip=not args.no_receipts,
            saturation=not args.no_saturation,
            cold_start=args.cold_start,
        )
        label = _label(scenario, args)
        console.log(f"{label}, {args.minutes:g} min ...")
        result = simulate(scenario, costs)
        runs.append({"label": label, "scenario": scenario.to_dict(), "result": result.to_dict()})
    title = f"simulate (costs: {costs.measured})"
    if len(runs) > 4:
        table = Table(title, ["run", *(label for label, _ in BRIEF)])
        for run in runs:
            table.add(run["label"], *(_figure(run, key) for _, key in BRIEF))
    else:
        table = Table(title, ["figure", *(r["label"] for r in runs)])
        for label, key in ROWS:
            table.add(label, *(_figure(r, key or label) for r in runs))
    table.show()
    if costs.measured == "placeholder":
        console.print("[yellow]costs.json holds placeholder figures, not measurements[/]")
    out = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "costs": {**{k: v for k, v in vars(costs).items() if k != "meta"}, **costs.meta},
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(_plain(out), indent=2, allow_nan=False))
    console.log(f"written {args.json}")


# the columns when each run is a row: what hostile directories move
BRIEF = [
    ("vol CPU % mean", "volunteer_cpu_pct_mean"),
    ("vol CPU % p95", "volunteer_cpu_pct_p95"),
    ("dir CPU % max", "directory_cpu_pct_max"),
    ("find K s p50", "find_k_s_p50"),
    ("find K s p99", "find_k_s_p99"),
    ("failed", "placements_failed"),
    ("findable mean", "findable_share_mean"),
    ("findable min", "findable_share_min"),
    ("join→findable s p50", "join_found_s_p50"),
    ("join→findable s p99", "join_found_s_p99"),
    ("to attacker", "attacker_placement_share"),
    ("attacker capacity", "attacker_capacity_share"),
    ("fell back to gossip", "fallback_nodes"),
]


def _label(sc: Scenario, args: argparse.Namespace) -> str:
    parts = [f"{sc.design} {sc.peers}"]
    if len(args.churn) > 1:
        parts.append(f"churn {sc.churn_per_hour:g}/h")
    if sc.hostile_directories:
        parts.append(f"S={sc.hostile_directories} {sc.hostile_behaviour}")
    if len(args.nat_share) > 1 or sc.nat_share:
        parts.append(f"{sc.nat_share:.0%} NAT'd")
    if len(args.listing_check) > 1 or not sc.listing_check:
        parts.append("check" if sc.listing_check else "no check")
    return ", ".join(parts)


def _figure(run: dict[str, Any], key: str) -> Any:
    r = run["result"]
    if key.startswith("placements"):
        return f"{r['placements']} ({r['placements_failed']})"
    if key.startswith("joins"):
        return f"{r['joins']} / {r['deaths']}"
    if key.startswith("listing"):
        return f"{r['listing_checks']} ({r['hiding_found']})"
    return r[key]


def _plain(value: Any) -> Any:
    """NaN (a figure that does not apply) as null: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)  # "inf": never happened
    return value


if __name__ == "__main__":
    main()
