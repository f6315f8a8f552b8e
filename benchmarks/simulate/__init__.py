"""A discrete-event simulator of capacity discovery and placement at sizes no test
network reaches (10,000 nodes), to compare today's all-ads gossip with directories.

No sockets and no libp2p: nodes are entries in lists, messages are costs added up, and
what a message costs comes from measurements on real nodes (costs.json). Run it with

    .venv/bin/python -m benchmarks.simulate --peers 1000 10000 --design gossip directory

or call `simulate(Scenario(...), load_costs())`.

The modules: `scenario` (what a run is asked and answers), `costs` (costs.json),
`engine` (the event queue), `network` (nodes, churn, gossiped ads: what both designs
share), `gossip` (design gossip), `directory` (design directory: the directories'
side, joins), `registration` (a node's side of the directories: which it registers
with, rests, the listing check, the fallback to gossip), `placement` (an owner's
queries and probes), `hostile` (hostile directories and the attacker's peers),
`upkeep` (receipt gossip, reachability dial-backs, relay slots for NAT'd volunteers),
`report` (a run's figures). A directory answers in turn on one thread, so past its
core its answers come too late (`DirectoryNetwork.served_in`).
"""

from __future__ import annotations

import time

from benchmarks.simulate.costs import Costs, load_costs
from benchmarks.simulate.directory import DirectoryNetwork
from benchmarks.simulate.gossip import GossipNetwork
from benchmarks.simulate.report import summarize
from benchmarks.simulate.scenario import Result, Scenario

__all__ = ["Costs", "Result", "Scenario", "load_costs", "simulate"]


def simulate(scenario: Scenario, costs: Costs) -> Result:
    """Run one scenario to its end and measure it. Deterministic for a given seed."""
    wall, cpu = time.perf_counter(), time.process_time()
    network_class = GossipNetwork if scenario.design == "gossip" else DirectoryNetwork
    network = network_class(scenario, costs)
    network.run()
    return summarize(network, time.perf_counter() - wall, time.process_time() - cpu)
