"""Tests for protocol.envelope, protocol.schema, protocol.capacity and protocol.peer_id:
the signed envelope, the strict dataclass decoder, CapacityAd's rules and peer ids."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import pkgutil
from typing import ClassVar

import base58
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey

import protocol
from protocol import (
    AD_LIMITS,
    CapacityAd,
    DecodeError,
    GpuInfo,
    Policy,
    ProtocolError,
    SignatureError,
    SignerMismatch,
    TooLarge,
    decode,
    encode,
    open_envelope,
    peer_id_from_public_key,
    public_key_from_peer_id,
    seal,
)
from protocol.blobs import (
    GRANT_LIMITS,
    NONCE_MAX_BYTES,
    NONCE_MIN_BYTES,
    REQUEST_LIMITS,
    BlobGrant,
    BlobRequest,
)
from protocol.directory import (
    CREDIT_LIMITS,
    DIRECTORY_LIMITS,
    GPU_WISHES,
    MAX_CREDIT_ROWS,
    MAX_WANT,
    CreditQuery,
    CreditReply,
    CreditRow,
    DirectoryQuery,
    DirectoryReply,
)
from protocol.envelope import SIGNING_DOMAIN, signing_bytes
from protocol.evidence import EVIDENCE_LIMITS, Evidence
from protocol.receipts import CoSignedReceipt
from protocol.rounds import MAX_ROUND, MAX_SLOT, RoundDelta, RoundShare, RoundUpdate
from protocol.schema import to_plain
from protocol.tensors import CompressedTensor
from protocol.work import (
    PHASES,
    WORK_LIMITS,
    OfferReply,
    Progress,
    Receipt,
    ReceiptReply,
    Result,
    WorkOffer,
    WorkPackage,
)

KEY_A = SigningKey(hashlib.sha256(b"meshminer test key A").digest())
KEY_B = SigningKey(hashlib.sha256(b"meshminer test key B").digest())
PEER_A = peer_id_from_public_key(bytes(KEY_A.verify_key))
PEER_B = peer_id_from_public_key(bytes(KEY_B.verify_key))

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
PLAIN = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats() | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


def make_ad(**changes) -> CapacityAd:
    ad = CapacityAd(
        peer_id=PEER_A,
        addrs=["/ip4/203.0.113.7/tcp/4001", "/ip6/::1/udp/4001/quic-v1"],
        gpus=[
            GpuInfo(
                name="NVIDIA H100 80GB HBM3",
                memory_total_mb=81559,
                memory_free_mb=80000,
                compute_capability="9.0",
            )
        ],
        tflops=51.2,
        torch_version="2.4.1",
        cuda_version="12.4",
        policy=Policy(accepting=True, load_limit_pct=80, max_job_hours=6.0),
        load_pct=12,
        seq=7,
        timestamp=1_700_000_000.25,
        version="0.1.0",
    )
    return dataclasses.replace(ad, **changes)


def sign_raw(
    payload: bytes,
    key: SigningKey = KEY_A,
    type_: str = CapacityAd.TYPE,
    version: int = CapacityAd.VERSION,
) -> bytes:
    """An envelope around exactly `payload`, correctly signed by `key`."""
    sig = key.sign(signing_bytes(type_, version, payload)).signature
    return encode({"t": type_, "v": version, "p": payload, "k": bytes(key.verify_key), "s": sig})


def sign_plain(plain, key: SigningKey = KEY_A) -> bytes:
    return sign_raw(encode(plain), key)


def open_ad(data: bytes, **kwargs):
    return open_envelope(data, CapacityAd, limits=AD_LIMITS, **kwargs)


# --- strategies for valid messages ----------------------------------------------------
# Sizes are bounded so the worst case still fits AD_LIMITS (payload <= max_bin_len).

FINITE_NONNEG = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def gpu_infos(draw) -> GpuInfo:
    total = draw(st.integers(min_value=0, max_value=2**40))
    return GpuInfo(
        name=draw(st.text(max_size=20)),
        kind=draw(st.sampled_from(["cuda", "cpu"])),
        memory_total_mb=total,
        memory_free_mb=draw(st.integers(min_value=0, max_value=total)),
        compute_capability=draw(st.text(max_size=6)),
    )


policies = st.builds(
    Policy,
    accepting=st.booleans(),
    load_limit_pct=st.integers(min_value=0, max_value=100),
    max_job_hours=st.floats(min_value=0, max_value=1e6, exclude_min=True),
    max_gpu_memory_share=st.floats(min_value=0, max_value=1, exclude_min=True),
)

capacity_ads = st.builds(
    CapacityAd,
    peer_id=st.text(min_size=1, max_size=40),
    addrs=st.lists(st.text(max_size=30), max_size=3),
    gpus=st.lists(gpu_infos(), max_size=3),
    tflops=FINITE_NONNEG,
    torch_version=st.text(max_size=12),
    cuda_version=st.text(max_size=12),
    policy=policies,
    load_pct=st.integers(min_value=0, max_value=100),
    seq=st.integers(min_value=0, max_value=2**64 - 1),
    timestamp=st.floats(min_value=0, max_value=1e11, exclude_min=True),
    version=st.text(max_size=12),
)

ids = st.text(alphabet="0123456789abcdef", min_size=16, max_size=32)
peers = st.binary(min_size=32, max_size=32).map(
    lambda seed: peer_id_from_public_key(bytes(SigningKey(seed).verify_key))
)
shas = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
small_bytes = st.binary(max_size=256)
times = st.floats(min_value=1.0, max_value=1e11)
metrics = st.dictionaries(st.text(min_size=1, max_size=16), st.floats(allow_nan=False), max_size=4)
round_shares = st.builds(
    RoundShare,
    round=st.integers(0, MAX_ROUND - 1),
    slot=st.integers(0, MAX_SLOT - 1),
    weights_sha256=shas,
) | st.builds(  # weights that also come as an update to the round before's
    RoundShare,
    round=st.integers(1, MAX_ROUND - 1),
    slot=st.integers(0, MAX_SLOT - 1),
    weights_sha256=shas,
    base_sha256=shas,
    update_sha256=shas,
)


@st.composite
def work_packages(draw: st.DrawFn) -> WorkPackage:
    share = draw(st.none() | round_shares)
    blobs = draw(st.lists(shas, max_size=3))
    if share is not None:
        blobs.append(share.weights_sha256)
        blobs += [share.update_sha256] if share.update_sha256 else []
    return WorkPackage(
        job_id=draw(ids),
        unit_id=draw(ids),
        spec=draw(small_bytes),
        blobs=blobs,
        blob_grant=draw(small_bytes),
        job_key=draw(st.binary(min_size=32, max_size=32)),
        max_hours=draw(st.floats(min_value=0.01, max_value=8760)),
        lease_s=draw(st.floats(1, 3600)),
        round_share=share,
    )


work_offers = st.builds(
    WorkOffer, job_id=ids, unit_id=ids, worker=peers, sealed=small_bytes, created_at=times
)
offer_replies = st.builds(
    OfferReply,
    job_id=ids,
    unit_id=ids,
    accepted=st.booleans(),
    reason=st.text(max_size=100),
    transient=st.booleans(),
)
directory_queries = st.builds(
    DirectoryQuery,
    want=st.integers(1, MAX_WANT),
    gpu=st.sampled_from(GPU_WISHES),
    min_gpu_memory_gb=st.floats(0, 10**6),
    max_hours=st.floats(0.001, 8760),
    timestamp=times,
    seed=st.binary(max_size=32),
)
directory_replies = st.builds(
    DirectoryReply,
    registered=st.integers(0, 2**31),
    ttl_s=st.floats(0.1, 86400),
    ads=st.lists(small_bytes, max_size=4),
)
labels = st.text(alphabet="abcdefghijklmnopqrstuvwxyzAZ0123456789 .,+#@()-", max_size=40).map(
    str.strip
)
credit_queries = st.builds(CreditQuery, want=st.integers(1, MAX_CREDIT_ROWS), timestamp=times)
credit_rows = st.builds(
    CreditRow,
    peer_id=peers,
    credit=st.floats(0, 1e12),
    rac=st.floats(0, 1e12),
    units=st.integers(0, 2**40),
    conflicts=st.integers(0, 10**6),
    name=labels,
    team=labels,
)
credit_replies = st.builds(
    CreditReply,
    receipts=st.integers(0, 2**40),
    rows=st.lists(credit_rows, max_size=4, unique_by=lambda row: row.peer_id),
    timestamp=times,
)
finite = st.floats(allow_nan=False, allow_infinity=False)
progresses = st.integers(0, 10_000).flatmap(
    lambda total: st.integers(0, total).flatmap(
        lambda step: st.builds(
            Progress,
            job_id=ids,
            unit_id=ids,
            phase=st.sampled_from(PHASES),
            step=st.just(step),
            total_steps=st.just(total),
            loss=st.none() | finite,
            samples_per_s=st.floats(0, 1e9),
            samples=st.integers(0, 2**40),
            timestamp=times,
            val_loss=st.none() | finite,
            val_step=st.integers(-1, step),
            val_accuracy=st.none() | finite,
        )
    )
)
results = st.builds(
    Result,
    job_id=ids,
    unit_id=ids,
    ok=st.just(True),
    error=st.text(max_size=50),
    weights_sha256=shas,
    weights_size=st.integers(0, 2**40),
    weights_grant=small_bytes,
    metrics=metrics,
    steps=st.integers(0, 2**31),
    samples=st.integers(0, 2**40),
    wall_time_s=st.floats(0, 1e6),
    device=st.text(max_size=10),
    retryable=st.booleans(),
    checkpoints=st.lists(shas, max_size=5),
)
evidences = st.builds(
    Evidence,
    job_id=ids,
    unit_id=ids,
    owner=peers,
    worker=peers,
    result=small_bytes,
    index=st.integers(-1, 1000),
    start_step=st.integers(0, 100),
    end_step=st.integers(100, 2**31),
    replayed_sha256=shas,
    reason=st.text(max_size=50),
    created_at=times,
).filter(lambda e: e.owner != e.worker)
receipts = st.builds(
    Receipt,
    job_id=ids,
    unit_id=ids,
    owner=peers,
    worker=peers,
    weights_sha256=shas,
    steps=st.integers(0, 2**31),
    samples=st.integers(0, 2**40),
    metrics=metrics,
    issued_at=times,
)
receipt_replies = st.builds(
    ReceiptReply, accepted=st.booleans(), reason=st.text(max_size=50), receipt=small_bytes
)
blob_grants = st.builds(
    BlobGrant,
    job_id=ids,
    unit_id=ids,
    owner=peers,
    grantee=peers,
    blobs=st.lists(shas, min_size=1, max_size=3),
    max_bytes=st.integers(0, 2**30),
    expires_at=times,
    data_port=st.integers(0, 65535),
)
blob_requests = st.builds(
    BlobRequest,
    grant=st.binary(min_size=1, max_size=256),
    sha256=shas,
    timestamp=times,
    nonce=st.binary(min_size=NONCE_MIN_BYTES, max_size=NONCE_MAX_BYTES),
)

#: every message type on the wire, with a strategy of valid instances and its limits
MESSAGES = {
    CapacityAd: (capacity_ads, AD_LIMITS),
    WorkPackage: (work_packages(), WORK_LIMITS),
    WorkOffer: (work_offers, WORK_LIMITS),
    OfferReply: (offer_replies, WORK_LIMITS),
    DirectoryQuery: (directory_queries, DIRECTORY_LIMITS),
    DirectoryReply: (directory_replies, DIRECTORY_LIMITS),
    CreditQuery: (credit_queries, CREDIT_LIMITS),
    CreditReply: (credit_replies, CREDIT_LIMITS),
    Progress: (progresses, WORK_LIMITS),
    Result: (results, WORK_LIMITS),
    Receipt: (receipts, WORK_LIMITS),
    ReceiptReply: (receipt_replies, WORK_LIMITS),
    BlobGrant: (blob_grants, GRANT_LIMITS),
    BlobRequest: (blob_requests, REQUEST_LIMITS),
    Evidence: (evidences, EVIDENCE_LIMITS),
}

signing_keys = st.binary(min_size=32, max_size=32).map(SigningKey)


def _message_types() -> set[type]:
    found = set()
    for info in pkgutil.iter_modules(protocol.__path__):
        module = importlib.import_module(f"protocol.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and isinstance(getattr(obj, "TYPE", None), str)
            ):
                found.add(obj)
    return found


#: message types with a wire form of their own (not a signed envelope), tested elsewhere
OWN_WIRE_FORM = {
    CoSignedReceipt,  # tests/ledger/test_ledger.py, tests/ledger/test_audit.py
    CompressedTensor,  # tests/protocol/test_tensor_codec.py
    RoundDelta,  # tests/training/test_elastic.py
    RoundUpdate,  # tests/protocol/test_round_updates.py
}


def test_every_message_type_has_a_round_trip_strategy():
    assert _message_types() - OWN_WIRE_FORM == set(MESSAGES)


# --- round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(MESSAGES), ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data(), key=signing_keys)
def test_seal_open_round_trip(cls, data, key):
    strategy, limits = MESSAGES[cls]
    msg = data.draw(strategy)
    sealed = seal(msg, key)
    peer = peer_id_from_public_key(bytes(key.verify_key))

    opened = open_envelope(sealed, cls, limits=limits)
    assert opened.message == msg
    assert type(opened.message) is cls
    assert opened.signer == peer
    assert opened.signer_key == bytes(key.verify_key)
    assert opened.raw == sealed
    # sealing is deterministic (Ed25519 and the encoding both are)
    assert seal(opened.message, key) == sealed
    assert open_envelope(sealed, cls, expected_signer=peer, limits=limits).message == msg


def test_round_trip_keeps_types():
    ad = make_ad(tflops=50, timestamp=1_700_000_000)  # ints where floats are declared
    opened = open_ad(seal(ad, KEY_A), expected_signer=PEER_A)
    assert opened.message == ad
    assert type(opened.message.tflops) is float
    assert type(opened.message.timestamp) is float
    assert type(opened.message.gpus[0]) is GpuInfo
    assert type(opened.message.policy) is Policy
    assert opened.signer == PEER_A


def test_defaults_fill_missing_optional_fields():
    plain = to_plain(make_ad())
    del plain["version"]
    del plain["gpus"][0]["kind"]
    del plain["policy"]["max_gpu_memory_share"]
    msg = open_ad(sign_plain(plain)).message
    assert msg.version == ""
    assert msg.gpus[0].kind == "cuda"
    assert msg.policy.max_gpu_memory_share == 0.9


# --- fuzzing: only ProtocolError subclasses may escape ---------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_open_envelope_arbitrary_bytes(data):
    with pytest.raises(ProtocolError):
        open_ad(data)


@settings(max_examples=300, deadline=None)
@given(value=PLAIN)
def test_open_envelope_arbitrary_msgpack(value):
    with pytest.raises(ProtocolError) as info:
        open_ad(encode(value))
    # nothing here is envelope-shaped, so the outer check must catch it
    assert isinstance(info.value, DecodeError | TooLarge)


envelope_like = st.fixed_dictionaries(
    {
        "t": st.sampled_from([CapacityAd.TYPE]) | PLAIN,
        "v": st.sampled_from([CapacityAd.VERSION]) | PLAIN,
        "p": st.builds(encode, PLAIN) | st.binary(max_size=64) | PLAIN,
        "k": st.binary(min_size=32, max_size=32) | st.just(bytes(KEY_A.verify_key)) | PLAIN,
        "s": st.binary(min_size=64, max_size=64) | PLAIN,
    }
)


@settings(max_examples=300, deadline=None)
@given(value=envelope_like)
def test_open_envelope_arbitrary_unsigned_envelopes(value):
    with pytest.raises(ProtocolError):
        open_ad(encode(value))


@settings(max_examples=200, deadline=None)
@given(value=PLAIN)
def test_open_envelope_signed_arbitrary_payload(value):
    """A validly signed payload of any shape goes through the decoder; only
    ProtocolErrors may come out (and no random value is a CapacityAd)."""
    with pytest.raises(ProtocolError):
        open_ad(sign_plain(value))


AD_FIELDS = [f.name for f in dataclasses.fields(CapacityAd)]


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(AD_FIELDS), value=PLAIN)
def test_open_envelope_signed_ad_with_one_arbitrary_field(field, value):
    plain = to_plain(make_ad())
    plain[field] = value
    try:
        opened = open_ad(sign_plain(plain), expected_signer=PEER_A)
    except TooLarge:
        return
    except DecodeError as exc:
        assert f"CapacityAd.{field}" in str(exc)
    else:
        assert _matches(value, to_plain(opened.message)[field])


def _matches(sent, got) -> bool:
    """`got` (decoded, defaults filled in) agrees with everything `sent` said."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(
            k in got and _matches(v, got[k]) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return isinstance(got, list) and len(sent) == len(got) and all(map(_matches, sent, got))
    if (type(sent), type(got)) == (int, float):  # read as the nearest float, past 2**53 too
        return float(sent) == got
    return type(sent) is type(got) and sent == got


