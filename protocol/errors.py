"""Typed errors for everything that arrives from the wire.

Every decoder in `protocol` raises one of these and nothing else, so callers can
catch `ProtocolError` at the edge of the network and count the reason.
"""


class ProtocolError(Exception):
    """Base class: a message from a peer was not acceptable."""

    #: short machine-readable reason, used as a metrics label
    reason = "invalid"


class TooLarge(ProtocolError):
    """A message, string or container exceeds a hard limit."""

    reason = "oversized"


class DecodeError(ProtocolError):
    """Bytes are not a well-formed message of the expected shape."""

    reason = "malformed"


class SignatureError(ProtocolError):
    """A signature does not verify, or the signer is not who it should be."""

    reason = "bad_signature"


class SignerMismatch(SignatureError):
    """The signature is valid, but made by a key other than the expected peer's."""

    reason = "signer_mismatch"


class StaleMessage(ProtocolError):
    """A message's timestamp is too old, or too far in the future."""

    reason = "stale"


class ReplayedMessage(ProtocolError):
    """A message's sequence number is not newer than one already seen."""

    reason = "replay"


class DecryptError(ProtocolError):
    """Ciphertext does not decrypt: wrong key, not meant for us, tampered or truncated."""

    reason = "undecryptable"
