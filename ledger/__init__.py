"""The hash-chained, signed ledger of completed work."""
