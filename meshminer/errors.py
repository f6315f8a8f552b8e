"""What can go wrong, as exceptions: one base class, so a caller can catch them all."""

from __future__ import annotations


class MeshminerError(Exception):
    """Base of every error this package raises on purpose."""


class NodeUnreachable(MeshminerError):
    """No node answered at the API URL; the message says how to start one."""


class NodeError(MeshminerError):
    """The node answered with an error; the message is the node's (a refused spec names
    the key, e.g. `model.arch must be one of ...`)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class JobFailed(MeshminerError):
    """The job ended without weights (failed or cancelled); the message is the node's reason."""

    def __init__(self, job_id: str, state: str, reason: str) -> None:
        super().__init__(f"job {job_id} {state}: {reason or 'no reason given'}")
        self.job_id = job_id
        self.state = state
        self.reason = reason


class ProgramRefused(MeshminerError):
    """An exported program uses something a node would refuse to run (an operator off
    the allow-list, say); the message lists every problem, so all can be fixed at once."""

    def __init__(self, problems: list[str]) -> None:
        listed = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"a node would refuse this model's exported program:\n{listed}")
        self.problems = problems
