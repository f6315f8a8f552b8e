"""Encryption: a sealed box from one node to another, and a chunked stream cipher.

Nodes have one key each, Ed25519 (it is also the libp2p identity). For encryption it
is converted to X25519 (`to_curve25519_*`), so a node's peer id is all a sender needs
to seal a work package to it: no second key has to be published or trusted.

`seal_to` / `open_from` use `crypto_box` (X25519 + XSalsa20-Poly1305): authenticated
in both directions, so the recipient knows the sender holds the sending key. Work
packages are small; whole-message encryption is fine.

Blobs are large and arrive in pieces, so they use libsodium's secretstream
(XChaCha20-Poly1305) under a per-job symmetric key: every chunk is authenticated, the
chunks cannot be reordered, dropped or replayed within a stream, and the last one
carries the FINAL tag, so a stream cut short is detected rather than mistaken for a
shorter blob (`StreamDecryptor.finish`).
"""

from __future__ import annotations

import os

from nacl import bindings as sodium
from nacl.exceptions import CryptoError
from nacl.public import Box, PublicKey
from nacl.signing import SigningKey, VerifyKey

from protocol.errors import DecryptError

JOB_KEY_BYTES = sodium.crypto_secretstream_xchacha20poly1305_KEYBYTES  # 32
STREAM_HEADER_BYTES = sodium.crypto_secretstream_xchacha20poly1305_HEADERBYTES  # 24
#: bytes a chunk grows by when encrypted (1 tag byte + 16 MAC bytes)
STREAM_ABYTES = sodium.crypto_secretstream_xchacha20poly1305_ABYTES  # 17
#: bytes a sealed box grows by (24-byte nonce + 16-byte MAC)
BOX_OVERHEAD = Box.NONCE_SIZE + 16

_TAG_MESSAGE = sodium.crypto_secretstream_xchacha20poly1305_TAG_MESSAGE
_TAG_FINAL = sodium.crypto_secretstream_xchacha20poly1305_TAG_FINAL


def new_job_key() -> bytes:
    """A fresh random 32-byte key for one job's blob streams."""
    return os.urandom(JOB_KEY_BYTES)


# -- sealed boxes between nodes ---------------------------------------------------------


def seal_to(recipient_ed25519_public: bytes, sender: SigningKey, plaintext: bytes) -> bytes:
    """Encrypt `plaintext` so only the holder of the recipient's key can read it, and
    it can tell `sender` wrote it. Output: 24-byte nonce + ciphertext + 16-byte MAC.
    A recipient key that is not a usable Ed25519 public key is a `ValueError`."""
    try:
        recipient = _curve_public(recipient_ed25519_public, "recipient")
    except DecryptError as exc:  # nothing was decrypted: the caller passed a bad key
        raise ValueError(str(exc)) from None
    box = Box(sender.to_curve25519_private_key(), recipient)
    return bytes(box.encrypt(bytes(plaintext)))


def open_from(sender_ed25519_public: bytes, recipient: SigningKey, ciphertext: bytes) -> bytes:
    """Decrypt a `seal_to` box from `sender`, or raise `DecryptError`.

    It fails the same way whether the box was sealed to another node, by another
    sender, or altered in transit: nothing tells an attacker which."""
    sender = _curve_public(sender_ed25519_public, "sender")
    if not isinstance(ciphertext, bytes | bytearray | memoryview):
        raise DecryptError(f"a sealed box is bytes, got {type(ciphertext).__name__}")
    if len(ciphertext) < BOX_OVERHEAD:
        raise DecryptError(f"a sealed box is at least {BOX_OVERHEAD} bytes, got {len(ciphertext)}")
    try:
        box = Box(recipient.to_curve25519_private_key(), sender)
        return box.decrypt(bytes(ciphertext))
    except CryptoError as exc:
        raise DecryptError("sealed box does not decrypt with our key and the sender's") from exc


def _curve_public(ed25519_public: bytes, role: str) -> PublicKey:
    if not isinstance(ed25519_public, bytes) or len(ed25519_public) != 32:
        raise DecryptError(f"the {role}'s Ed25519 public key must be 32 bytes")
    try:
        return VerifyKey(ed25519_public).to_curve25519_public_key()
    except (CryptoError, ValueError) as exc:  # not a point on the curve, small order
        raise DecryptError(f"the {role}'s public key is not a usable Ed25519 key") from exc


# -- secretstream for blobs ----------------------------------------------------------------


class StreamEncryptor:
    """Encrypts one stream of chunks; send `header` first, then each `push` result."""

    def __init__(self, key: bytes) -> None:
        _check_key(key)
        self._state = sodium.crypto_secretstream_xchacha20poly1305_state()
        self.header: bytes = sodium.crypto_secretstream_xchacha20poly1305_init_push(
            self._state, key
        )
        self._finished = False

    def push(self, chunk: bytes, *, final: bool = False, ad: bytes | None = None) -> bytes:
        """Encrypt one chunk (len(chunk) + STREAM_ABYTES bytes out). Mark the last chunk
        `final=True`; nothing can be pushed after it."""
        if self._finished:
            raise ValueError("the stream was already finished")
        self._finished = final
        tag = _TAG_FINAL if final else _TAG_MESSAGE
        return sodium.crypto_secretstream_xchacha20poly1305_push(
            self._state, _as_bytes(chunk), ad, tag
        )


class StreamDecryptor:
    """Decrypts the chunks of one stream in order. Call `finish()` when the input ends:
    it raises `DecryptError` unless the FINAL chunk was seen (a truncated stream)."""

    def __init__(self, key: bytes, header: bytes) -> None:
        _check_key(key)
        if not isinstance(header, bytes) or len(header) != STREAM_HEADER_BYTES:
            raise DecryptError(f"a stream header is {STREAM_HEADER_BYTES} bytes")
        self._state = sodium.crypto_secretstream_xchacha20poly1305_state()
        try:
            sodium.crypto_secretstream_xchacha20poly1305_init_pull(self._state, header, key)
        except CryptoError as exc:
            raise DecryptError("stream header refused") from exc
        self.finished = False

    def pull(self, ciphertext: bytes, *, ad: bytes | None = None) -> bytes:
        """Decrypt the next chunk, or raise `DecryptError` (tampered, reordered, wrong
        key, or data after the FINAL chunk)."""
        if self.finished:
            raise DecryptError("data after the final chunk of the stream")
        if len(ciphertext) < STREAM_ABYTES:
            raise DecryptError(f"an encrypted chunk is at least {STREAM_ABYTES} bytes")
        try:
            plain, tag = sodium.crypto_secretstream_xchacha20poly1305_pull(
                self._state, _as_bytes(ciphertext), ad
            )
        except (CryptoError, ValueError) as exc:
            raise DecryptError("encrypted chunk does not decrypt (wrong key or altered)") from exc
        if tag == _TAG_FINAL:
            self.finished = True
        elif tag != _TAG_MESSAGE:
            raise DecryptError(f"unexpected secretstream tag {tag}")
        return plain

    def finish(self) -> None:
        """Confirm the stream ended properly: raises `DecryptError` if it was cut short."""
        if not self.finished:
            raise DecryptError("stream truncated: it ended before its final chunk")


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != JOB_KEY_BYTES:
        raise ValueError(f"a stream key is {JOB_KEY_BYTES} bytes")


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    # PyNaCl's bindings accept only `bytes`; callers on the hot path already pass bytes
    return data if isinstance(data, bytes) else bytes(data)
