"""The owner's count of a job's model shapes: done by a real runner subprocess, once
per spec however many results and heartbeats ask at once, and equal to building the
model here; a spec the runner refuses is counted here, which raises what it met."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
import trio
from contexts import offline_context

from node.work.context import WorkContext
from node.work.trust import model_shapes
from training.errors import SpecError
from training.evidence.result_check import delta_numel, expected_tensors, known_shapes
from training.spec.job import parse_spec, spec_to_plain

pytestmark = pytest.mark.process  # runners are subprocesses

JOB = """
name = "shapes"
seed = 3
[model]
arch = "mlp"
hidden = [12, 5]
[data]
source = "builtin:digits"
[optim]
steps = 4
"""


class CountingContext(WorkContext):
    """A node's real context that counts the owner tasks it runs."""

    tasks: list[str]

    async def run_owner_task(self, request, task_id, max_hours, on_event):  # type: ignore[no-untyped-def]
        self.tasks.append(request.task)
        return await super().run_owner_task(request, task_id, max_hours, on_event)


@pytest.fixture
def ctx(tmp_path: Path) -> CountingContext:
    context = offline_context(tmp_path, CountingContext)
    context.tasks = []
    return context


def test_a_models_shapes_are_counted_by_one_runner_for_everyone_who_asks(
    ctx: CountingContext, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_to_plain(parse_spec(tomllib.loads(JOB)))
    built_here = (expected_tensors.__wrapped__(spec), delta_numel.__wrapped__(spec))
    assert known_shapes(spec, None) is None
    answers: list = []

    async def ask() -> None:
        answers.append(await model_shapes(ctx, spec, [], None))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask)
        await ask()

    with caplog.at_level(logging.WARNING):
        trio.run(main)
    assert answers == [built_here] * 4
    assert ctx.tasks == ["model_shapes"]
    assert "counting them here" not in caplog.text
    assert list((ctx.data_dir / "units").iterdir()) == []  # the task's folder went


def test_a_spec_the_runner_refuses_is_counted_here_and_fails_as_it_did(
    ctx: CountingContext, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_to_plain(parse_spec(tomllib.loads(JOB)))
    spec["model"] = {"arch": "layers", "layers": [{"type": "Lambda"}]}
    with caplog.at_level(logging.WARNING), pytest.raises(SpecError, match="Lambda"):
        trio.run(model_shapes, ctx, spec, [], None)
    assert ctx.tasks == ["model_shapes"]
    assert "the runner failed" in caplog.text
    assert known_shapes(spec, None) is None
