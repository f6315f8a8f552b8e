"""The state tables of node.work.jobs.states hold in node.db: every allowed change
succeeds, every other change raises and writes nothing, a compare-and-set from a state
the row is not in changes nothing, notes and progress never change a state, and
docs/design/states.md is what the tables generate.

A real node.db file under tmp_path and the real `JobStore`; no processes, no network."""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import pytest
import sqlite_utils

from node.work.jobs import (
    FINAL_STATES,
    JOB_STATES,
    JOB_TRANSITIONS,
    LIVE_UNIT_STATES,
    UNIT_STATES,
    UNIT_TRANSITIONS,
    IllegalTransition,
    Job,
    JobStore,
    Unit,
)
from node.work.jobs.states import JOB_INITIAL, UNIT_INITIAL, diagram, document

DOC = Path(__file__).resolve().parents[4] / "docs" / "design" / "states.md"

JOB_EDGES = [(a, b) for a, targets in JOB_TRANSITIONS.items() for b in targets]
UNIT_EDGES = [(a, b) for a, targets in UNIT_TRANSITIONS.items() for b in targets]
JOB_REFUSED = [
    (a, b) for a, b in itertools.product(JOB_STATES, repeat=2) if a != b and (a, b) not in JOB_EDGES
]
UNIT_REFUSED = [
    (a, b)
    for a, b in itertools.product(UNIT_STATES, repeat=2)
    if a != b and (a, b) not in UNIT_EDGES
]


@pytest.fixture
def jobs(tmp_path: Path) -> JobStore:
    return JobStore(sqlite_utils.Database(tmp_path / "node.db"))


def _path(table: Mapping[str, Mapping[str, str]], start: str, goal: str) -> list[str]:
    """The states after `start` on a shortest way to `goal` through `table`."""
    came: dict[str, str] = {}
    todo = deque([start])
    while todo:
        state = todo.popleft()
        if state == goal:
            steps = []
            while state != start:
                steps.append(state)
                state = came[state]
            return steps[::-1]
        for nxt in table[state]:
            if nxt not in came and nxt != start:
                came[nxt] = state
                todo.append(nxt)
    raise AssertionError(f"{goal} cannot be reached from {start}")


def _job_in(jobs: JobStore, state: str) -> Job:
    job = jobs.create("j", {}, "auto", {}, [])
    for step in _path(JOB_TRANSITIONS, JOB_INITIAL, state):
        moved = jobs.transition(job.id, (job.state,), f"to {step}", state=step)
        assert moved is not None
        job = moved
    return job


def _unit_in(jobs: JobStore, state: str) -> Unit:
    job = jobs.create("j", {}, "auto", {}, [])
    unit = jobs.add_unit(job.id, "worker", 30)
    for step in _path(UNIT_TRANSITIONS, UNIT_INITIAL, state):
        moved = jobs.unit_transition(unit.unit_id, (unit.state,), state=step)
        assert moved is not None
        unit = moved
    return unit


def _row(jobs: JobStore, job_id: str) -> dict:
    return dict(jobs.db["jobs"].get(job_id))


# -- the tables ------------------------------------------------------------------------


def test_the_tables_are_closed_and_the_derived_states_agree() -> None:
    for table, states in ((JOB_TRANSITIONS, JOB_STATES), (UNIT_TRANSITIONS, UNIT_STATES)):
        assert all(set(targets) <= set(states) for targets in table.values())
        assert all(start not in targets for start, targets in table.items())  # no self-edges
    assert FINAL_STATES == ("completed", "failed", "cancelled")
    assert LIVE_UNIT_STATES == ("offered", "running", "verifying")
    assert all(_path(JOB_TRANSITIONS, JOB_INITIAL, s) or s == JOB_INITIAL for s in JOB_STATES)
    assert all(_path(UNIT_TRANSITIONS, UNIT_INITIAL, s) or s == UNIT_INITIAL for s in UNIT_STATES)


# -- allowed changes -------------------------------------------------------------------


@pytest.mark.parametrize(("start", "to"), JOB_EDGES)
def test_every_allowed_job_transition_succeeds(
    jobs: JobStore, tmp_path: Path, start: str, to: str
) -> None:
    job = _job_in(jobs, start)
    moved = jobs.transition(job.id, (start,), "why", state=to, reason="because")
    assert moved is not None and (moved.state, moved.reason) == (to, "because")
    assert moved.timeline[-1]["state"] == to and moved.timeline[-1]["note"] == "why"
    reopened = JobStore(sqlite_utils.Database(tmp_path / "node.db")).get(job.id)
    assert reopened is not None and reopened.state == to  # written to the file