@settings(max_examples=100, deadline=None)
@given(field=st.text(max_size=10).filter(lambda s: s not in AD_FIELDS), value=PLAIN)
def test_open_envelope_signed_ad_with_unknown_field(field, value):
    plain = to_plain(make_ad())
    plain[field] = value
    with pytest.raises((DecodeError, TooLarge)) as info:
        open_ad(sign_plain(plain))
    if isinstance(info.value, DecodeError):
        assert "unknown field" in str(info.value)


# --- tampering ------------------------------------------------------------------------


@pytest.mark.parametrize("ad", [make_ad(), make_ad(gpus=[], addrs=[], version="", cuda_version="")])
def test_every_single_bit_flip_is_rejected(ad):
    sealed = seal(ad, KEY_A)
    assert open_ad(sealed, expected_signer=PEER_A).message == ad
    reasons = set()
    for bit in range(len(sealed) * 8):
        mangled = bytearray(sealed)
        mangled[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ProtocolError) as info:
            open_ad(bytes(mangled))
        reasons.add(type(info.value))
    # flips in the payload, key or signature must fail the signature check
    assert SignatureError in reasons
    assert DecodeError in reasons


@settings(max_examples=50, deadline=None)
@given(ad=capacity_ads, key=signing_keys, bit=st.integers(min_value=0))
def test_random_bit_flip_in_random_ad_is_rejected(ad, key, bit):
    mangled = bytearray(seal(ad, key))
    bit %= len(mangled) * 8
    mangled[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ProtocolError):
        open_ad(bytes(mangled))


