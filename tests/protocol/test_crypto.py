"""Sealed boxes between nodes and the blob stream cipher: round trips and every way
a ciphertext can be wrong (other recipient, flipped bit, reordered or cut short)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from protocol import (
    DecryptError,
    ProtocolError,
    StreamDecryptor,
    StreamEncryptor,
    new_job_key,
    open_from,
    seal_to,
)
from protocol.crypto import BOX_OVERHEAD, STREAM_ABYTES, STREAM_HEADER_BYTES


def _pub(key: SigningKey) -> bytes:
    return bytes(key.verify_key)


def _flip(data: bytes, index: int) -> bytes:
    out = bytearray(data)
    out[index] ^= 0x01
    return bytes(out)


# -- sealed boxes ------------------------------------------------------------------------


def test_seal_round_trip() -> None:
    owner, worker = SigningKey.generate(), SigningKey.generate()
    package = b"job spec, grant and job key" * 100
    box = seal_to(_pub(worker), owner, package)
    assert len(box) == len(package) + BOX_OVERHEAD
    assert package not in box
    assert open_from(_pub(owner), worker, box) == package


def test_two_seals_of_the_same_plaintext_differ() -> None:
    owner, worker = SigningKey.generate(), SigningKey.generate()
    assert seal_to(_pub(worker), owner, b"x") != seal_to(_pub(worker), owner, b"x")


def test_a_package_sealed_to_another_node_cannot_be_opened() -> None:
    owner, worker, other = (SigningKey.generate() for _ in range(3))
    box = seal_to(_pub(worker), owner, b"for the worker only")
    with pytest.raises(DecryptError) as info:
        open_from(_pub(owner), other, box)
    assert info.value.reason == "undecryptable"
    assert isinstance(info.value, ProtocolError)


def test_a_box_from_another_sender_does_not_open() -> None:
    owner, worker, impostor = (SigningKey.generate() for _ in range(3))
    box = seal_to(_pub(worker), impostor, b"pretending to be the owner")
    with pytest.raises(DecryptError):
        open_from(_pub(owner), worker, box)


def test_one_flipped_bit_anywhere_is_refused() -> None:
    owner, worker = SigningKey.generate(), SigningKey.generate()
    box = seal_to(_pub(worker), owner, b"some package bytes")
    for index in (0, 23, 24, 30, len(box) - 1):  # nonce, MAC, ciphertext
        with pytest.raises(DecryptError):
            open_from(_pub(owner), worker, _flip(box, index))


def test_short_and_garbage_boxes_are_refused() -> None:
    owner, worker = SigningKey.generate(), SigningKey.generate()
    for junk in (b"", b"x" * (BOX_OVERHEAD - 1), b"\x00" * 100):
        with pytest.raises(DecryptError):
            open_from(_pub(owner), worker, junk)


def test_unusable_public_keys() -> None:
    owner, worker = SigningKey.generate(), SigningKey.generate()
    box = seal_to(_pub(worker), owner, b"x")
    for bad in (b"", b"\x01" + b"\x00" * 31, b"\x00" * 31):
        with pytest.raises(DecryptError):
            open_from(bad, worker, box)
        with pytest.raises(ValueError, match="not a usable|32 bytes"):
            seal_to(bad, owner, b"x")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_open_from_arbitrary_bytes_raises_only_decrypt_error(data: bytes) -> None:
    owner, worker = _FUZZ_KEYS
    with pytest.raises(DecryptError):
        open_from(_pub(owner), worker, data)


_FUZZ_KEYS = (SigningKey(b"\x01" * 32), SigningKey(b"\x02" * 32))


# -- secretstream ---------------------------------------------------------------------------


def _encrypt(key: bytes, chunks: list[bytes], ad: bytes | None = None) -> tuple[bytes, list[bytes]]:
    enc = StreamEncryptor(key)
    out = [enc.push(c, final=i == len(chunks) - 1, ad=ad) for i, c in enumerate(chunks)]
    return enc.header, out


def test_stream_round_trip() -> None:
    key = new_job_key()
    chunks = [b"a" * 1000, b"", b"b" * 70000, b"last"]
    header, sealed = _encrypt(key, chunks, ad=b"blob id")
    assert len(header) == STREAM_HEADER_BYTES
    assert [len(c) for c in sealed] == [len(c) + STREAM_ABYTES for c in chunks]
    dec = StreamDecryptor(key, header)
    assert [dec.pull(c, ad=b"blob id") for c in sealed] == chunks
    assert dec.finished
    dec.finish()


def test_new_job_keys_are_fresh_32_byte_keys() -> None:
    keys = {new_job_key() for _ in range(10)}
    assert len(keys) == 10 and all(len(k) == 32 for k in keys)


def test_truncated_stream_is_detected() -> None:
    key = new_job_key()
    header, sealed = _encrypt(key, [b"1" * 100, b"2" * 100, b"3" * 100])
    dec = StreamDecryptor(key, header)
    for c in sealed[:-1]:  # every chunk but the FINAL one decrypts fine ...
        dec.pull(c)
    assert not dec.finished
    with pytest.raises(DecryptError, match="truncated"):  # ... but the stream is incomplete
        dec.finish()


def test_dropped_reordered_or_flipped_chunks_are_refused() -> None:
    key = new_job_key()
    header, sealed = _encrypt(key, [b"1" * 100, b"2" * 100, b"3" * 100])
    for bad in (
        [sealed[1]],  # the first chunk dropped
        [sealed[1], sealed[0]],  # reordered
        [_flip(sealed[0], 5)],  # one bit flipped
        [sealed[0][:-1]],  # cut inside a chunk
    ):
        dec = StreamDecryptor(key, header)
        with pytest.raises(DecryptError):
            for c in bad:
                dec.pull(c)


def test_wrong_key_header_or_ad_is_refused() -> None:
    key = new_job_key()
    header, sealed = _encrypt(key, [b"data"], ad=b"blob A")
    with pytest.raises(DecryptError):
        StreamDecryptor(new_job_key(), header).pull(sealed[0], ad=b"blob A")
    with pytest.raises(DecryptError):
        StreamDecryptor(key, _flip(header, 0)).pull(sealed[0], ad=b"blob A")
    with pytest.raises(DecryptError):  # a stream for blob A is not a stream for blob B
        StreamDecryptor(key, header).pull(sealed[0], ad=b"blob B")
    with pytest.raises(DecryptError):
        StreamDecryptor(key, header[:-1])


def test_nothing_after_the_final_chunk() -> None:
    key = new_job_key()
    enc = StreamEncryptor(key)
    first = enc.push(b"only", final=True)
    with pytest.raises(ValueError):
        enc.push(b"more")
    dec = StreamDecryptor(key, enc.header)
    dec.pull(first)
    with pytest.raises(DecryptError, match="after the final"):
        dec.pull(first)