@pytest.mark.parametrize(("start", "to"), UNIT_EDGES)
def test_every_allowed_unit_transition_succeeds(
    jobs: JobStore, tmp_path: Path, start: str, to: str
) -> None:
    unit = _unit_in(jobs, start)
    moved = jobs.unit_transition(unit.unit_id, (start,), state=to, reason="because")
    assert moved is not None and (moved.state, moved.reason) == (to, "because")
    reopened = JobStore(sqlite_utils.Database(tmp_path / "node.db")).unit(unit.unit_id)
    assert reopened is not None and reopened.state == to


def test_writing_a_state_over_itself_is_no_change(jobs: JobStore) -> None:
    job = _job_in(jobs, "running")  # a second replica starts: its job stays running
    again = jobs.transition(job.id, ("queued", "running"), state="running", worker="w2")
    assert again is not None and again.worker == "w2"
    assert len(again.timeline) == len(job.timeline)  # no state change, no note


# -- refused changes -------------------------------------------------------------------


@pytest.mark.parametrize(("start", "to"), JOB_REFUSED)
def test_a_job_transition_outside_the_table_raises_and_writes_nothing(
    jobs: JobStore, start: str, to: str
) -> None:
    job = _job_in(jobs, start)
    before = _row(jobs, job.id)
    with pytest.raises(IllegalTransition) as raised:
        jobs.transition(job.id, (start,), "no", state=to)
    assert (raised.value.from_state, raised.value.to_state) == (start, to)
    assert repr(start) in str(raised.value) and repr(to) in str(raised.value)
    assert _row(jobs, job.id) == before


@pytest.mark.parametrize(("start", "to"), UNIT_REFUSED)
def test_a_unit_transition_outside_the_table_raises_and_writes_nothing(
    jobs: JobStore, start: str, to: str
) -> None:
    unit = _unit_in(jobs, start)
    with pytest.raises(IllegalTransition, match=f"unit '{start}' -> '{to}'"):
        jobs.unit_transition(unit.unit_id, (start,), state=to, reason="no")
    assert jobs.unit(unit.unit_id) == unit


def test_every_named_start_is_checked_not_only_the_rows(jobs: JobStore) -> None:
    """A call that would revive a completed job fails while the job is still queued:
    the bug shows the first time the call runs, not when a race finds it."""
    job = _job_in(jobs, "queued")
    with pytest.raises(IllegalTransition, match="'completed' -> 'running'"):
        jobs.transition(job.id, ("queued", "completed"), state="running")
    assert jobs.get(job.id).state == "queued"


def test_an_unknown_state_or_a_missing_one_is_refused(jobs: JobStore) -> None:
    job = _job_in(jobs, "queued")
    unit = _unit_in(jobs, "offered")
    with pytest.raises(IllegalTransition):
        jobs.transition(job.id, ("queued",), state="paused")
    with pytest.raises(IllegalTransition):
        jobs.unit_transition(unit.unit_id, ("offered",), state="paused")
    with pytest.raises(ValueError, match="use note, set_progress or amend"):
        jobs.transition(job.id, ("queued",), reason="no state named")
    with pytest.raises(ValueError, match="needs state="):
        jobs.unit_transition(unit.unit_id, ("offered",), reason="no state named")
    with pytest.raises(ValueError, match="never changes the state"):
        jobs.amend(job.id, ("queued",), state="running")
    assert (jobs.get(job.id).state, jobs.unit(unit.unit_id).state) == ("queued", "offered")


# -- compare-and-set -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actual", "expected", "to"),
    [("running", ("queued",), "cancelled"), ("queued", ("running",), "completed")]
    + [(final, ("queued", "running"), "cancelled") for final in ("completed", "failed")],
)
def test_a_job_compare_and_set_from_the_wrong_state_changes_nothing(
    jobs: JobStore, actual: str, expected: tuple[str, ...], to: str
) -> None:
    job = _job_in(jobs, actual)
    before = _row(jobs, job.id)
    assert jobs.transition(job.id, expected, "late", state=to) is None
    assert _row(jobs, job.id) == before