def test_truncated_envelope_is_rejected():
    sealed = seal(make_ad(), KEY_A)
    for n in range(len(sealed)):
        with pytest.raises(DecodeError):
            open_ad(sealed[:n])


def _outer(sealed: bytes) -> dict:
    return decode(sealed, AD_LIMITS)


def test_payload_resigned_by_another_key_is_a_signer_mismatch():
    outer = _outer(seal(make_ad(), KEY_A))
    forged = sign_raw(outer["p"], KEY_B)
    with pytest.raises(SignerMismatch) as info:
        open_ad(forged, expected_signer=PEER_A)
    assert PEER_B in str(info.value) and PEER_A in str(info.value)
    # the forgery is a valid envelope of B's: it opens as B's without expected_signer
    opened = open_ad(forged)
    assert opened.signer == PEER_B
    assert opened.message == make_ad()
    assert open_ad(forged, expected_signer=PEER_B).signer == PEER_B


def test_key_replaced_by_another_key_is_a_signature_error():
    outer = _outer(seal(make_ad(), KEY_A))
    outer["k"] = bytes(KEY_B.verify_key)
    for expected in (None, PEER_A, PEER_B):
        with pytest.raises(SignatureError) as info:
            open_ad(encode(outer), expected_signer=expected)
        assert type(info.value) is SignatureError


