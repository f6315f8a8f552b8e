"""Tests for protocol.codec: the one msgpack codec and its hard limits."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    AD_LIMITS,
    DEFAULT_LIMITS,
    DecodeError,
    Limits,
    ProtocolError,
    TooLarge,
    decode,
    encode,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

#: plain msgpack values: what a peer can legitimately (or maliciously) put on the wire
PLAIN = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)

TINY = Limits(max_bytes=200, max_depth=3, max_container_len=4, max_str_len=8, max_bin_len=8)
ALL_LIMITS = st.sampled_from([DEFAULT_LIMITS, AD_LIMITS, TINY])


def _depth(value) -> int:
    """Container nesting depth, counted the way the codec counts it (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _assert_plain(value, limits: Limits) -> None:
    """Everything decode returns is plain data within `limits`."""
    assert _depth(value) <= limits.max_depth
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            assert len(item) <= limits.max_container_len
            for k, v in item.items():
                assert type(k) in (str, bytes)
                stack.extend((k, v))
        elif isinstance(item, list):
            assert len(item) <= limits.max_container_len
            stack.extend(item)
        else:
            assert item is None or type(item) in (bool, int, float, str, bytes), repr(item)
            if isinstance(item, str):
                assert len(item.encode("utf-8")) <= limits.max_str_len
            if isinstance(item, bytes):
                assert len(item) <= limits.max_bin_len


def _ext(code: int, size: int) -> bytes:
    """A msgpack ext value, built by hand (msgpack.ExtType refuses negative codes)."""
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    typ = code.to_bytes(1, "big", signed=True)
    if size in fixext:
        return bytes([fixext[size]]) + typ + b"\x00" * size
    if size < 256:
        return b"\xc7" + bytes([size]) + typ + b"\x00" * size
    return b"\xc8" + size.to_bytes(2, "big") + typ + b"\x00" * size


def _nested_lists(depth: int) -> bytes:
    """`depth` lists, each holding the next; the innermost is empty."""
    return b"\x91" * (depth - 1) + b"\x90"


# --- fuzzing: only ProtocolError subclasses may escape ---------------------------------


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=300), limits=ALL_LIMITS)
def test_decode_arbitrary_bytes_raises_only_protocol_errors(data, limits):
    try:
        value = decode(data, limits)
    except ProtocolError as exc:
        assert isinstance(exc, TooLarge | DecodeError)
    else:
        _assert_plain(value, limits)


