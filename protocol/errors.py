"""Typed errors for everything that arrives from the wire.

Every decoder in `protocol` raises one of these and nothing else, so callers can
catch `ProtocolError` at the edge of the network and count the reason.
"""


class MeshminerError(Exception):
    """The root of every refusal in meshminer (`ProtocolError`, `ledger.LedgerError`):
    something was not accepted, nothing was changed, and `reason` says what kind."""

    #: short machine-readable reason, used as a metrics label
    reason = "invalid"


class ProtocolError(MeshminerError):
    """Base class: a message from a peer was not acceptable."""


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


class CreditMismatch(ProtocolError):
    """A receipt's credit is not what the job spec gives (raised by the worker before
    it countersigns, and by the ledger before it appends)."""

    reason = "credit_mismatch"