@pytest.mark.parametrize(
    "field, value",
    [
        ("k", b"\x00" * 32),  # small-order point
        ("k", b"\xff" * 32),  # not a point
        ("k", b"\x01" * 31),
        ("k", b"\x01" * 33),
        ("s", b"\x00" * 64),
        ("s", b"\x01" * 63),
        ("s", b""),
    ],
)
def test_bad_key_or_signature_bytes_are_signature_errors(field, value):
    outer = _outer(seal(make_ad(), KEY_A))
    outer[field] = value
    with pytest.raises(SignatureError):
        open_ad(encode(outer))


def test_signature_is_domain_separated():
    payload = encode(to_plain(make_ad()))
    assert signing_bytes("capacity_ad", 1, payload).startswith(SIGNING_DOMAIN)
    sig = KEY_A.sign(encode(["capacity_ad", 1, payload])).signature
    data = encode(
        {"t": "capacity_ad", "v": 1, "p": payload, "k": bytes(KEY_A.verify_key), "s": sig}
    )
    with pytest.raises(SignatureError):
        open_ad(data)


def test_signature_is_checked_before_the_payload_is_decoded():
    # garbage payload, bad signature: the signature error must come first
    outer = _outer(seal(make_ad(), KEY_A))
    outer["p"] = b"\xc1"
    with pytest.raises(SignatureError):
        open_ad(encode(outer))
    # the same garbage, validly signed, is a decode error
    with pytest.raises(DecodeError):
        open_ad(sign_raw(b"\xc1"))


