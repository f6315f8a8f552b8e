"""Discovery: how a node finds peers and is found: bootstrap peers and the peerstore,
capacity gossip, and in a large network directories.

A small network gossips every ad to every node (`gossip`); in a large one volunteers
register their ads with directories instead (`registration`), which keep them and
answer owners' queries (`directory`), so that a volunteer's cost stops growing with
the network; `cost` counts what all of it costs this node. The ads land in the peer
table (`node/net/peers.py`); the owner's search for peers that can take work now,
which asks this package, is `node/net/finder.py`. All of it runs in the trio thread
and reaches the network only through `MeshHost` (`node/net/host.py`).
docs/design/discovery.md.

The face re-exports what the rest of the node uses; the modules import each other,
never the face.

- `bootstrap`: staying connected: bootstrap peers with retry and backoff, then peers
  from the peerstore, until `target_peers` are connected (`keep_connected`).
- `gossip`: capacity gossip on `meshminer/capacity/1`: validate (`check_ad`), publish,
  exchange ad tables on connect (`CapacityGossip`).
- `directory`: serving as a directory: keep the ads volunteers register, answer
  owners (`Directory`).
- `registration`: registering with directories, estimating the network's size,
  rating them (`Registration`).
- `memory`: what a node keeps across restarts in node.db: a large network, and the
  directories that answered it.
- `search`: an owner's query of directories, their answers merged
  (`query_directories`).
- `listing`: both ends of a volunteer's check that a directory lists it: the seed's
  order of an answer (`rank_key`) and the question asked as a stranger (`lists_me`).
- `cost`: what finding peers costs this node, per minute (`DiscoveryCost`).
- `credit`: both ends of a directory's credit table, which a node of a large network
  shows beside its own audit (`CreditServer`, `DirectoryCredit`).
"""

from __future__ import annotations

from node.net.discovery.bootstrap import keep_connected
from node.net.discovery.cost import DiscoveryCost
from node.net.discovery.credit import CreditServer, DirectoryCredit
from node.net.discovery.directory import MAX_REGISTRATIONS, Directory
from node.net.discovery.gossip import (
    MAX_TABLE_ADS,
    REJECT_REASONS,
    CapacityGossip,
    DuplicateAd,
    PeerMismatch,
    check_ad,
)
from node.net.discovery.registration import Registration, rendezvous_order
from node.net.discovery.search import query_directories

__all__ = [
    "MAX_REGISTRATIONS",
    "MAX_TABLE_ADS",
    "REJECT_REASONS",
    "CapacityGossip",
    "CreditServer",
    "DiscoveryCost",
    "Directory",
    "DirectoryCredit",
    "DuplicateAd",
    "PeerMismatch",
    "Registration",
    "check_ad",
    "keep_connected",
    "query_directories",
    "rendezvous_order",
]
