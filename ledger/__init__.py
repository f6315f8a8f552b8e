"""The hash-chained, signed ledger of completed work, and the audit table of receipts
seen on gossip. Imports only `protocol` of meshminer: credit is computed by `training`
and handed in by the node.
"""

from ledger.audit import AUDIT_DB, AuditLog
from ledger.chain import LEDGER_DB, Ledger
from ledger.entry import (
    GENESIS,
    INVALIDATED,
    KINDS,
    REJECTED,
    WORK_DONE,
    WORK_RECEIVED,
    Entry,
)
from ledger.errors import (
    AuditFull,
    CorruptLedger,
    CreditMismatch,
    DuplicateUnit,
    ForeignLedger,
    InvalidArgument,
    InvalidReceipt,
    LedgerError,
    NotOurReceipt,
)
from ledger.verify import VerifyReport

__all__ = [
    "AUDIT_DB",
    "GENESIS",
    "INVALIDATED",
    "KINDS",
    "LEDGER_DB",
    "REJECTED",
    "WORK_DONE",
    "WORK_RECEIVED",
    "AuditFull",
    "AuditLog",
    "CorruptLedger",
    "CreditMismatch",
    "DuplicateUnit",
    "Entry",
    "ForeignLedger",
    "InvalidArgument",
    "InvalidReceipt",
    "Ledger",
    "LedgerError",
    "NotOurReceipt",
    "VerifyReport",
]