@dataclasses.dataclass(frozen=True)
class OtherMessage:
    TYPE: ClassVar[str] = "other"
    VERSION: ClassVar[int] = 1

    text: str


def test_wrong_message_type_is_a_decode_error():
    other = seal(OtherMessage(text="hi"), KEY_A)
    assert open_envelope(other, OtherMessage).message == OtherMessage(text="hi")
    with pytest.raises(DecodeError) as info:
        open_ad(other)
    assert "capacity_ad" in str(info.value)
    with pytest.raises(DecodeError):
        open_envelope(seal(make_ad(), KEY_A), OtherMessage, limits=AD_LIMITS)


def test_wrong_version_is_a_decode_error():
    payload = encode(to_plain(make_ad()))
    for version in (0, 2, -1):
        with pytest.raises(DecodeError):
            open_ad(sign_raw(payload, version=version))


def test_type_and_version_are_signed():
    outer = _outer(seal(make_ad(), KEY_A))
    # relabelled as another type (the reader expecting that type sees a bad signature)
    outer["t"] = OtherMessage.TYPE
    with pytest.raises(SignatureError):
        open_envelope(encode(outer), OtherMessage)


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.pop("s"),
        lambda o: o.update(x=1),
        lambda o: o.update(t=b"capacity_ad"),
        lambda o: o.update(t=None),
        lambda o: o.update(v=True),
        lambda o: o.update(v=1.0),
        lambda o: o.update(v="1"),
        lambda o: o.update(p=[1]),
        lambda o: o.update(k="key"),
        lambda o: o.update(s=None),
    ],
)
def test_malformed_envelope_is_a_decode_error(change):
    outer = _outer(seal(make_ad(), KEY_A))
    change(outer)
    with pytest.raises(DecodeError):
        open_ad(encode(outer))


@pytest.mark.parametrize("value", [[], "envelope", None, 1, [1, 2, 3, 4, 5]])
def test_non_map_envelope_is_a_decode_error(value):
    with pytest.raises(DecodeError):
        open_ad(encode(value))


