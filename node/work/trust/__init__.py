"""PACKAGE node.work.trust.

Modules:

    replicas          Replicas: one unit trained by two workers of one determinism class
                      (`trust.replicas`).
    reputation        What this node has seen of each peer's results: adaptive checking,
                      as BOINC does it.
    spot_checks       The owner's spot check of a worker's result: replay a few
                      segments, chosen now.
"""

from node.work.trust.replicas import Replicas
from node.work.trust.reputation import Reputation
from node.work.trust.spot_checks import (
    BF16_TOLERANCE,
    TOLERANCE,
    SpotChecks,
    Submitted,
    Verdict,
    choose_segments,
    compare_replay,
    replay_table,
    tolerance_of,
)

__all__ = [
    "BF16_TOLERANCE",
    "Replicas",
    "Reputation",
    "SpotChecks",
    "Submitted",
    "TOLERANCE",
    "Verdict",
    "choose_segments",
    "compare_replay",
    "replay_table",
    "tolerance_of",
]
