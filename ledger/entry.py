"""One ledger entry, and the exact bytes that are hashed and signed for it.

Every entry is a row of 13 columns. Two encodings are defined over them, both msgpack
of a fixed-order list (msgpack gives one encoding for each of these values: str as
UTF-8, bytes as bin, int as the shortest int, float always as float64):

- the *body*, which a node signs for the entries it makes itself (genesis, rejected)::

      SIGN_DOMAIN + msgpack([seq, prev_hash, kind, job_id, unit_id, worker, owner,
                             credit, payload, ts])

- the *hash input*, which is the body's columns plus both signatures::

      hash = sha256(HASH_DOMAIN + msgpack([seq, prev_hash, kind, job_id, unit_id,
                                            worker, owner, credit, payload,
                                            owner_sig, worker_sig, ts]))

`prev_hash` is the previous entry's `hash` (32 zero bytes for seq 0), so changing any
byte of any entry changes its hash and breaks the link from the next one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

import msgpack

SIGN_DOMAIN: Final = b"meshminer/ledger/entry-body/1\x00"
HASH_DOMAIN: Final = b"meshminer/ledger/entry-hash/1\x00"
GENESIS_PREV_HASH: Final = bytes(32)

GENESIS: Final = "genesis"
WORK_DONE: Final = "work_done"  # this node was the worker
WORK_RECEIVED: Final = "work_received"  # this node was the owner
REJECTED: Final = "rejected"  # a result this node refused, with the reason
INVALIDATED: Final = "invalidated"  # a result that failed a spot check, with the evidence
KINDS: Final = (GENESIS, WORK_DONE, WORK_RECEIVED, REJECTED, INVALIDATED)
WORK_KINDS: Final = (WORK_DONE, WORK_RECEIVED)

WorkKind = Literal["work_done", "work_received"]

#: column order in the table, in `Entry`, in exports
COLUMNS: Final = (
    "seq",
    "prev_hash",
    "hash",
    "kind",
    "job_id",
    "unit_id",
    "worker",
    "owner",
    "credit",
    "payload",
    "owner_sig",
    "worker_sig",
    "ts",
)


def _packb(values: list[Any]) -> bytes:
    # a fresh packer per call: a shared msgpack.Packer is not safe across threads
    return msgpack.packb(values, use_bin_type=True)


@dataclass(frozen=True)
class Entry:
    """A row of the ledger, as stored."""

    seq: int
    prev_hash: bytes
    hash: bytes
    kind: str
    job_id: str
    unit_id: str
    worker: str
    owner: str
    credit: float  # TFLOP; 0 for genesis and rejected
    payload: bytes  # genesis: key; work: co-signed receipt; rejected, invalidated: why
    owner_sig: bytes
    worker_sig: bytes
    ts: float  # unix seconds when appended

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Entry:
        """From a row selected in `COLUMNS` order."""
        return cls(*row)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: bytes as lowercase hex, everything else as is."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.hex() if isinstance(value, bytes) else value
        return out

    def computed_hash(self) -> bytes:
        """The entry's `hash` column: sha256 of the hash input (see the module docstring)."""
        packed = _packb([*self._signed_fields()[:-1], self.owner_sig, self.worker_sig, self.ts])
        return hashlib.sha256(HASH_DOMAIN + packed).digest()

    def body(self) -> bytes:
        """What this node signs for an entry it makes (see the module docstring)."""
        return SIGN_DOMAIN + _packb(self._signed_fields())

    def _signed_fields(self) -> list[Any]:
        return [
            self.seq,
            self.prev_hash,
            self.kind,
            self.job_id,
            self.unit_id,
            self.worker,
            self.owner,
            self.credit,
            self.payload,
            self.ts,
        ]
