"""meshminer's wire format: message dataclasses, one msgpack codec with hard limits,
and the signed envelope. Imports nothing else of meshminer."""

from protocol.capacity import AD_LIMITS, CapacityAd, GpuInfo, Policy
from protocol.codec import DEFAULT_LIMITS, Limits, decode, encode
from protocol.envelope import Signed, open_envelope, seal
from protocol.errors import (
    DecodeError,
    ProtocolError,
    ReplayedMessage,
    SignatureError,
    SignerMismatch,
    StaleMessage,
    TooLarge,
)
from protocol.peer_id import peer_id_from_public_key, public_key_from_peer_id

__all__ = [
    "AD_LIMITS",
    "DEFAULT_LIMITS",
    "CapacityAd",
    "DecodeError",
    "GpuInfo",
    "Limits",
    "Policy",
    "ProtocolError",
    "ReplayedMessage",
    "SignatureError",
    "SignerMismatch",
    "Signed",
    "StaleMessage",
    "TooLarge",
    "decode",
    "encode",
    "open_envelope",
    "peer_id_from_public_key",
    "public_key_from_peer_id",
    "seal",
]
