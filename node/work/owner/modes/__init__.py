"""PACKAGE node.work.owner.modes.

Modules:

    elastic           The owner's elastic (DiLoCo) rounds: offer shares, gather deltas,
                      take the outer step.
    sweep             A sweep job on its owner: the study asks for trials, each trial is
                      a unit on a peer.
"""

from node.work.owner.modes.elastic import ADAPTIVE_FACTOR, FIRST_ROUND_TIMEOUT_S, ElasticRounds
from node.work.owner.modes.sweep import SweepTrials

__all__ = [
    "ADAPTIVE_FACTOR",
    "ElasticRounds",
    "FIRST_ROUND_TIMEOUT_S",
    "SweepTrials",
]
