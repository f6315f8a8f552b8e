"""The owner's answer to an eager share that takes its round's weights on its way
(`EarlyWeights.weights_to_take`), on a real node.db and blob store: a heartbeat that
says its runner waits is held until the early outer step writes the weights, and
answered then, not at the worker's next heartbeat; at most `hold_s`; and nothing for
a share that ended meanwhile. Time is trio's mock clock: an answer that came before
the hold ran out came because the weights did."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing
from nacl.signing import SigningKey

from node.identity import Identity
from node.work.jobs import Job, Round, Unit
from node.work.owner import OwnerRole
from node.work.owner.modes import ElasticRounds
from tests.contexts import offline_context

ELASTIC = {
    "mode": "elastic",
    "elastic": {"rounds": 3, "workers": 2, "min_workers": 1, "inner_steps": 20},
    "requirements": {"max_hours": 1.0},
}
HOLD_S = 30.0
WORKER = Identity(SigningKey.generate()).peer_id


@pytest.fixture
def rounds(tmp_path: Path) -> tuple[ElasticRounds, Job, Round]:
    """An elastic job at round 0 (overlap at its default: its eager shares take the
    round's weights after a quarter of their steps), on an owner with no network."""
    owner = OwnerRole(offline_context(tmp_path), None)  # type: ignore[arg-type]
    jobs = owner.ctx.jobs
    job = jobs.create("j", ELASTIC, "auto", {"training_flops": 3 * 10**12}, [])
    job = jobs.transition(job.id, ("queued",), "driver", state="running")
    elastic = owner.modes["elastic"]
    start = owner.ctx.blobs.put_bytes(b"round 0's weights")
    current = elastic.store.open(job.id, 0, start, "", time.time() + 60)
    assert job is not None and current is not None
    return elastic, job, current


def _share(elastic: ElasticRounds, job: Job, round_: int, slot: int, **fields: str) -> Unit:
    deadline = time.time() + 3600
    unit = elastic.ctx.jobs.add_unit(
        job.id, WORKER, 30, deadline=deadline, round_=round_, slot=slot, **fields
    )
    if round_ == 0:  # its delta is in
        elastic.ctx.jobs.unit_output(unit.unit_id, f"{slot}" * 64, 100)
    fresh = elastic.ctx.jobs.unit(unit.unit_id)
    assert fresh is not None
    return fresh


def _outer_step(elastic: ElasticRounds, gate: trio.Event) -> dict[str, str]:
    """The round's outer step, taken once `gate` is set; the blobs it writes."""
    blobs = elastic.ctx.blobs
    made = {"weights": blobs.put_bytes(b"round 1's weights"), "update": blobs.put_bytes(b"up")}

    async def outer_step(*_: object) -> tuple[str, str, str]:
        await gate.wait()
        return made["weights"], blobs.put_bytes(b"momentum"), made["update"]

    elastic.tasks.outer_step = outer_step  # type: ignore[method-assign]
    return made


def test_a_waiting_share_is_answered_the_moment_the_early_step_writes_the_weights(
    rounds: tuple[ElasticRounds, Job, Round],
) -> None:
    elastic, job, current = rounds
    done = [_share(elastic, job, 0, slot) for slot in (0, 1)]
    taker = _share(elastic, job, 1, 0, start_delta="0" * 64)
    gate = trio.Event()
    made = _outer_step(elastic, gate)
    answers: list[tuple[float, dict]] = []

    async def main() -> None:
        async def ask() -> None:
            answer = await elastic.weights_to_take(job, taker, HOLD_S)
            answers.append((trio.current_time(), answer))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.testing.wait_all_tasks_blocked()
            assert answers == []  # held: no weights yet
            elastic.early.maybe_start(nursery, job, current, done, [])
            await trio.sleep(1.0)
            assert answers == []  # the outer step is under way
            gate.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    [(at, answer)] = answers
    assert at == pytest.approx(1.0)  # then, not at the end of the hold
    assert (answer["weights_sha256"], answer["update_sha256"]) == (made["weights"], made["update"])
    assert answer["weights_grant"]
    told = elastic.ctx.jobs.unit(taker.unit_id)
    assert told is not None and told.taken == made["weights"]


def test_a_held_answer_gives_up_after_the_hold_and_says_nothing_to_an_ended_share(
    rounds: tuple[ElasticRounds, Job, Round],
) -> None:
    elastic, job, _ = rounds
    taker = _share(elastic, job, 1, 0, start_delta="0" * 64)
    ended = _share(elastic, job, 1, 1, start_delta="1" * 64)
    answers: dict[str, tuple[float, dict]] = {}

    async def main() -> None:
        async def ask(unit: Unit) -> None:
            answer = await elastic.weights_to_take(job, unit, HOLD_S)
            answers[unit.unit_id] = (trio.current_time(), answer)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, taker)
            nursery.start_soon(ask, ended)
            await trio.testing.wait_all_tasks_blocked()
            elastic.ctx.jobs.unit_transition(ended.unit_id, ("offered",), state="expired")
            await trio.sleep(5.0)
            # the round closes with weights of its own (no early step was taken)
            weights = elastic.ctx.blobs.put_bytes(b"closed round's weights")
            elastic.store.update(
                job.id, 0, "open", state="closed", next_weights_sha256=weights, workers=[WORKER]
            )
            elastic.early.closed(job.id, 0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert answers[ended.unit_id] == (pytest.approx(5.0), {})
    at, answer = answers[taker.unit_id]
    assert at == pytest.approx(5.0) and answer["weights_sha256"]

    async def unanswered(hold_s: float) -> tuple[float, dict]:  # its round before is open
        later = _share(elastic, job, 2, 0, start_delta="2" * 64)
        answer = await elastic.weights_to_take(job, later, hold_s)
        return trio.current_time(), answer

    for hold_s in (HOLD_S, 0.0):
        clock = trio.testing.MockClock(autojump_threshold=0)
        assert trio.run(unanswered, hold_s, clock=clock) == (pytest.approx(hold_s), {})
