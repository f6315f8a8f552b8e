"""Typed errors of the ledger: each says what is wrong and what to do.

Every refusal of an append raises one of these *before* anything is written, so a
caller can catch `LedgerError`, log `reason` and carry on with the ledger unchanged.
"""

from __future__ import annotations

from protocol.errors import CreditMismatch, MeshminerError  # noqa: F401 (raised here too)


class LedgerError(MeshminerError):
    """Base class: the ledger refused an operation (nothing was written)."""


class InvalidArgument(LedgerError, ValueError):
    """A caller passed a value outside what the API accepts (a bug in the caller)."""

    reason = "invalid_argument"


class InvalidReceipt(LedgerError):
    """A co-signed receipt is malformed or a signature on it does not verify."""

    reason = "invalid_receipt"

    def __init__(self, message: str, reason: str = "invalid_receipt") -> None:
        super().__init__(message)
        self.reason = reason


class NotOurReceipt(LedgerError):
    """The receipt does not name this node in the role the entry kind needs."""

    reason = "not_ours"


class DuplicateUnit(LedgerError):
    """A different receipt for the same unit and kind is already in the ledger."""

    reason = "duplicate_unit"


class ForeignLedger(LedgerError):
    """ledger.db was started by another node's key."""

    reason = "foreign_ledger"


class CorruptLedger(LedgerError):
    """ledger.db cannot be read as a ledger (no valid genesis, not our schema)."""

    reason = "corrupt"


class AuditFull(LedgerError):
    """The audit table holds its maximum number of receipts."""

    reason = "audit_full"