def test_oversized_envelope_is_too_large():
    big = make_ad(
        addrs=["/ip4/203.0.113.7/tcp/4001/" + "x" * 220] * 16,
        gpus=[GpuInfo(name="g" * 250)] * 16,
    )
    sealed = seal(big, KEY_A)
    assert open_envelope(sealed, CapacityAd).message == big  # fits the default limits
    with pytest.raises(TooLarge):
        open_ad(sealed)


def test_payload_limits_apply_inside_a_signed_envelope():
    plain = to_plain(make_ad())
    plain["version"] = [[[[[["deep"]]]]]]
    with pytest.raises(TooLarge):
        open_ad(sign_plain(plain))
    plain["version"] = "v" * (AD_LIMITS.max_str_len + 1)
    with pytest.raises(TooLarge):
        open_ad(sign_plain(plain))


# --- schema: unknown fields, wrong types, value rules ----------------------------------


@pytest.mark.parametrize(
    "where, path",
    [
        (lambda p: p, "CapacityAd"),
        (lambda p: p["policy"], "CapacityAd.policy"),
        (lambda p: p["gpus"][0], "CapacityAd.gpus[0]"),
    ],
)
def test_unknown_field_is_a_decode_error_naming_it(where, path):
    plain = to_plain(make_ad())
    where(plain)["sneaky_extra"] = 1
    with pytest.raises(DecodeError) as info:
        open_ad(sign_plain(plain))
    assert "sneaky_extra" in str(info.value)
    assert str(info.value).startswith(path + ":")


def test_class_attributes_are_not_fields():
    plain = to_plain(make_ad())
    plain["TYPE"] = "capacity_ad"
    with pytest.raises(DecodeError, match="TYPE"):
        open_ad(sign_plain(plain))


def test_bytes_keys_are_not_field_names():
    plain = to_plain(make_ad())
    plain[b"extra"] = plain.pop("load_pct")
    with pytest.raises(DecodeError):
        open_ad(sign_plain(plain))


@pytest.mark.parametrize("path", ["seq", "policy", "gpus[0].name", "peer_id", "addrs"])
def test_missing_required_field_is_a_decode_error_naming_it(path):
    plain = to_plain(make_ad())
    if path == "gpus[0].name":
        del plain["gpus"][0]["name"]
    else:
        del plain[path]
    with pytest.raises(DecodeError) as info:
        open_ad(sign_plain(plain))
    assert f"CapacityAd.{path} is missing" in str(info.value)


def _set(plain: dict, path: str, value) -> None:
    """Set `value` at a path like ``policy.accepting`` or ``gpus[0].name``."""
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node = plain
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value


WRONG_TYPES = [
    ("load_pct", True),
    ("load_pct", 12.0),
    ("load_pct", "12"),
    ("load_pct", None),
    ("seq", 1.5),
    ("seq", False),
    ("tflops", "fast"),
    ("tflops", True),
    ("tflops", None),
    ("tflops", b"1.0"),
    ("timestamp", [1.0]),
    ("peer_id", 5),
    ("peer_id", b"12D3KooW"),
    ("peer_id", None),
    ("addrs", "/ip4/1.2.3.4/tcp/1"),
    ("addrs", {"a": 1}),
    ("addrs[1]", 7),
    ("addrs[0]", None),
    ("gpus", {"name": "x"}),
    ("gpus[0]", "H100"),
    ("gpus[0].name", 3),
    ("gpus[0].memory_total_mb", 8.5),
    ("gpus[0].memory_free_mb", True),
    ("policy", None),
    ("policy", []),
    ("policy.accepting", 1),
    ("policy.accepting", "yes"),
    ("policy.load_limit_pct", True),
    ("policy.max_job_hours", "6"),
    ("policy.max_gpu_memory_share", False),
    ("version", 1),
    ("cuda_version", None),
]


@pytest.mark.parametrize("path, value", WRONG_TYPES)
def test_wrong_type_is_a_decode_error_naming_the_path(path, value):
    plain = to_plain(make_ad())
    _set(plain, path, value)
    with pytest.raises(DecodeError) as info:
        open_ad(sign_plain(plain))
    assert f"CapacityAd.{path}" in str(info.value)


