"""The hash-chained, signed ledger of completed work. (Arrives with the ledger issue.)"""
