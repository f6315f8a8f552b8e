"""Replicas: one unit trained by two workers of one determinism class (`trust.replicas`).

Within a class training is bitwise reproducible, so two honest workers commit to the
same checkpoint chain. Each result is spot-checked first, as any result is; the first
to pass then waits for its partner. Agreeing chains settle the unit for both. Where
the chains part, the owner replays the one segment that ends on the first checkpoint
they disagree on, from the checkpoint before it (which both share): the worker whose
hash the replay gives is right, the other is caught with that segment as evidence.
This is bisection to one segment, as in refereed delegation, never a vote: two
colluding replicas with one fake prove nothing to it, which is why the spot checks
run on every result as well.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio

from node.work.trust.comparisons import Failure
from node.work.trust.spot_checks import SpotChecks, Submitted

log = logging.getLogger(__name__)

REPLICA_WAIT_S = 600.0  # within the result stream's 900 s


@dataclass
class Settled:
    ok: bool
    note: str
    reason: str = ""  # why not ok
    evidence: bytes = b""


@dataclass
class _Waiting:
    sub: Submitted
    done: trio.Event = field(default_factory=trio.Event)
    settled: Settled | None = None


class Replicas:
    def __init__(self, spot_checks: SpotChecks) -> None:
        self._checks = spot_checks
        self._waiting: dict[str, _Waiting] = {}  # by job id: the first replica's result

    async def settle(self, sub: Submitted) -> Settled:
        """Pair `sub` with its partner's result (waiting up to `REPLICA_WAIT_S` for
        it) and compare them; what this replica's result is found to be."""
        job_id = sub.job.id
        partner = self._waiting.pop(job_id, None)
        if partner is None or partner.sub.peer == sub.peer:
            me = self._waiting[job_id] = _Waiting(sub)
            with trio.move_on_after(REPLICA_WAIT_S):
                await me.done.wait()
            if self._waiting.get(job_id) is me:
                del self._waiting[job_id]
            return me.settled or Settled(
                True, f"no replica arrived within {REPLICA_WAIT_S:g} s; settled by its spot check"
            )
        try:
            theirs, mine = await self._compare(partner.sub, sub)
        except Exception as exc:  # the partner's files are gone, say: neither is blamed
            log.warning("job %s: replicas not compared: %s", job_id, exc)
            note = f"replicas not compared ({exc}); settled by spot checks"
            theirs = mine = Settled(True, note)
        partner.settled = theirs
        partner.done.set()
        return mine

    async def _compare(self, first: Submitted, second: Submitted) -> tuple[Settled, Settled]:
        a, b = first.result, second.result
        if a.checkpoints == b.checkpoints and a.weights_sha256 == b.weights_sha256:
            return (
                Settled(True, f"agrees with the replica of {second.peer}"),
                Settled(True, f"agrees with the replica of {first.peer}"),
            )
        index = next(
            (
                i
                for i, (x, y) in enumerate(zip(a.checkpoints, b.checkpoints, strict=True))
                if x != y
            ),
            len(a.checkpoints),
        )
        if index in (0, len(a.checkpoints)):  # both passed their checks of these ends
            raise RuntimeError(f"the chains differ only where both were checked ({index})")
        replayed = await self._checks.replay_segment(first, index - 1)
        return self._judge(first, replayed), self._judge(second, replayed)

    def _judge(self, sub: Submitted, replayed: Failure) -> Settled:
        if sub.result.checkpoints[replayed.index] == replayed.replayed:
            return Settled(True, f"checkpoint {replayed.index} confirmed by replay")
        return Settled(False, "", replayed.reason, self._checks.evidence(sub, replayed))
