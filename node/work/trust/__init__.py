"""Trust: how an owner checks a worker's result without taking its word.

A worker commits to the hash of its training state every k steps, in its heartbeats
as it trains and again in its signed result; the owner draws each segment as soon as
both its ends are committed, fetches what a chosen one needs, replays it in its own
sandboxed runner and compares. How much of each result is checked depends on what
this node has seen of the peer. Uses the work context, the job store and blobs;
never the owner's engine, which calls it. docs/design/trust.md.

- `commitments`: both ends of the draws as the worker trains: what the owner keeps,
  what the worker may delete (it holds at most `MAX_HELD` states).
- `draws`: whether and how often a unit's segments are drawn, and what a replay of
  the chosen ones reads.
- `chains`: the owner's record of each unit's commitments, draws and replays.
- `spot_checks`: the owner's spot check: choose segments, fetch, replay, compare
  (a unit's, and a round's share's at a few tenths of a state).
- `comparisons`: a replay against the worker's commitments, returns and reports.
- `replays`: the owner's replay task, shared by both, and the states fetched for it.
- `resume`: where a lost unit goes on from (the job's resume point).
- `shapes`: the model's shapes that results and states are checked against, counted
  by a runner so that the daemon never imports torch (`model_shapes`).
- `replicas`: one unit trained by two workers of one determinism class, settled by
  bisection to one segment.
- `reputation`: what this node has seen of each peer's results: probation, RAC,
  exclusion (as BOINC's adaptive replication).
"""

from node.work.trust.commitments import (
    CHECKED_REPORTS,
    MAX_HELD,
    Commitments,
    HeldStates,
    UnitTerms,
)
from node.work.trust.comparisons import compare_replay, replay_table
from node.work.trust.draws import drawn, drawn_by_commitment, needed_states, replay_chance
from node.work.trust.replays import (
    TOLERANCE,
    FetchedStates,
    Replays,
    tolerance_of,
)
from node.work.trust.replicas import Replicas
from node.work.trust.reputation import Reputation
from node.work.trust.resume import ResumePoint, resume_point
from node.work.trust.shapes import model_shapes
from node.work.trust.spot_checks import (
    SpotChecks,
    Submitted,
    Verdict,
    choose_segments,
    spot_checked,
)

__all__ = [
    "CHECKED_REPORTS",
    "UnitTerms",
    "MAX_HELD",
    "Commitments",
    "model_shapes",
    "FetchedStates",
    "HeldStates",
    "drawn",
    "drawn_by_commitment",
    "needed_states",
    "replay_chance",
    "Replays",
    "Replicas",
    "ResumePoint",
    "resume_point",
    "Reputation",
    "SpotChecks",
    "Submitted",
    "TOLERANCE",
    "Verdict",
    "choose_segments",
    "spot_checked",
    "compare_replay",
    "replay_table",
    "tolerance_of",
]
