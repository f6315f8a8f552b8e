"""Blob grants and requests (rules, limits, hostile bytes) and the content-addressed
blob store (nothing is stored under a name its bytes do not hash to)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

from node.work.blobs import BlobNotFound, BlobStore, BlobStoreError
from node.work.blobs import store as blobs
from node.work.blobs.store import BadBlobId, BlobHashMismatch, BlobTooLarge
from protocol import (
    GRANT_LIMITS,
    REQUEST_LIMITS,
    BlobGrant,
    BlobRequest,
    DecodeError,
    ProtocolError,
    TooLarge,
    encode,
    open_envelope,
    peer_id_from_public_key,
    seal,
)
from protocol.blobs import MAX_BLOB_BYTES, MAX_GRANT_BLOBS, MAX_ID_LEN
from protocol.envelope import signing_bytes
from protocol.ids import ID_MAX_LEN, ID_MIN_LEN

KEY = SigningKey(hashlib.sha256(b"meshminer blob test key").digest())
PEER = peer_id_from_public_key(bytes(KEY.verify_key))
SHA = hashlib.sha256(b"a blob").hexdigest()


def grant(**changes) -> BlobGrant:
    g = BlobGrant(
        job_id="026ab639c21df8aa",
        unit_id="d1b608530bb248d3",
        owner=PEER,
        grantee=PEER,
        blobs=[SHA],
        max_bytes=1024,
        expires_at=1_700_000_000.0,
        data_port=4002,
    )
    return dataclasses.replace(g, **changes)


def request(**changes) -> BlobRequest:
    r = BlobRequest(
        grant=seal(grant(), KEY), sha256=SHA, timestamp=1_700_000_000.0, nonce=b"n" * 16
    )
    return dataclasses.replace(r, **changes)


# -- messages ------------------------------------------------------------------------------

shas = st.binary(min_size=32, max_size=32).map(lambda b: b.hex())
# ASCII: check() counts characters, the codec's max_str_len counts UTF-8 bytes
ids = st.text("0123456789abcdef", min_size=ID_MIN_LEN, max_size=ID_MAX_LEN)
peers = st.binary(min_size=32, max_size=32).map(
    lambda seed: peer_id_from_public_key(bytes(SigningKey(seed).verify_key))
)
#: valid grants (sizes bounded by the real limits, not by the strategy)
blob_grants = st.builds(
    BlobGrant,
    job_id=ids,
    unit_id=ids,
    owner=peers,
    grantee=peers,
    blobs=st.lists(shas, min_size=1, max_size=MAX_GRANT_BLOBS),
    max_bytes=st.integers(min_value=0, max_value=MAX_BLOB_BYTES),
    expires_at=st.floats(min_value=0, max_value=1e12, exclude_min=True),
    data_port=st.integers(min_value=0, max_value=65535),
)
blob_requests = st.builds(
    BlobRequest,
    grant=st.binary(min_size=1, max_size=GRANT_LIMITS.max_bytes),
    sha256=shas,
    timestamp=st.floats(min_value=0, max_value=1e12, exclude_min=True),
    nonce=st.binary(min_size=16, max_size=32),
)


@settings(max_examples=50, deadline=None)
@given(g=blob_grants)
def test_grant_round_trip(g: BlobGrant) -> None:
    signed = open_envelope(seal(g, KEY), BlobGrant, limits=GRANT_LIMITS)
    assert signed.message == g and signed.signer == PEER


@settings(max_examples=50, deadline=None)
@given(r=blob_requests)
def test_request_round_trip(r: BlobRequest) -> None:
    signed = open_envelope(seal(r, KEY), BlobRequest, limits=REQUEST_LIMITS)
    assert signed.message == r


def test_the_largest_valid_grant_and_request_fit_their_limits() -> None:
    big = grant(
        job_id="f" * ID_MAX_LEN,
        unit_id="e" * ID_MAX_LEN,
        blobs=[hashlib.sha256(bytes([i % 256, i // 256])).hexdigest() for i in range(256)],
        max_bytes=MAX_BLOB_BYTES,
        expires_at=1e12 + 0.5,
        data_port=65535,
    )
    envelope = seal(big, KEY)
    open_envelope(envelope, BlobGrant, limits=GRANT_LIMITS)
    req = request(grant=envelope, nonce=b"n" * 32, timestamp=1e12 + 0.5)
    open_envelope(seal(req, KEY), BlobRequest, limits=REQUEST_LIMITS)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"blobs": []}, "blobs"),
        ({"blobs": [SHA.upper()]}, "blobs[0]"),
        ({"blobs": [SHA[:-1]]}, "blobs[0]"),
        ({"blobs": ["../" + SHA[3:]]}, "blobs[0]"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"max_bytes": MAX_BLOB_BYTES + 1}, "max_bytes"),
        ({"expires_at": float("nan")}, "expires_at"),
        ({"expires_at": 0.0}, "expires_at"),
        ({"data_port": 65536}, "data_port"),
    ],
)
def test_grant_rules_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(DecodeError, match=re.escape(f"BlobGrant.{field} ")):
        open_envelope(seal(grant(**changes), KEY), BlobGrant, limits=GRANT_LIMITS)


@pytest.mark.parametrize(
    "changes", [{"grantee": "x" * (MAX_ID_LEN + 1)}, {"blobs": [SHA] * (MAX_GRANT_BLOBS + 1)}]
)
def test_grant_limits_bind_before_the_rules(changes: dict) -> None:
    with pytest.raises(TooLarge):
        open_envelope(seal(grant(**changes), KEY), BlobGrant, limits=GRANT_LIMITS)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"grant": b""}, "grant"),
        ({"sha256": "0" * 63}, "sha256"),
        ({"timestamp": float("inf")}, "timestamp"),
        ({"nonce": b"short"}, "nonce"),
        ({"nonce": b"n" * 33}, "nonce"),
    ],
)
def test_request_rules_name_the_field(changes: dict, field: str) -> None:
    with pytest.raises(DecodeError, match=re.escape(f"BlobRequest.{field} ")):
        open_envelope(seal(request(**changes), KEY), BlobRequest, limits=REQUEST_LIMITS)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    for cls, limits in ((BlobGrant, GRANT_LIMITS), (BlobRequest, REQUEST_LIMITS)):
        with pytest.raises(ProtocolError):
            open_envelope(data, cls, limits=limits)


PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=70)
    | st.binary(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=12,
)
GRANT_FIELDS = [f.name for f in dataclasses.fields(BlobGrant)]
REQUEST_FIELDS = [f.name for f in dataclasses.fields(BlobRequest)]


@settings(max_examples=300, deadline=None)
@given(
    cls=st.sampled_from([BlobGrant, BlobRequest]),
    payload=st.dictionaries(
        st.sampled_from(GRANT_FIELDS + REQUEST_FIELDS) | st.text(max_size=8), PLAIN, max_size=9
    ),
)
def test_correctly_signed_nonsense_raises_only_protocol_errors(cls: type, payload: dict) -> None:
    """A valid signature over a payload of the right keys but wrong values reaches the
    schema and `check()`; it must still end in a ProtocolError, never anything else."""
    limits = GRANT_LIMITS if cls is BlobGrant else REQUEST_LIMITS
    body = encode(payload)
    sig = KEY.sign(signing_bytes(cls.TYPE, cls.VERSION, body)).signature
    envelope = encode(
        {"t": cls.TYPE, "v": cls.VERSION, "p": body, "k": bytes(KEY.verify_key), "s": sig}
    )
    with contextlib.suppress(ProtocolError):
        open_envelope(envelope, cls, limits=limits)


def test_a_grant_is_not_a_request() -> None:
    with pytest.raises(DecodeError, match="expected a blob_request"):
        open_envelope(seal(grant(), KEY), BlobRequest, limits=REQUEST_LIMITS)


# -- the blob store ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path)


def _stored_files(store: BlobStore) -> list[Path]:
    """Every file under the store, temporary ones included."""
    return sorted(p for p in store.root.rglob("*") if p.is_file())


def test_put_and_read_back(store: BlobStore) -> None:
    data = os.urandom(3 * 1024 * 1024 + 5)
    sha = store.put_bytes(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert store.has(sha) and store.size(sha) == len(data)
    assert store.path(sha) == store.root / sha[:2] / sha
    with store.open(sha) as f:
        assert f.read() == data
    assert _stored_files(store) == [store.path(sha)]
    assert store.put_bytes(data) == sha  # storing again is harmless


def test_a_blob_stored_again_keeps_its_file(store: BlobStore) -> None:
    """Two fetches of one blob that land one after the other leave the first file in
    place: a sandboxed runner allowed that inode can still open the path."""
    data = os.urandom(4096)
    sha = store.put_bytes(data)
    first = store.path(sha).stat().st_ino
    with store.writer(sha, len(data)) as w:
        w.write(data)
    assert store.path(sha).stat().st_ino == first
    assert _stored_files(store) == [store.path(sha)]  # no temporary file left


def test_blobs_are_private_to_the_node(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir(mode=0o755)  # left open by an older version
    store = BlobStore(tmp_path)
    sha = store.put_bytes(b"a job's private data")
    incoming = store.begin(None, 10)
    assert store.root.stat().st_mode & 0o777 == 0o700
    assert store.path(sha).parent.stat().st_mode & 0o777 == 0o700
    assert store.path(sha).stat().st_mode & 0o777 == 0o600
    assert incoming._tmp.stat().st_mode & 0o777 == 0o600
    incoming.discard()


def test_empty_blob(store: BlobStore) -> None:
    sha = store.put_bytes(b"")
    assert sha == hashlib.sha256(b"").hexdigest() and store.size(sha) == 0


def test_put_file_copies_and_hashes(store: BlobStore, tmp_path: Path) -> None:
    source = tmp_path / "weights.pt"  # a pickle is just bytes to the store
    source.write_bytes(b"\x80\x04pickle-ish" * 100_000)
    sha = store.put_file(source)
    assert sha == hashlib.sha256(source.read_bytes()).hexdigest()
    assert store.path(sha).read_bytes() == source.read_bytes()
    assert source.exists()


def test_streaming_writer(store: BlobStore) -> None:
    data = os.urandom(100_000)
    sha = hashlib.sha256(data).hexdigest()
    with store.writer(sha, len(data)) as w:
        for i in range(0, len(data), 7_000):
            w.write(data[i : i + 7_000])
        assert not store.has(sha)  # nothing visible until the writer is closed
    assert w.sha256 == sha and store.path(sha).read_bytes() == data


def test_durable_writer_with_early_writeback(
    store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blobs, "WRITEBACK_EVERY", 1024 * 1024)
    data = os.urandom(3 * 1024 * 1024 + 1)
    sha = hashlib.sha256(data).hexdigest()
    with store.writer(sha, len(data)) as w:
        for i in range(0, len(data), 300_000):
            w.write(data[i : i + 300_000])
    assert store.path(sha).read_bytes() == data


def test_hash_mismatch_stores_nothing(store: BlobStore) -> None:
    sha = hashlib.sha256(b"what was promised").hexdigest()
    with pytest.raises(BlobHashMismatch, match=f"expected {sha}"), store.writer(sha, 100) as w:
        w.write(b"what was sent")
    assert not store.has(sha)
    assert _stored_files(store) == []


def test_oversize_stores_nothing(store: BlobStore) -> None:
    data = b"x" * 101
    sha = hashlib.sha256(data).hexdigest()
    with pytest.raises(BlobTooLarge, match="limit of 100 bytes"), store.writer(sha, 100) as w:
        w.write(data[:60])
        w.write(data[60:])
    assert not store.has(sha)
    assert _stored_files(store) == []


def test_a_writer_that_failed_cannot_be_committed(store: BlobStore) -> None:
    writer = store.begin(hashlib.sha256(b"").hexdigest(), 1)
    with pytest.raises(BlobTooLarge):
        writer.write(b"xx")
    with pytest.raises(BlobStoreError):  # even though the bytes taken so far hash right
        writer.commit()
    writer.discard()
    assert _stored_files(store) == []


def test_an_error_inside_the_writer_stores_nothing(store: BlobStore) -> None:
    sha = hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(RuntimeError), store.writer(sha, 10) as w:
        w.write(b"abc")
        raise RuntimeError("connection lost")
    assert _stored_files(store) == []


def test_existing_blob_survives_a_failed_rewrite(store: BlobStore) -> None:
    sha = store.put_bytes(b"original")
    with pytest.raises(BlobHashMismatch), store.writer(sha, 100) as w:
        w.write(b"forgery!")
    assert store.path(sha).read_bytes() == b"original"


@pytest.mark.parametrize("bad", ["", "ab", SHA.upper(), "../" + SHA[3:], SHA + "0", "/etc/passwd"])
def test_bad_ids_never_become_paths(store: BlobStore, bad: str) -> None:
    for op in (store.has, store.path, store.size, store.open):
        with pytest.raises(BadBlobId):
            op(bad)
    with pytest.raises(BadBlobId):
        store.writer(bad, 10).__enter__()


def test_missing_blob(store: BlobStore) -> None:
    assert not store.has(SHA)
    for op in (store.path, store.size, store.open):
        with pytest.raises(BlobNotFound, match="not stored"):
            op(SHA)


def test_a_linked_file_is_the_same_file_under_its_hash_and_a_wrong_hash_is_refused(
    tmp_path: Path,
) -> None:
    """A worker keeps a training state for its owner as a second name of the runner's
    file (no copy); the store still refuses a file that is not what it claims."""
    store = BlobStore(tmp_path / "node")
    state = tmp_path / "checkpoint-00000004.safetensors"
    state.write_bytes(b"state" * 1000)
    sha = hashlib.sha256(state.read_bytes()).hexdigest()
    store.link_file(state, sha)
    assert store.path(sha).read_bytes() == state.read_bytes()
    assert os.stat(store.path(sha)).st_ino == os.stat(state).st_ino
    store.link_file(state, sha)  # already there: nothing changes
    state.unlink()  # the runner's name goes; the store's stays
    assert store.has(sha)
    other = tmp_path / "other"
    other.write_bytes(b"not it")
    with pytest.raises(BlobHashMismatch):
        store.link_file(other, "0" * 64)
    assert not store.has("0" * 64)
