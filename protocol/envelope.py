"""The signed envelope every peer-to-peer message travels in.

Wire form: a msgpack map ``{t: type, v: version, p: payload bytes, k: signer key,
s: signature}``. The signature is Ed25519 over a domain-separated encoding of
``[type, version, payload]``; the payload is carried as the exact bytes that were
signed, so verification needs no re-canonicalisation. The signature is checked
*before* the payload is decoded into a message object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey

from protocol.codec import DEFAULT_LIMITS, Limits, decode, encode
from protocol.errors import DecodeError, SignatureError, SignerMismatch
from protocol.peer_id import peer_id_from_public_key
from protocol.schema import from_plain, to_plain

SIGNING_DOMAIN = b"meshminer/envelope/1\x00"


class Message(Protocol):
    """A message dataclass: it names its wire type and version."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int]


M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Signed(Generic[M]):
    """A verified message, with who signed it and the exact bytes received."""

    message: M
    signer_key: bytes
    signer: str  # peer id of signer_key
    raw: bytes


def signing_bytes(type_: str, version: int, payload: bytes) -> bytes:
    return SIGNING_DOMAIN + encode([type_, version, payload])


def seal(message: Message, key: SigningKey) -> bytes:
    """Encode `message`, sign it with `key`, and return the envelope bytes."""
    payload = encode(to_plain(message))
    signature = key.sign(signing_bytes(message.TYPE, message.VERSION, payload)).signature
    return encode(
        {
            "t": message.TYPE,
            "v": message.VERSION,
            "p": payload,
            "k": bytes(key.verify_key),
            "s": signature,
        }
    )


def open_envelope(
    data: bytes,
    cls: type[M],
    *,
    expected_signer: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Signed[M]:
    """Verify and decode an envelope holding a `cls` message.

    Raises `TooLarge`, `DecodeError`, `SignatureError` or `SignerMismatch`; on success
    the signature has been verified and, if `expected_signer` is given, made by it.
    """
    outer = decode(data, limits)
    if not isinstance(outer, dict) or set(outer) != {"t", "v", "p", "k", "s"}:
        raise DecodeError("not a signed envelope (expected keys t, v, p, k, s)")
    type_, version, payload, key, sig = (outer[k] for k in ("t", "v", "p", "k", "s"))
    if not isinstance(type_, str) or type(version) is not int:
        raise DecodeError("envelope type must be a string and version an integer")
    if not isinstance(payload, bytes) or not isinstance(key, bytes) or not isinstance(sig, bytes):
        raise DecodeError("envelope payload, key and signature must be bytes")
    if type_ != cls.TYPE or version != cls.VERSION:
        raise DecodeError(
            f"expected a {cls.TYPE} v{cls.VERSION} message, got {type_[:64]} v{version}"
        )
    if len(key) != 32 or len(sig) != 64:
        raise SignatureError("signer key must be 32 bytes and signature 64 bytes")
    try:
        VerifyKey(key).verify(signing_bytes(type_, version, payload), sig)
    except (BadSignatureError, CryptoError, ValueError) as exc:
        raise SignatureError(f"{cls.TYPE} signature does not verify") from exc
    signer = peer_id_from_public_key(key)
    if expected_signer is not None and signer != expected_signer:
        raise SignerMismatch(f"{cls.TYPE} is signed by {signer}, but was sent by {expected_signer}")
    message = from_plain(cls, decode(payload, limits))
    return Signed(message=message, signer_key=key, signer=signer, raw=bytes(data))