BAD_VALUES = [
    ("load_pct", 101),
    ("load_pct", -1),
    ("tflops", -0.5),
    ("tflops", -1),
    ("tflops", math.nan),
    ("tflops", math.inf),
    ("seq", -1),
    ("timestamp", 0.0),
    ("timestamp", -5),
    ("timestamp", math.nan),
    ("timestamp", math.inf),
    ("peer_id", ""),
    ("peer_id", "x" * 129),
    ("addrs", ["/ip4/1.2.3.4/tcp/1"] * 17),
    ("gpus", [{"name": "g"}] * 17),
    ("gpus[0].kind", "tpu"),
    ("gpus[0].memory_total_mb", -1),
    ("gpus[0].memory_free_mb", -1),
    ("gpus[0].memory_free_mb", 81560),
    ("policy.max_gpu_memory_share", 0),
    ("policy.max_gpu_memory_share", 0.0),
    ("policy.max_gpu_memory_share", 1.01),
    ("policy.max_gpu_memory_share", -0.5),
    ("policy.max_gpu_memory_share", math.nan),
    ("policy.max_job_hours", 0),
    ("policy.max_job_hours", -1.0),
    ("policy.max_job_hours", math.inf),
    ("policy.max_job_hours", math.nan),
    ("policy.load_limit_pct", 101),
    ("policy.load_limit_pct", -1),
    # a forged name or team: too long, markup, control or invisible characters, padding
    ("name", "x" * 41),
    ("name", "<script>alert(1)</script>"),
    ("name", "Ada & co"),
    ("team", 'the "best" team'),
    ("team", "line\nbreak"),
    ("name", "zero\u200bwidth"),
    ("name", " padded"),
]


CREDIT_ROW = to_plain(CreditRow(PEER_A, credit=2.5, rac=1.0, units=3, conflicts=0, name="Ada"))


@pytest.mark.parametrize(
    "path, value",
    [
        ("receipts", -1),
        ("rows", [CREDIT_ROW] * 2),  # a peer twice
        ("rows", [{**CREDIT_ROW, "peer_id": "12D3KooWnotapeer"}]),
        ("rows", [{**CREDIT_ROW, "credit": math.nan}]),
        ("rows", [{**CREDIT_ROW, "rac": -1.0}]),
        ("rows", [{**CREDIT_ROW, "units": -1}]),
        ("rows", [{**CREDIT_ROW, "name": "<img src=x onerror=alert(1)>"}]),
        ("rows", [{**CREDIT_ROW, "team": "x" * 41}]),
    ],
)
def test_a_directory_credit_reply_that_breaks_a_rule_is_refused(path, value):
    plain = to_plain(CreditReply(receipts=3, rows=[CreditRow(**CREDIT_ROW)]))
    plain[path] = value
    with pytest.raises(DecodeError) as info:
        signed = sign_raw(encode(plain), type_=CreditReply.TYPE, version=CreditReply.VERSION)
        open_envelope(signed, CreditReply, limits=CREDIT_LIMITS)
    assert str(info.value).startswith(f"CreditReply.{path}")


@pytest.mark.parametrize("path, value", BAD_VALUES)
def test_value_rules_are_decode_errors_naming_the_path(path, value):
    plain = to_plain(make_ad())
    _set(plain, path, value)
    with pytest.raises(DecodeError) as info:
        open_ad(sign_plain(plain))
    assert str(info.value).startswith(f"CapacityAd.{path} ")


@pytest.mark.parametrize(
    "path, value",
    [
        ("load_pct", 0),
        ("load_pct", 100),
        ("tflops", 0.0),
        ("seq", 0),
        ("seq", 2**64 - 1),
        ("peer_id", "x" * 128),
        ("addrs", ["/ip4/1.2.3.4/tcp/1"] * 16),
        ("gpus", [to_plain(GpuInfo(name="g"))] * 16),
        ("gpus[0].kind", "cpu"),
        ("gpus[0].memory_free_mb", 81559),
        ("policy.max_gpu_memory_share", 1),
        ("policy.max_job_hours", 1e-9),
        ("policy.load_limit_pct", 0),
        ("name", "x" * 40),
        ("name", "Zoë Ødegård-Østby (@zoe) #1"),
        ("team", "Team 42, Ñuñoa"),
        ("team", "上海 GPU 队"),
    ],
)
def test_boundary_values_are_accepted(path, value):
    plain = to_plain(make_ad())
    _set(plain, path, value)
    msg = open_ad(sign_plain(plain)).message
    assert to_plain(msg) == plain


# --- peer ids -------------------------------------------------------------------------

SEEDS = [
    b"\x00" * 32,
    b"\x01" * 32,
    bytes(range(32)),
    b"\xff" * 32,
    hashlib.sha256(b"meshminer").digest(),
    hashlib.sha256(b"another seed").digest(),
]


def _libp2p_peer_id(seed: bytes) -> str:
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    return ID.from_pubkey(create_new_key_pair(seed).public_key).to_base58()


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: s.hex()[:8])
def test_peer_id_matches_libp2p(seed):
    expected = _libp2p_peer_id(seed)
    ours = peer_id_from_public_key(bytes(SigningKey(seed).verify_key))
    assert ours == expected
    assert ours.startswith("12D3KooW")
    assert public_key_from_peer_id(ours) == bytes(SigningKey(seed).verify_key)


@settings(max_examples=30, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32))
def test_peer_id_matches_libp2p_for_any_seed(seed):
    assert peer_id_from_public_key(bytes(SigningKey(seed).verify_key)) == _libp2p_peer_id(seed)


