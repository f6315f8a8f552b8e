"""When a unit keeps its training state as evidence: the checkpoint steps.

Arithmetic only, with no torch import: the owner's daemon computes a unit's
checkpoint steps when the unit's first heartbeat comes in, on its event loop, and a
first import of torch there (2.5-3.5 s) stalled the loop long enough for short
leases to expire (`training.evidence.checkpoints` writes and reads the states).
"""

from __future__ import annotations

import math


def checkpoint_steps(total_steps: int, segments: int, validate_every: int = 0) -> list[int]:
    """The steps a checkpoint is taken at: 0, k, 2k, ... and the last step, where
    k = ceil(total / segments), and every step a validation is reported at
    (`optim.validate_every`), so a reported value can be checked on a state the
    replay confirmed."""
    if segments <= 0 or total_steps <= 0:
        return []
    every = max(1, math.ceil(total_steps / segments))
    steps = {*range(0, total_steps, every), total_steps}
    if validate_every > 0:
        steps |= set(range(validate_every, total_steps, validate_every))
    return sorted(steps)


# A round's share is one segment, whatever `trust.checkpoints` says: a replay fetches
# its segment's start, a whole training state (about 3x the model), while the rest of
# a share moves about half the model (int8 weights' update down, int8 delta up). One
# segment drawn at the budget's chance (10%) fetches 0.1 states a share on average,
# replays the budget's share of the steps, and checks both of the share's ends each
# time it is drawn (`docs/design/trust.md`).
SHARE_SEGMENTS = 1


def share_checkpoint_steps(inner_steps: int, segments: int) -> list[int]:
    """A share's checkpoint steps: its H inner steps in at most SHARE_SEGMENTS parts
    (none when the job's `trust.checkpoints` is 0)."""
    return checkpoint_steps(inner_steps, min(segments, SHARE_SEGMENTS))
