"""The owner's `RoundUpdate` (the global weights' change from one round to the next)
and a `RoundShare` that names one: each bad file or field refused by name."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocol.codec import encode
from protocol.errors import DecodeError, TooLarge
from protocol.rounds import (
    RoundShare,
    RoundUpdate,
    decode_round_update,
    encode_round_update,
)
from protocol.schema import to_plain
from protocol.tensors import CompressedTensor, encode_tensor, pack_nibbles

BASE, AFTER = "b" * 64, "a" * 64


def _tensor(numel: int = 100, code: int = 3) -> bytes:
    """An encoded tensor, also one the encoder would refuse (a hostile owner's)."""
    codes = np.full(numel, code, dtype=np.int8).tobytes()
    scales = np.full(-(-numel // 64), 0.01, dtype="<f4").tobytes()
    tensor = CompressedTensor([numel], "F32", 64, codes, scales)
    if code != -128:
        return encode_tensor(tensor)
    return encode({"t": CompressedTensor.TYPE, "v": CompressedTensor.VERSION, **to_plain(tensor)})


def _tensor4(numel: int = 101) -> bytes:
    """An encoded int4 tensor of `numel` codes (-7..7)."""
    codes = pack_nibbles(np.arange(numel, dtype=np.int8) % 15 - 7)
    scales = np.full(-(-numel // 64), 0.01, dtype="<f4").tobytes()
    return encode_tensor(CompressedTensor([numel], "F32", 64, codes, scales, bits=4))


def _update(**changes: object) -> RoundUpdate:
    update = RoundUpdate("ab" * 8, 3, BASE, AFTER, 100, _tensor())
    return dataclasses.replace(update, **changes)


def _decode(data: bytes, **expect: object) -> RoundUpdate:
    args = {
        "numel": 100,
        "job_id": "ab" * 8,
        "round": 3,
        "base_sha256": BASE,
        "weights_sha256": AFTER,
        "compression": "int8",
    } | expect
    return decode_round_update(data, **args)  # type: ignore[arg-type]


def test_an_update_file_round_trips() -> None:
    update = _update()
    assert _decode(encode_round_update(update)) == update
    int4 = _update(numel=101, tensor=_tensor4())
    assert _decode(encode_round_update(int4), numel=101, compression="int4") == int4


@pytest.mark.parametrize(
    ("update", "compression", "message"),
    [
        (_update(), "int4", "8-bit codes; this job sends 4"),
        (_update(numel=101, tensor=_tensor4()), "int8", "4-bit codes; this job sends 8"),
        (_update(), "none", "compression 'none' has no round updates"),
    ],
)
def test_an_update_in_other_codes_than_the_jobs_is_refused(
    update: RoundUpdate, compression: str, message: str
) -> None:
    with pytest.raises(DecodeError, match=message):
        _decode(encode_round_update(update), numel=update.numel, compression=compression)


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ({"round": 4}, "RoundUpdate.round is 3, expected 4"),
        ({"job_id": "cd" * 8}, "RoundUpdate.job_id"),
        ({"base_sha256": "c" * 64}, "RoundUpdate.base_sha256"),
        ({"weights_sha256": "c" * 64}, "RoundUpdate.weights_sha256"),
        ({"numel": 99}, "RoundUpdate.numel is 100; this model has 99|too large|exceeds"),
    ],
)
def test_an_update_for_another_round_job_or_model_is_refused(expect: dict, message: str) -> None:
    with pytest.raises((DecodeError, TooLarge), match=message):
        _decode(encode_round_update(_update()), **expect)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encode({"t": "round_delta", "v": 1}), "not a round update file"),
        (encode({"t": "round_update", "v": 2}), "only version 1 is read"),
        (encode_round_update(_update(tensor=_tensor(code=-128))), "-128"),
        (encode_round_update(_update(tensor=_tensor(numel=50))), "tensor"),
        (b"\xc1" * 64, "."),
    ],
)
def test_a_file_that_is_no_update_is_refused(data: bytes, message: str) -> None:
    with pytest.raises((DecodeError, TooLarge), match=message):
        _decode(data)


def test_an_oversized_update_is_refused_before_it_is_read() -> None:
    with pytest.raises(TooLarge):
        _decode(b"\0" * 10_000)


@pytest.mark.parametrize(
    ("share", "message"),
    [
        (RoundShare(2, 0, AFTER, base_sha256=BASE), "comes with base_sha256, and only with it"),
        (RoundShare(2, 0, AFTER, update_sha256="c" * 64), "comes with base_sha256"),
        (RoundShare(0, 0, AFTER, BASE, "c" * 64), "round 0 has no round before"),
        (RoundShare(2, 0, AFTER, "B" * 64, "c" * 64), "base_sha256"),
        (RoundShare(0, 0, AFTER, start_delta_sha256="c" * 64), "share.start_delta_sha256"),
        (RoundShare(2, 0, AFTER, start_delta_sha256="C" * 64), "share.start_delta_sha256"),
    ],
)
def test_a_share_names_an_update_only_with_its_base(share: RoundShare, message: str) -> None:
    """... and an eager start's delta only from round 1 on, as a sha256."""
    with pytest.raises(DecodeError, match=message):
        share.check("share")
    RoundShare(2, 0, AFTER, BASE, "c" * 64).check("share")  # both: fine
    RoundShare(2, 0, AFTER, BASE, "c" * 64, "d" * 64).check("share")  # eager: fine
