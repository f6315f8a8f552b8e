"""The work protocol's evidence fields, fed bad input: a heartbeat's commitments, a
package's resume state, the owner's progress acknowledgement. Each bad value is a
`DecodeError` naming what was wrong, before anything of it is used."""

from __future__ import annotations

import time
from typing import Any

import pytest
from nacl.signing import SigningKey

from protocol import DecodeError, TooLarge, encode, open_envelope, seal
from protocol.envelope import signing_bytes
from protocol.schema import to_plain
from protocol.work import (
    WORK_LIMITS,
    Progress,
    ProgressAck,
    ResumeFrom,
    WorkPackage,
    decode_progress_ack,
    encode_progress_ack,
)

KEY = SigningKey(b"k" * 32)
SHA = "ab" * 32


def _signed(message: Any, **changes: Any) -> bytes:
    """`message` as the wire carries it, with `changes` made to its plain form."""
    plain = to_plain(message) | changes
    payload = encode(plain)
    kind = type(message)
    sig = KEY.sign(signing_bytes(kind.TYPE, kind.VERSION, payload)).signature
    return encode(
        {"t": kind.TYPE, "v": kind.VERSION, "p": payload, "k": bytes(KEY.verify_key), "s": sig}
    )


def _progress(**changes: Any) -> Progress:
    beat = Progress("a" * 16, "b" * 16, "training", 1, 10, 0.5, 1.0, 8, time.time())
    return open_envelope(_signed(beat, **changes), Progress, limits=WORK_LIMITS).message


def _package(**changes: Any) -> WorkPackage:
    package = WorkPackage("a" * 16, "b" * 16, b"spec", [SHA], b"", b"k" * 32, 1.0, 15.0)
    return open_envelope(_signed(package, **changes), WorkPackage, limits=WORK_LIMITS).message


def test_a_heartbeat_with_its_commitments_and_grant_round_trips() -> None:
    beat = Progress(
        "a" * 16, "b" * 16, "training", 1, 10, 0.5, 1.0, 8, 1.0,
        commit_from=3, commitments=[SHA, "cd" * 32], evidence_grant=b"g", evidence_full=True,
    )  # fmt: skip
    assert open_envelope(seal(beat, KEY), Progress, limits=WORK_LIMITS).message == beat


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"commitments": ["AB" * 32]}, "Progress.commitments[0]"),
        ({"commitments": [SHA, "xyz"]}, "Progress.commitments[1]"),
        ({"commit_from": -1}, "Progress.commitments"),
        ({"commit_from": 9_999, "commitments": [SHA, SHA]}, "Progress.commitments"),
        ({"evidence_full": "yes"}, "Progress.evidence_full"),
        ({"evidence_grant": "text"}, "Progress.evidence_grant"),
    ],
)
def test_bad_commitments_are_decode_errors_naming_the_field(changes: dict, words: str) -> None:
    with pytest.raises(DecodeError, match=words.replace("[", r"\[").replace("]", r"\]")):
        _progress(**changes)


def test_a_package_that_resumes_round_trips() -> None:
    package = WorkPackage(
        "a" * 16, "b" * 16, b"spec", [SHA], b"", b"k" * 32, 1.0, 15.0, resume=ResumeFrom(SHA, 40)
    )
    assert open_envelope(seal(package, KEY), WorkPackage, limits=WORK_LIMITS).message == package


@pytest.mark.parametrize(
    ("resume", "words"),
    [
        ({"state_sha256": "cd" * 32, "step": 40}, "must be one of the package's blobs"),
        ({"state_sha256": SHA, "step": 0}, "WorkPackage.resume.step"),
        ({"state_sha256": "no", "step": 4}, "WorkPackage.resume.state_sha256"),
        ({"state_sha256": SHA}, "WorkPackage.resume"),
    ],
)
def test_a_bad_resume_is_a_decode_error_naming_the_field(resume: dict, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        _package(resume=resume)


def test_the_progress_ack_round_trips_and_reads_a_plain_ack() -> None:
    ack = ProgressAck(True, "", 12, keep=(3, 4), drop=(0, 1, 2))
    assert decode_progress_ack(encode_progress_ack(ack)) == ack
    # the answer to a heartbeat that is not drawn from: ok, nothing decided
    assert decode_progress_ack(encode({"ok": False, "reason": "the unit ended"})) == ProgressAck(
        False, "the unit ended"
    )
    # a share's round weights, as an update or whole
    for update in ("b" * 64, ""):
        taking = ProgressAck(True, "", 2, (), (), "a" * 64, update, b"grant")
        assert decode_progress_ack(encode_progress_ack(taking)) == taking


TAKING = {"ok": True, "weights_sha256": "a" * 64, "update_sha256": "", "weights_grant": b"g"}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"weights_sha256": "A" * 64}, "ProgressAck.weights_sha256 must be a lowercase sha256"),
        ({"weights_sha256": 5}, "ProgressAck.weights_sha256 must be a string"),
        ({"update_sha256": "b" * 63}, "ProgressAck.update_sha256 must be a lowercase sha256"),
        ({"update_sha256": None}, "ProgressAck.update_sha256 must be a string"),
        ({"weights_grant": b""}, "ProgressAck.weights_grant must be 1..8192 bytes"),
        ({"weights_grant": "g"}, "ProgressAck.weights_grant must be 1..8192 bytes"),
        ({"weights_grant": b"g" * 8193}, "ProgressAck.weights_grant must be 1..8192 bytes"),
    ],
)
def test_a_bad_round_weights_answer_is_refused_by_name(changes: dict, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        decode_progress_ack(encode(TAKING | changes))


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",
        encode([1, 2]),
        encode({"reason": "no ok"}),
        encode({"ok": "yes"}),
        encode({"ok": True, "have": -1}),
        encode({"ok": True, "have": 10_001}),
        encode({"ok": True, "have": 1.5}),
        encode({"ok": True, "keep": [-1]}),
        encode({"ok": True, "drop": [10_000]}),
        encode({"ok": True, "keep": "0,1"}),
        encode({"ok": True, "drop": [True]}),
        encode({"ok": True, "keep": list(range(10_001))}),
        encode({"ok": True, "keep": [[1]]}),
        b"\x00" * (33 * 1024),
    ],
)
def test_a_bad_progress_ack_is_refused(raw: bytes) -> None:
    with pytest.raises((DecodeError, TooLarge)):  # too big or too deep: before parsing
        decode_progress_ack(raw)


@pytest.mark.parametrize(
    ("share", "words"),
    [
        (
            {"round": 2, "slot": 0, "weights_sha256": SHA, "base_sha256": "cd" * 32,
             "update_sha256": "ef" * 32},
            "WorkPackage.round_share.update_sha256 must be one of the package's blobs",
        ),
        (
            {"round": 2, "slot": 0, "weights_sha256": SHA, "update_sha256": SHA},
            "comes with base_sha256",
        ),
    ],
)  # fmt: skip
def test_a_share_whose_update_is_not_granted_is_a_decode_error(share: dict, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        _package(round_share=share)
