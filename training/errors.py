"""The two ways a job can fail, kept apart because callers answer them differently.

`SpecError` means the job itself is wrong (a bad key, a model over budget, unreadable
data): the owner should fix the spec, and no worker should retry it. `TrainingError`
means a valid job failed while running (the loss became NaN, it ran past its hours):
the message says what happened and at which step.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A job spec, or the data it names, is not acceptable.

    The message starts with the key path (`optim.lr`, `model.layers[3].out_features`,
    `data.source`) and then states the rule that was broken.
    """


class TrainingError(RuntimeError):
    """A valid job failed while training; the message says what and where."""
