"""protocol.tensors: the compressed-tensor wire form. Round trips, every size rule
checked before anything is sized from the message, values (finite positive scales,
codes in -127..127), limits, fuzzing (arbitrary and mutated bytes raise only
ProtocolError subclasses), no torch in protocol; and training.ops.wire, which
turns tensors into these messages and back within the documented error bound."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import encode
from protocol.errors import DecodeError, ProtocolError, TooLarge
from protocol.tensors import (
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    TENSOR_LIMITS,
    CompressedTensor,
    decode_tensor,
    encode_tensor,
    pack_nibbles,
    tensor_limits,
)
from training import ops

ROOT = Path(__file__).resolve().parents[2]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def messages(draw, max_numel: int = 2000) -> CompressedTensor:
    """Valid compressed tensors: any shape (0-8 dims, some empty), dtype and block size."""
    ndim = draw(st.integers(0, 8))
    shape, room = [], max_numel
    for _ in range(ndim):
        dim = draw(st.integers(0, max(1, min(room, 300))))
        shape.append(dim)
        room //= max(dim, 1)
    numel = math.prod(shape)
    block_size = draw(st.sampled_from([16, 32, 256, 4096]))
    nblocks = -(-numel // block_size)
    bits = draw(st.sampled_from([8, 4]))
    codes = draw(st.binary(min_size=numel, max_size=numel)).replace(b"\x80", b"\x7f")
    if bits == 4:
        codes = pack_nibbles(np.frombuffer(codes, np.int8) % 15 - 7)
    scales = draw(
        st.lists(
            st.floats(min_value=2.0**-126, max_value=2.0**126, width=32),
            min_size=nblocks,
            max_size=nblocks,
        )
    )
    return CompressedTensor(
        shape=shape,
        dtype=draw(st.sampled_from(["F32", "BF16", "F16"])),
        block_size=block_size,
        codes=codes,
        scales=np.asarray(scales, dtype="<f4").tobytes(),
        bits=bits,
    )


def plain(message: CompressedTensor, **change) -> dict:
    value = {
        "t": "compressed_tensor",
        "v": 1,
        "shape": message.shape,
        "dtype": message.dtype,
        "block_size": message.block_size,
        "codes": message.codes,
        "scales": message.scales,
    }
    value.update(change)
    return value


GOOD = CompressedTensor([2, 20], "BF16", 16, bytes(range(40)), np.ones(3, "<f4").tobytes())


@FAST
@given(message=messages())
def test_round_trip(message):
    data = encode_tensor(message)
    assert decode_tensor(data) == message
    assert len(data) <= -(-message.numel * message.bits // 8) + 4 * message.nblocks + 120
    assert np.array_equal(decode_tensor(data).codes_array(), message.codes_array())


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"shape": [2, 21]}, "codes must hold prod"),
        ({"shape": [-2, -20]}, r"shape\[0\] must be >= 0"),
        ({"shape": [2**62, 2**62, 0]}, "codes must hold prod"),  # zero-sized, but 40 codes
        ({"shape": [2**62] * 8}, "codes must hold prod"),
        ({"shape": "40"}, "must be a list"),
        ({"dtype": "F64"}, "dtype must be one of F32, BF16, F16"),
        ({"dtype": 1}, "dtype must be str"),
        ({"block_size": 24}, "power of two"),
        ({"block_size": 8}, "power of two in 16..4096"),
        ({"block_size": 8192}, "power of two in 16..4096"),
        ({"block_size": True}, "must be an integer"),
        ({"scales": np.ones(2, "<f4").tobytes()}, "must hold 3 float32 values"),
        ({"scales": b"\x00" * 13}, "must hold 3 float32 values"),
        ({"scales": np.array([1, math.nan, 1], "<f4").tobytes()}, r"scales\[1\] is nan"),
        ({"scales": np.array([1, 1, math.inf], "<f4").tobytes()}, r"scales\[2\] is inf"),
        ({"scales": np.array([1, 0, 1], "<f4").tobytes()}, r"scales\[1\] is 0.0; every scale"),
        ({"scales": np.array([-1, 1, 1], "<f4").tobytes()}, r"scales\[0\] is -1.0"),
        ({"codes": b"\x80" + bytes(39)}, "holds -128"),
        ({"codes": "text"}, "codes must be bytes"),
        ({"t": "blob_grant"}, "expected a compressed_tensor"),
        ({"v": 2}, "v2 is not supported"),
        ({"v": True}, "expected a compressed_tensor"),
        ({"extra": 1}, "not a compressed tensor"),
        ({"bits": 3}, "bits must be 8 or 4"),
        ({"bits": 4}, "must hold prod.shape. 4-bit codes; it has 40 bytes"),
        ({"bits": 4, "codes": bytes(21)}, "must hold prod.shape. 4-bit codes; it has 21 bytes"),
        ({"bits": 4, "codes": b"\x08" + bytes(19)}, "holds -8; codes are -7..7"),
        ({"bits": 4, "codes": b"\x80" + bytes(19)}, "holds -8; codes are -7..7"),
        ({"bits": 4, "shape": [39], "codes": bytes(19) + b"\x10"}, "padding nibble"),
    ],
)
def test_bad_messages_name_what_was_wrong(change, words):
    with pytest.raises(DecodeError, match=words):
        decode_tensor(encode(plain(GOOD, **change)))


def test_more_than_eight_dims_is_too_large():
    with pytest.raises(TooLarge, match="max_array_len"):
        decode_tensor(encode(plain(GOOD, shape=[1] * 9)))
    with pytest.raises(DecodeError, match="more than 8 dims"):
        encode_tensor(CompressedTensor([1] * 9, "F32", 16, b"\x01", np.ones(1, "<f4").tobytes()))


def test_missing_keys_and_other_shapes_of_message():
    value = plain(GOOD)
    del value["scales"]
    for data in (encode(value), encode([1, 2]), encode(None), b"", b"\xc1", b"\x81\xa1t"):
        with pytest.raises(DecodeError):
            decode_tensor(data)


def test_limits_bound_the_message_before_it_is_read():
    numel = 1000
    message = CompressedTensor([numel], "F32", 16, bytes(numel), np.ones(63, "<f4").tobytes())
    data = encode_tensor(message)
    assert decode_tensor(data, tensor_limits(numel)) == message
    with pytest.raises(TooLarge):
        decode_tensor(data, tensor_limits(numel - 1))
    limits = tensor_limits(10)
    assert limits.max_bytes < 1200
    with pytest.raises(TooLarge):
        decode_tensor(b"\x00" * (TENSOR_LIMITS.max_bytes + 1))
    with pytest.raises(ValueError, match="max_numel"):
        tensor_limits(-1)
    # a small message claiming a huge byte string is refused by the codec's bin bound
    header = b"\x87\xa1t\xb1compressed_tensor\xa1v\x01\xa5codes\xc6\xff\xff\xff\xff"
    with pytest.raises((TooLarge, DecodeError)):
        decode_tensor(header, limits)


def test_encoding_checks_the_same_rules():
    with pytest.raises(DecodeError, match="must hold prod"):
        encode_tensor(CompressedTensor([3], "F32", 16, bytes(2), np.ones(1, "<f4").tobytes()))
    with pytest.raises(DecodeError, match="every scale must be a finite number"):
        encode_tensor(
            CompressedTensor([3], "F32", 16, bytes(3), np.array([math.nan], "<f4").tobytes())
        )


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_protocol_errors(data):
    with contextlib.suppress(ProtocolError):
        decode_tensor(data, tensor_limits(64))


@FAST
@given(message=messages(max_numel=64), flips=st.lists(st.integers(0, 10**6), max_size=4))
def test_mutated_messages_raise_only_protocol_errors(message, flips):
    data = bytearray(encode_tensor(message))
    for flip in flips:
        data[flip % len(data)] ^= 1 << (flip % 8)
    try:
        decoded = decode_tensor(bytes(data), tensor_limits(64))
    except ProtocolError:
        return
    decoded.check("again")  # whatever decodes is a valid message
    decoded.check_values("again")


@FAST
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=8)
        | st.binary(max_size=40),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.sampled_from(sorted(plain(GOOD))), children, max_size=7)
        ),
        max_leaves=12,
    )
)
def test_wrongly_typed_fields_raise_only_protocol_errors(value):
    candidate = plain(GOOD)
    if isinstance(value, dict):
        candidate.update(value)
    else:
        candidate["shape"] = value
    try:
        data = msgpack.packb(candidate, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return
    with contextlib.suppress(ProtocolError):
        decode_tensor(data)


@pytest.mark.process
def test_protocol_does_not_import_torch():
    code = "import sys, protocol.tensors; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --- training.ops.wire: tensors to messages and back -----------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [MIN_BLOCK_SIZE, 256, MAX_BLOCK_SIZE])
@pytest.mark.parametrize("bits", [8, 4])
def test_deltas_round_trip_within_the_bound(dtype, block_size, bits):
    gen = torch.Generator().manual_seed(block_size)
    x = (torch.randn(37, 91, generator=gen) * 0.01).to(dtype)
    data = ops.encode_delta(x, block_size, bits)
    nblocks = -(-x.numel() // block_size)
    # ~1/4 of float32 (bits 8), ~1/8 (bits 4)
    assert len(data) <= -(-x.numel() * bits // 8) + 4 * nblocks + 120
    q = ops.decode_delta(data, max_numel=x.numel())
    assert (q.shape, q.dtype, q.block_size) == (x.shape, dtype, block_size)
    expected = ops.quantize_blockwise(x, block_size, bits)
    assert torch.equal(q.codes, expected.codes) and torch.equal(q.scales, expected.scales)
    levels = (1 << (bits - 1)) - 1
    assert int(q.codes.abs().max()) == levels  # each block's absmax takes the top code
    y = ops.dequantize_blockwise(q)
    absmax = torch.repeat_interleave(q.scales * levels, block_size)[: x.numel()].view(x.shape)
    half_ulp = {torch.float32: 0, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    step = absmax / (2 * levels)
    bound = step * (1 + 1e-4) + half_ulp * (x.float().abs() + step) + 2**-25
    assert ((x.float() - y.float()).abs() <= bound).all()


def test_a_delta_holding_nan_cannot_be_sent():
    x = torch.randn(100)
    x[42] = math.nan
    with pytest.raises(ValueError, match="NaN or Inf in 1 of 1 blocks"):
        ops.encode_delta(x)


def test_four_bit_codes_need_a_four_bit_quantizer():
    q = ops.quantize_blockwise(torch.randn(100))
    with pytest.raises(ValueError, match="4-bit codes must be -7..7; quantize with bits=4"):
        ops.to_wire(q, bits=4)
    with pytest.raises(ValueError, match="bits must be 8 or 4"):
        ops.quantize_blockwise(torch.randn(100), bits=2)


def test_decode_delta_limits_and_devices():
    data = ops.encode_delta(torch.randn(1000))
    with pytest.raises(TooLarge):
        ops.decode_delta(data, max_numel=999)
    q = ops.decode_delta(data, limits=tensor_limits(1000), device="cpu")
    assert q.device.type == "cpu" and q.codes.is_contiguous()
    message = ops.to_wire(q)
    assert ops.from_wire(message).shape == (1000,)
    before = q.codes[0].item()
    q.codes[0] = before + 1  # decoded tensors own their memory (not views of the bytes)
    assert ops.decode_delta(data).codes[0].item() == before
    with pytest.raises(DecodeError):
        ops.decode_delta(data[:-1])


def test_empty_and_scalar_deltas():
    for x in (torch.zeros(0, 4), torch.tensor(2.5)):
        q = ops.decode_delta(ops.encode_delta(x))
        y = ops.dequantize_blockwise(q)
        assert y.shape == x.shape and torch.equal(y, x)