@pytest.mark.parametrize(
    ("actual", "expected", "to"),
    [("running", ("offered",), "running"), ("verifying", ("offered", "running"), "verifying")]
    + [(final, LIVE_UNIT_STATES, "cancelled") for final in ("done", "failed", "expired")],
)
def test_a_unit_compare_and_set_from_the_wrong_state_changes_nothing(
    jobs: JobStore, actual: str, expected: tuple[str, ...], to: str
) -> None:
    unit = _unit_in(jobs, actual)
    assert jobs.unit_transition(unit.unit_id, expected, state=to, reason="late") is None
    assert jobs.unit(unit.unit_id) == unit


def test_a_missing_row_is_no_change(jobs: JobStore) -> None:
    assert jobs.transition("0" * 16, ("queued",), state="running") is None
    assert jobs.unit_transition("0" * 16, ("offered",), state="running") is None
    assert jobs.note("0" * 16, "nobody") is None


# -- writes that change no state -------------------------------------------------------


@pytest.mark.parametrize("state", JOB_STATES)
def test_a_note_changes_no_state(jobs: JobStore, state: str) -> None:
    job = _job_in(jobs, state)
    noted = jobs.note(job.id, "something happened", from_states=(state,))
    assert noted is not None and noted.state == state
    assert noted.timeline[-1] == {
        "t": noted.updated_at,
        "state": state,
        "note": "something happened",
    }
    assert len(noted.timeline) == len(job.timeline) + 1


def test_a_note_by_default_is_for_a_running_job(jobs: JobStore) -> None:
    queued = _job_in(jobs, "queued")
    before = _row(jobs, queued.id)
    assert jobs.note(queued.id, "not running") is None
    assert _row(jobs, queued.id) == before
    running = _job_in(jobs, "running")
    assert jobs.note(running.id, "running").timeline[-1]["note"] == "running"


def test_progress_is_written_only_while_running_and_changes_no_state(jobs: JobStore) -> None:
    job = _job_in(jobs, "running")
    moved = jobs.set_progress(job.id, {"step": 3})
    assert moved is not None and (moved.state, moved.progress) == ("running", {"step": 3})
    assert moved.timeline == job.timeline  # progress alone adds no timeline entry
    noted = jobs.set_progress(job.id, {"step": 4}, "trial 1 complete")
    assert noted.progress == {"step": 4} and noted.timeline[-1]["note"] == "trial 1 complete"
    assert noted.timeline[-1]["state"] == "running"
    for state in ("queued", *FINAL_STATES):
        other = _job_in(jobs, state)
        before = _row(jobs, other.id)
        assert jobs.set_progress(other.id, {"step": 9}) is None  # a late heartbeat
        assert _row(jobs, other.id) == before


def test_amend_writes_fields_with_or_without_a_note(jobs: JobStore) -> None:
    job = _job_in(jobs, "queued")
    waiting = jobs.amend(job.id, ("queued",), reason="no peer fits")
    assert waiting is not None and waiting.timeline == job.timeline
    declined = jobs.amend(job.id, ("queued",), "w declined: busy", excluded=["w"])
    assert (declined.state, declined.excluded, declined.reason) == ("queued", ["w"], "no peer fits")
    assert declined.timeline[-1]["note"] == "w declined: busy"


def test_every_write_tells_the_listener(tmp_path: Path) -> None:
    told: list[str] = []
    jobs = JobStore(sqlite_utils.Database(tmp_path / "node.db"), lambda job: told.append(job.state))
    job = jobs.create("j", {}, "auto", {}, [])
    jobs.transition(job.id, ("queued",), state="running")
    jobs.note(job.id, "n")
    jobs.set_progress(job.id, {"step": 1})
    assert told == ["queued", "running", "running", "running"]


# -- the generated doc -----------------------------------------------------------------


def test_the_diagrams_draw_exactly_the_tables() -> None:
    for table, initial in ((JOB_TRANSITIONS, JOB_INITIAL), (UNIT_TRANSITIONS, UNIT_INITIAL)):
        drawn = re.findall(r"^    (\S+) --> (\S+?)(?::|$)", diagram(table, initial), re.M)
        edges = {(a, b) for a, b in drawn if "[*]" not in (a, b)}
        assert edges == {(a, b) for a, targets in table.items() for b in targets}
        assert ("[*]", initial) in drawn
        assert {a for a, b in drawn if b == "[*]"} == {s for s, t in table.items() if not t}


def test_the_states_doc_is_generated_from_the_tables() -> None:
    assert DOC.read_text() == document(), (
        "docs/design/states.md differs from node/work/jobs/states.py; regenerate it with "
        "`.venv/bin/python -m node.work.jobs > docs/design/states.md`"
    )
