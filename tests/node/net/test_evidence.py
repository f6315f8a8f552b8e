"""Evidence of a failed spot check: what a node that hears it checks before it
believes the worker committed to what the owner says."""

from __future__ import annotations

import dataclasses
import time

import pytest
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.evidence_gossip import check_evidence
from protocol import ProtocolError, seal
from protocol.evidence import Evidence, claimed_result
from protocol.work import Result

OWNER, WORKER, OTHER = (SigningKey.generate() for _ in range(3))
JOB, UNIT = "a" * 16, "b" * 16
CLAIMED = ["1" * 64, "2" * 64, "3" * 64]


def _result(key: SigningKey = WORKER, unit: str = UNIT) -> bytes:
    result = Result(JOB, unit, True, "", "4" * 64, 10, b"grant", checkpoints=CLAIMED)
    return seal(result, key)


def _evidence(**changes: object) -> Evidence:
    evidence = Evidence(
        JOB,
        UNIT,
        Identity(OWNER).peer_id,
        Identity(WORKER).peer_id,
        _result(),
        2,
        5,
        10,
        "9" * 64,
        "steps 5..10 replayed do not give checkpoint 2",
        time.time(),
    )
    return dataclasses.replace(evidence, **changes)


def test_good_evidence_opens_with_the_workers_own_claim() -> None:
    sender = Identity(OWNER).peer_id
    evidence = check_evidence(seal(_evidence(), OWNER), sender)
    assert claimed_result(evidence).checkpoints[evidence.index] == CLAIMED[2]


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"result": b"junk"}, "envelope|decode|msgpack"),
        ({"result": _result(OTHER)}, "signed by"),
        ({"result": _result(unit="c" * 16)}, "another unit"),
        ({"index": 7}, "out of range"),
        ({"replayed_sha256": CLAIMED[2]}, "no disagreement"),
        ({"index": -1, "replayed_sha256": "4" * 64}, "no disagreement"),
    ],
)
def test_evidence_that_does_not_hold_is_refused(changes: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        check_evidence(seal(_evidence(**changes), OWNER), Identity(OWNER).peer_id)


def test_evidence_must_come_from_the_owner_who_signs_it() -> None:
    with pytest.raises(ProtocolError):
        check_evidence(seal(_evidence(), OWNER), Identity(OTHER).peer_id)
    with pytest.raises(ProtocolError, match="exceeds"):
        check_evidence(b"x" * (300 * 1024), Identity(OWNER).peer_id)
