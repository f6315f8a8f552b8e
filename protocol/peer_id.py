"""libp2p peer IDs for Ed25519 keys, computed without importing libp2p.

A peer ID for an Ed25519 key is the base58 of an identity multihash over the
protobuf-encoded public key. Keeping this here (not in `node`) lets every decoder
check "signed by the peer it claims to be" with no dependency on the network stack.
"""

from __future__ import annotations

import base58

from protocol.errors import DecodeError

# protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}
_ED25519_PROTO_PREFIX = b"\x08\x01\x12\x20"
# multihash: identity function (0x00), digest length 36
_IDENTITY_MULTIHASH_PREFIX = b"\x00\x24"


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer ID (base58 `12D3KooW...`) of a raw 32-byte Ed25519 key."""
    if len(public_key) != 32:
        raise DecodeError(f"an Ed25519 public key is 32 bytes, got {len(public_key)}")
    return base58.b58encode(_IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTO_PREFIX + public_key).decode(
        "ascii"
    )


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The raw Ed25519 public key inside a peer ID, or `DecodeError`."""
    if not isinstance(peer_id, str):
        raise DecodeError(f"a peer id is a string, got {type(peer_id).__name__}")
    try:
        raw = base58.b58decode(peer_id)
    except ValueError as exc:
        raise DecodeError(f"peer id {peer_id[:64]!r} is not base58") from exc
    # b58decode strips trailing whitespace; accept only the one canonical spelling
    if base58.b58encode(raw).decode("ascii") != peer_id:
        raise DecodeError(f"peer id {peer_id[:64]!r} is not canonical base58")
    prefix = _IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTO_PREFIX
    if len(raw) != len(prefix) + 32 or not raw.startswith(prefix):
        raise DecodeError(f"peer id {peer_id[:64]!r} is not an Ed25519 peer id")
    return raw[len(prefix) :]