def test_libp2p_peer_id_parses_back_to_its_key():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    pair = create_new_key_pair(SEEDS[4])
    peer = ID.from_pubkey(pair.public_key)
    assert public_key_from_peer_id(peer.to_base58()) == pair.public_key.to_bytes()
    assert ID.from_base58(peer_id_from_public_key(pair.public_key.to_bytes())) == peer


def test_envelope_signer_is_the_libp2p_peer_id():
    opened = open_ad(seal(make_ad(), SigningKey(SEEDS[2])))
    assert opened.signer == _libp2p_peer_id(SEEDS[2])


@settings(max_examples=100, deadline=None)
@given(key=st.binary(min_size=32, max_size=32))
def test_public_key_peer_id_round_trip(key):
    peer = peer_id_from_public_key(key)
    assert public_key_from_peer_id(peer) == key
    assert len(base58.b58decode(peer)) == 38


@pytest.mark.parametrize("key", [b"", b"\x01" * 31, b"\x01" * 33, b"\x01" * 64])
def test_peer_id_from_wrong_length_key_is_a_decode_error(key):
    with pytest.raises(DecodeError):
        peer_id_from_public_key(key)


def _b58(raw: bytes) -> str:
    return base58.b58encode(raw).decode("ascii")


ED_PREFIX = b"\x00\x24\x08\x01\x12\x20"
GARBAGE_PEER_IDS = [
    "",
    "0",
    "O",
    "I",
    "l",
    "12D3KooW0OIl",
    "12D3KooW not base58",
    "12D3KooWé",
    "\x00",
    PEER_A + "!",
    PEER_A[:-1],  # one character short: wrong length
    PEER_A + "1",  # a trailing '1' is a different number: wrong length or prefix
    "1" + PEER_A,  # a leading '1' is an extra zero byte
    PEER_A + " ",  # base58.b58decode strips trailing whitespace; we must not
    PEER_A + "\n",
    PEER_A + "\t\r\n",
    " " + PEER_A,
    _b58(ED_PREFIX + b"\x01" * 31),
    _b58(ED_PREFIX + b"\x01" * 33),
    _b58(b"\x00\x24\x08\x02\x12\x20" + b"\x01" * 32),  # key type secp256k1 with ed25519 size
    _b58(b"\x00\x25\x08\x02\x12\x21" + b"\x02" * 33),  # secp256k1-style id
    _b58(b"\x12\x20" + hashlib.sha256(b"rsa public key").digest()),  # RSA-style Qm... id
    "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",
    "16Uiu2HAmEWQnHq2jLKJypwVnVoQeFCULuyop6atvq2eWjYSUjzNi",
]


@pytest.mark.parametrize("peer", GARBAGE_PEER_IDS)
def test_public_key_from_garbage_peer_id_is_a_decode_error(peer):
    with pytest.raises(DecodeError):
        public_key_from_peer_id(peer)


@pytest.mark.parametrize("peer", [None, 5, PEER_A.encode(), [PEER_A]])
def test_public_key_from_non_string_is_a_decode_error(peer):
    with pytest.raises(DecodeError):
        public_key_from_peer_id(peer)


@settings(max_examples=100, deadline=None)
@given(prefix=st.text(max_size=3), suffix=st.text(max_size=3))
def test_only_the_exact_peer_id_string_is_accepted(prefix, suffix):
    peer = prefix + PEER_A + suffix
    if peer == PEER_A:
        assert public_key_from_peer_id(peer) == bytes(KEY_A.verify_key)
    else:
        with pytest.raises(DecodeError):
            public_key_from_peer_id(peer)


def test_public_key_from_libp2p_rsa_and_secp256k1_ids_is_a_decode_error():
    from libp2p.crypto.rsa import create_new_key_pair as rsa_pair
    from libp2p.crypto.secp256k1 import create_new_key_pair as secp_pair
    from libp2p.peer.id import ID

    rsa_id = ID.from_pubkey(rsa_pair(1024).public_key).to_base58()
    secp_id = ID.from_pubkey(secp_pair(SEEDS[1]).public_key).to_base58()
    assert rsa_id.startswith("Qm") and secp_id.startswith("16Uiu2")
    for peer in (rsa_id, secp_id):
        with pytest.raises(DecodeError):
            public_key_from_peer_id(peer)


@settings(max_examples=200, deadline=None)
@given(peer=st.text(max_size=60) | st.text(alphabet=base58.BITCOIN_ALPHABET.decode(), max_size=60))
def test_public_key_from_arbitrary_text(peer):
    try:
        key = public_key_from_peer_id(peer)
    except DecodeError:
        return
    assert len(key) == 32
    assert peer_id_from_public_key(key) == peer
