"""meshminer's wire format: message dataclasses, one msgpack codec with hard limits,
and the signed envelope. Imports nothing else of meshminer."""

from protocol.blobs import GRANT_LIMITS, REQUEST_LIMITS, BlobGrant, BlobRequest
from protocol.capacity import AD_LIMITS, CapacityAd, GpuInfo, Policy
from protocol.codec import DEFAULT_LIMITS, Limits, decode, encode
from protocol.crypto import StreamDecryptor, StreamEncryptor, new_job_key, open_from, seal_to
from protocol.envelope import Signed, open_envelope, seal
from protocol.errors import (
    CreditMismatch,
    DecodeError,
    DecryptError,
    MeshminerError,
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
    "GRANT_LIMITS",
    "REQUEST_LIMITS",
    "BlobGrant",
    "BlobRequest",
    "CapacityAd",
    "CreditMismatch",
    "DecodeError",
    "DecryptError",
    "GpuInfo",
    "Limits",
    "MeshminerError",
    "Policy",
    "ProtocolError",
    "ReplayedMessage",
    "SignatureError",
    "SignerMismatch",
    "Signed",
    "StaleMessage",
    "StreamDecryptor",
    "StreamEncryptor",
    "TooLarge",
    "decode",
    "encode",
    "new_job_key",
    "open_envelope",
    "open_from",
    "peer_id_from_public_key",
    "public_key_from_peer_id",
    "seal",
    "seal_to",
]
