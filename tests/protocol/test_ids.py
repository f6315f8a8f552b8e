"""Ids a peer mints have one format, checked at decode time in every message that
carries one: anything that could become a path, or is not the node's own spelling,
is a clear DecodeError naming the field."""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.signing import SigningKey

from protocol import DecodeError, open_envelope, peer_id_from_public_key, seal
from protocol.blobs import GRANT_LIMITS, BlobGrant
from protocol.ids import check_id, is_id
from protocol.work import WORK_LIMITS, OfferReply, Progress, Receipt, Result, WorkOffer

KEY = SigningKey(b"i" * 32)
PEER = peer_id_from_public_key(bytes(KEY.verify_key))
GOOD = "0123456789abcdef"

BAD_IDS = {
    "parent path": "../../../etc/x",
    "absolute path": "/tmp/meshminer-x",
    "NUL byte": "0123456789abcde\x00f",
    "upper case": "0123456789ABCDEF",
    "too short": "0123456789abcde",
    "too long": "a" * 33,
    "empty": "",
    "dots": "0123456789abcdef.",
    "unicode digit": "0123456789abcde\u0661",
}

MESSAGES = [
    (Progress(GOOD, GOOD, "training", 1, 2, 0.5, 1.0, 10, time.time()), WORK_LIMITS),
    (OfferReply(GOOD, GOOD, True), WORK_LIMITS),
    (WorkOffer(GOOD, GOOD, PEER, b"x", time.time()), WORK_LIMITS),
    (Result(GOOD, GOOD, False, "err", "", 0, b""), WORK_LIMITS),
    (Receipt(GOOD, GOOD, PEER, PEER, "ab" * 32, 1, 1, {}, time.time()), WORK_LIMITS),
    (BlobGrant(GOOD, GOOD, PEER, PEER, ["ab" * 32], 10, time.time() + 60), GRANT_LIMITS),
]


@pytest.mark.parametrize("message,limits", MESSAGES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("field", ["job_id", "unit_id"])
@pytest.mark.parametrize("bad", list(BAD_IDS.values()), ids=list(BAD_IDS))
def test_every_message_refuses_a_bad_id(message, limits, field: str, bad: str) -> None:
    envelope = seal(dataclasses.replace(message, **{field: bad}), KEY)
    with pytest.raises(DecodeError, match=rf"\.{field} must be 16\.\.32 lowercase hex"):
        open_envelope(envelope, type(message), limits=limits)


@pytest.mark.parametrize("message,limits", MESSAGES, ids=lambda m: type(m).__name__)
def test_good_ids_pass(message, limits) -> None:
    assert open_envelope(seal(message, KEY), type(message), limits=limits).message == message


@pytest.mark.parametrize(
    "message,field",
    [(MESSAGES[2][0], "worker"), (MESSAGES[4][0], "owner"), (MESSAGES[5][0], "grantee")],
)
def test_peer_fields_must_be_peer_ids(message, field: str) -> None:
    envelope = seal(dataclasses.replace(message, **{field: "../" + GOOD}), KEY)
    with pytest.raises(DecodeError, match=rf"\.{field} is not a peer id"):
        open_envelope(envelope, type(message), limits=GRANT_LIMITS)


@given(st.text(max_size=40))
def test_is_id_accepts_exactly_the_format(value: str) -> None:
    expected = 16 <= len(value) <= 32 and all(c in "0123456789abcdef" for c in value)
    assert is_id(value) is expected
    if not expected:
        with pytest.raises(DecodeError, match="where"):
            check_id(value, "where")