@settings(max_examples=200, deadline=None)
@given(value=PLAIN, cut=st.integers(min_value=0), flip=st.integers(min_value=0), limits=ALL_LIMITS)
def test_decode_mangled_valid_msgpack_raises_only_protocol_errors(value, cut, flip, limits):
    """Random bytes rarely parse; mangling real encodings reaches deeper into the parser."""
    data = bytearray(encode(value))
    bit = flip % (len(data) * 8)
    data[bit // 8] ^= 1 << (bit % 8)
    data = bytes(data[: len(data) - cut % len(data)])
    try:
        result = decode(data, limits)
    except ProtocolError as exc:
        assert isinstance(exc, TooLarge | DecodeError)
    else:
        _assert_plain(result, limits)


@settings(max_examples=200, deadline=None)
@given(value=PLAIN)
def test_encode_decode_round_trip(value):
    data = encode(value)
    # compare encodings, not values: NaN != NaN
    assert encode(decode(data)) == data


@settings(max_examples=100, deadline=None)
@given(value=PLAIN, limits=ALL_LIMITS)
def test_decode_accepts_or_rejects_valid_msgpack_by_limits(value, limits):
    data = encode(value)
    try:
        result = decode(data, limits)
    except TooLarge:
        return
    assert encode(result) == data
    _assert_plain(result, limits)


def test_every_strict_prefix_of_a_message_is_rejected():
    data = encode({"a": [1, 2.5, "three", b"four", None, True], "b": {"c": -(2**40)}})
    assert decode(data) == {"a": [1, 2.5, "three", b"four", None, True], "b": {"c": -(2**40)}}
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            decode(data[:n])


def test_trailing_bytes_are_rejected():
    with pytest.raises(DecodeError):
        decode(encode(1) + encode(2))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\xd9", b"\xa5ab", b"\xff" * 3 + b"\xc1"])
def test_garbage_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        decode(data)


def test_invalid_utf8_string_is_a_decode_error():
    with pytest.raises(DecodeError):
        decode(b"\xa2\xff\xfe")


@pytest.mark.parametrize("value", [bytearray(encode([1, "x"])), memoryview(encode([1, "x"]))])
def test_decode_accepts_bytes_like(value):
    assert decode(value) == [1, "x"]


@pytest.mark.parametrize("value", ["\x91\x01", None, 5, [b"\x01"]])
def test_decode_rejects_non_bytes(value):
    with pytest.raises(DecodeError):
        decode(value)


@pytest.mark.parametrize(
    "data",
    [
        encode({1: "int key"}),
        encode({None: 1}),
        b"\x81\x91\x01\x01",  # {[1]: 1}
        b"\x81\x80\x01",  # {{}: 1}
    ],
)
def test_map_keys_must_be_strings_or_bytes(data):
    with pytest.raises(DecodeError):
        decode(data)


# --- limits ---------------------------------------------------------------------------


def test_max_bytes_is_enforced_before_parsing():
    limits = Limits(max_bytes=100)
    ok = encode(b"x" * 98)  # bin8: 2-byte header + 98 bytes
    assert len(ok) == 100
    assert decode(ok, limits) == b"x" * 98
    with pytest.raises(TooLarge):
        decode(encode(b"x" * 99), limits)
    # 0xc1 is never valid msgpack: parsing would say DecodeError, the size check wins
    with pytest.raises(TooLarge):
        decode(b"\xc1" * 101, limits)
    with pytest.raises(DecodeError):
        decode(b"\xc1" * 100, limits)


def test_default_max_bytes():
    with pytest.raises(TooLarge):
        decode(b"\xc1" * (DEFAULT_LIMITS.max_bytes + 1))


@pytest.mark.parametrize("wrap", [lambda s: s, lambda s: [s], lambda s: {"k": s}, lambda s: {s: 1}])
def test_max_str_len(wrap):
    limits = Limits(max_str_len=10)
    assert decode(encode(wrap("a" * 10)), limits) == wrap("a" * 10)
    with pytest.raises(TooLarge):
        decode(encode(wrap("a" * 11)), limits)
    # the limit counts encoded bytes, not characters: 6 x 2-byte chars = 12 bytes
    with pytest.raises(TooLarge):
        decode(encode(wrap("é" * 6)), limits)


def test_max_str_len_of_ad_limits():
    assert decode(encode("a" * AD_LIMITS.max_str_len), AD_LIMITS) == "a" * AD_LIMITS.max_str_len
    with pytest.raises(TooLarge):
        decode(encode("a" * (AD_LIMITS.max_str_len + 1)), AD_LIMITS)


def test_max_bin_len():
    limits = Limits(max_bin_len=10)
    assert decode(encode([b"b" * 10]), limits) == [b"b" * 10]
    with pytest.raises(TooLarge):
        decode(encode([b"b" * 11]), limits)


@pytest.mark.parametrize(
    "make", [lambda n: list(range(n)), lambda n: {str(i): i for i in range(n)}]
)
def test_max_container_len(make):
    limits = Limits(max_container_len=10)
    assert decode(encode(make(10)), limits) == make(10)
    with pytest.raises(TooLarge):
        decode(encode(make(11)), limits)
    with pytest.raises(TooLarge):
        decode(encode([make(11)]), limits)


def test_max_container_len_of_ad_limits():
    n = AD_LIMITS.max_container_len
    assert decode(encode([0] * n), AD_LIMITS) == [0] * n
    with pytest.raises(TooLarge):
        decode(encode([0] * (n + 1)), AD_LIMITS)


@pytest.mark.parametrize("max_depth", [1, 3, 8])
def test_max_depth_lists(max_depth):
    limits = Limits(max_depth=max_depth)
    assert _depth(decode(_nested_lists(max_depth), limits)) == max_depth
    with pytest.raises(TooLarge):
        decode(_nested_lists(max_depth + 1), limits)


def test_max_depth_maps_and_mixed():
    limits = Limits(max_depth=3)
    ok = {"a": [{"b": 1}]}
    assert decode(encode(ok), limits) == ok
    for too_deep in ({"a": [{"b": [1]}]}, [[[{}]]], {"a": {"b": {"c": {}}}}):
        with pytest.raises(TooLarge):
            decode(encode(too_deep), limits)


def test_max_depth_counts_the_deepest_branch_only():
    limits = Limits(max_depth=2)
    assert decode(encode([[1], [2], 3, {"x": 4}]), limits) == [[1], [2], 3, {"x": 4}]
    with pytest.raises(TooLarge):
        decode(encode([[1], [2], 3, {"x": [4]}]), limits)


@pytest.mark.parametrize("depth", [1023, 1024, 1025, 5000, DEFAULT_LIMITS.max_bytes])
def test_very_deep_nesting_is_too_large(depth):
    """Deeper than msgpack's own parser stack (~1024) must still be TooLarge, not a crash
    or a DecodeError."""
    data = _nested_lists(depth)
    assert len(data) <= DEFAULT_LIMITS.max_bytes
    with pytest.raises(TooLarge):
        decode(data)


@pytest.mark.parametrize("code", [0, 1, 5, 127, -1, -2, -128])
@pytest.mark.parametrize("size", [0, 1, 2, 4, 8, 12, 16, 17, 300])
def test_ext_types_are_rejected(code, size):
    data = _ext(code, size)
    if code >= 0:
        assert data == msgpack.packb(msgpack.ExtType(code, b"\x00" * size))
    for wrapped in (data, b"\x91" + data, b"\x81\xa1k" + data):
        with pytest.raises(DecodeError):
            decode(wrapped)


def test_zero_length_ext_is_rejected():
    """ext 8 with length 0 slips past max_ext_len=0; it must still not decode."""
    with pytest.raises(DecodeError):
        decode(b"\xc7\x00\x05")


def test_msgpack_timestamps_are_rejected():
    data = msgpack.packb(msgpack.Timestamp(1_700_000_000, 5))
    with pytest.raises(DecodeError):
        decode(data)


# --- encode ---------------------------------------------------------------------------


def test_encode_is_deterministic_and_keeps_key_order():
    a = encode({"b": 1, "a": [1.5, "x", b"y", None, False]})
    assert a == encode({"b": 1, "a": [1.5, "x", b"y", None, False]})
    assert a != encode({"a": [1.5, "x", b"y", None, False], "b": 1})
    assert list(decode(a)) == ["b", "a"]


def test_encode_distinguishes_str_and_bytes():
    assert decode(encode(["x", b"x"])) == ["x", b"x"]
    assert type(decode(encode(b"x"))) is bytes


@pytest.mark.parametrize("value", [object(), {1j: 1}, 2**64, -(2**63) - 1, {"s": {1, 2}}])
def test_encode_unencodable_is_a_decode_error(value):
    with pytest.raises(DecodeError):
        encode(value)
