"""The one error a program's reader, checker and interpreter raise."""

from __future__ import annotations

from training.errors import SpecError


class ProgramError(SpecError):
    """A program (or a user's `.pt2`) breaks a rule; the message names what was found.

    A `SpecError`, so every path that refuses a bad spec refuses a bad program the
    same way: the owner's submit answers 400, a runner reports an error and exits."""
