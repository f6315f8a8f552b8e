"""`with_retries`: what a worker retries while a peer is away (an owner restarting
while its data is fetched, a result in transit) and what ends the retries at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio
import trio.testing

from node.work.blobs import TransferRefused, TransferUnreachable
from node.work.delivery import with_retries


class _Host:
    def __init__(self) -> None:
        self.redials: list[str] = []

    def allow_redial(self, peer: str) -> None:
        self.redials.append(peer)


def _run(outcomes: list[object], **kwargs: object) -> tuple[object, int, float, list[str]]:
    """Call with_retries on a call giving `outcomes` in turn (an exception is raised);
    returns (its answer, calls made, virtual seconds taken, redials)."""
    host = _Host()
    calls = 0

    async def call() -> object:
        nonlocal calls
        outcome = outcomes[min(calls, len(outcomes) - 1)]
        calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def main() -> tuple[object, float]:
        start = trio.current_time()
        answer = await with_retries(SimpleNamespace(host=host), call, "owner", "fetch", **kwargs)
        return answer, trio.current_time() - start

    answer, took = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return answer, calls, took, host.redials


def test_an_unreachable_owner_is_tried_again_with_backoff_until_it_answers() -> None:
    away = TransferUnreachable("no valid connections")
    answer, calls, took, redials = _run(
        [away, away, away, {"sha": "direct channel"}], retry_on=(TransferUnreachable,)
    )
    assert answer == {"sha": "direct channel"}
    assert calls == 4
    assert took == pytest.approx(1 + 2 + 4)  # backoff doubles from 1 s
    assert redials == ["owner"] * 3


def test_a_refusal_is_not_retried_and_propagates() -> None:
    with pytest.raises(TransferRefused):
        _run([TransferRefused("grant expired")], retry_on=(TransferUnreachable,))


def test_a_peer_away_past_the_deadline_gives_none() -> None:
    away = TransferUnreachable("no valid connections")
    answer, calls, took, _ = _run([away], deadline_s=60.0, retry_on=(TransferUnreachable,))
    assert answer is None
    assert took == pytest.approx(60.0)
    assert calls == 7  # at 0, 1, 3, 7, 15, 30 and 45 s: the wait never exceeds 15 s
