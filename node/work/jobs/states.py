"""The states of a job and of its units, and the changes between them, as data.

`JobStore` checks every state change it is asked for against `JOB_TRANSITIONS` and
`UNIT_TRANSITIONS` and raises `IllegalTransition` for one these tables do not hold, so
a code path cannot invent a change (revive a completed job, finish a unit that was
never started) without the table, and the diagram generated from it, saying so. The
tables are the rules; `FINAL_STATES` and `LIVE_UNIT_STATES` are derived from them (a
final state has no way out, a live unit has one), so the three cannot disagree.

Each edge carries why it is taken, which the diagram shows. Writing a state over
itself is no change and is not checked (a second replica starting keeps its job
running). docs/design/states.md is `document()`'s output; after changing a table:

    python -m node.work.jobs > docs/design/states.md
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# -- the states ------------------------------------------------------------------------

QUEUED = "queued"  # a job waiting for a worker (or for its driver)
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
OFFERED = "offered"  # a unit offered to a worker that has not said yes yet
VERIFYING = "verifying"  # a unit whose result the owner is checking
DONE = "done"
EXPIRED = "expired"  # a unit whose worker went quiet, or whose round closed first

JOB_INITIAL = QUEUED  # what `JobStore.create` writes
UNIT_INITIAL = OFFERED  # what `JobStore.add_unit` writes

# -- the changes: {from: {to: why}} ----------------------------------------------------

JOB_TRANSITIONS: Mapping[str, Mapping[str, str]] = {
    QUEUED: {
        RUNNING: "a worker takes its unit, or its driver starts",
        FAILED: "out of attempts, its spec fails, or its driver fails",
        CANCELLED: "cancelled",
    },
    RUNNING: {
        QUEUED: "its unit is lost and offered again, or the owner restarted",
        COMPLETED: "its result is accepted, or its last round or trial ends",
        FAILED: "out of attempts, its spec fails, or no trial completed",
        CANCELLED: "cancelled",
    },
    COMPLETED: {},
    FAILED: {},
    CANCELLED: {},
}

UNIT_TRANSITIONS: Mapping[str, Mapping[str, str]] = {
    OFFERED: {
        RUNNING: "the worker says yes",
        VERIFYING: "its result arrives before the yes is recorded",
        FAILED: "declined, or it fails",
        EXPIRED: "no heartbeat in time, its round closed, or the owner restarted",
        CANCELLED: "its job ends",
    },
    RUNNING: {
        VERIFYING: "its result arrives and is checked",
        DONE: "trained on the owner and accepted",
        FAILED: "it fails, or its worker hands it back",
        EXPIRED: "no heartbeat in time, past max_hours, its round closed, or a restart",
        CANCELLED: "its job ends, or it is no longer needed",
    },
    VERIFYING: {
        RUNNING: "the owner restarted and its worker sends the result again",
        DONE: "its result is accepted",
        FAILED: "its result is rejected, or its check did not finish",
        EXPIRED: "its round closed, or the owner restarted",
        CANCELLED: "its job ends",
    },
    DONE: {},
    FAILED: {},
    EXPIRED: {},
    CANCELLED: {},
}

JOB_STATES: tuple[str, ...] = tuple(JOB_TRANSITIONS)
UNIT_STATES: tuple[str, ...] = tuple(UNIT_TRANSITIONS)
FINAL_STATES: tuple[str, ...] = tuple(s for s in JOB_STATES if not JOB_TRANSITIONS[s])
LIVE_UNIT_STATES: tuple[str, ...] = tuple(s for s in UNIT_STATES if UNIT_TRANSITIONS[s])
# a unit its worker holds (from VERIFYING on, the worker has let it go)
HELD_UNIT_STATES: tuple[str, ...] = (OFFERED, RUNNING)


class IllegalTransition(ValueError):
    """A change of state that the tables do not hold: a bug in the caller, never a race
    (a race is a compare-and-set that finds the row moved on, and returns None)."""

    def __init__(self, kind: str, from_state: str, to_state: str) -> None:
        super().__init__(
            f"{kind} {from_state!r} -> {to_state!r} is not an allowed transition "
            "(node/work/jobs/states.py)"
        )
        self.kind = kind
        self.from_state = from_state
        self.to_state = to_state


def check(
    kind: str, table: Mapping[str, Mapping[str, str]], from_states: Iterable[str], to: str
) -> None:
    """Raise `IllegalTransition` unless every state in `from_states` may change to `to`.

    Every named start is checked, not only the one the row turns out to be in: a call
    that could make an illegal change fails the first time it runs, not the first time
    a race puts the row in that state."""
    for start in from_states:
        if to not in table or start not in table:
            raise IllegalTransition(kind, start, to)
        if start != to and to not in table[start]:
            raise IllegalTransition(kind, start, to)


def check_job(from_states: Iterable[str], to: str) -> None:
    check("job", JOB_TRANSITIONS, from_states, to)


def check_unit(from_states: Iterable[str], to: str) -> None:
    check("unit", UNIT_TRANSITIONS, from_states, to)


# -- the diagram -----------------------------------------------------------------------


def diagram(table: Mapping[str, Mapping[str, str]], initial: str) -> str:
    """A mermaid `stateDiagram-v2` of `table`: each edge labelled with why it is taken,
    the initial state entered from [*], each final state leading to [*]."""
    lines = ["stateDiagram-v2", f"    [*] --> {initial}"]
    for start, targets in table.items():
        lines += [f"    {start} --> {to}: {why}" for to, why in targets.items()]
    lines += [f"    {state} --> [*]" for state, targets in table.items() if not targets]
    return "\n".join(lines)


def document() -> str:
    """docs/design/states.md, whole: generated so that it cannot drift from the tables
    (tests/node/work/jobs/test_job_states.py fails when the file differs)."""
    final = ", ".join(FINAL_STATES)
    live = ", ".join(LIVE_UNIT_STATES)
    return f"""# Job and unit states

<!-- Generated from node/work/jobs/states.py; do not edit. Regenerate with:
     python -m node.work.jobs > docs/design/states.md -->

A job is what a user submitted; a unit is one piece of it given to one worker (a
single job's attempt, a round's share, a trial, a replica). Both live in the owner's
`node.db` (`node.work.jobs.store.JobStore`), and each changes state only along an edge
below: `JobStore.transition` and `JobStore.unit_transition` refuse any other change
with `IllegalTransition`. A change is a compare-and-set: the caller names the states it
expects the row to be in, and gets nothing back (and nothing changes) when the row has
moved on. Timeline notes, progress and other fields are written without a change of
state (`JobStore.note`, `JobStore.set_progress`, `JobStore.amend`).

A job's final states: {final}.
A unit's live states: {live}.
A unit offered and declined for now (a busy worker) is deleted rather than ended
(`JobStore.forget_unit`).

## Jobs

```mermaid
{diagram(JOB_TRANSITIONS, JOB_INITIAL)}
```

## Units

```mermaid
{diagram(UNIT_TRANSITIONS, UNIT_INITIAL)}
```
"""
