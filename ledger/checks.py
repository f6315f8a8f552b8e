"""What each kind of entry must satisfy, beyond its hash: shape, columns, signatures.

`check_entry` is shared by `Ledger.open` (for the genesis) and by `verify`. It does the
cheap, pure-Python part itself and returns the signature checks still to do, so that
`verify` can run those (about 50 us each, in C, without the GIL) on other cores.

Per kind:

- genesis (seq 0 only): payload `{"public_key": 32 bytes}`; owner = worker = the peer
  id of that key = this node; `owner_sig` is that key's signature of the body.
- rejected: payload `{"reason": str}`; credit 0; `owner_sig` is this node's signature
  of the body (the genesis key), `worker_sig` empty.
- work_done / work_received: payload is a co-signed receipt (protocol.receipts); the
  job, unit, owner, worker, credit and both signature columns equal the receipt's;
  this node is its worker (work_done) or owner (work_received); the Receipt envelope
  is sealed by the owner's key; `owner_sig` and `worker_sig` verify over their claims.
  The envelope's own signature was checked when the entry was appended; its bytes are
  all inside the owner's claim, so re-checking `owner_sig` covers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError, CryptoError

from ledger.entry import (
    GENESIS,
    GENESIS_PREV_HASH,
    INVALIDATED,
    KINDS,
    REJECTED,
    WORK_DONE,
    Entry,
)
from protocol import Limits, ProtocolError, decode
from protocol.peer_id import peer_id_from_public_key
from protocol.receipts import claim_bytes, parse_cosigned, peek_receipt, peer_key

#: genesis, rejected and invalidated payloads are one small map (evidence: a signed
#: envelope that holds the worker's signed result)
PAYLOAD_LIMITS = Limits(
    max_bytes=400 * 1024,
    max_depth=1,
    max_container_len=4,
    max_str_len=4096,
    max_bin_len=300 * 1024,
)
MAX_REASON_CHARS = 4000


class EntryProblem(Exception):
    """One entry is wrong; the message says how (without the "seq N: " prefix)."""


@dataclass(frozen=True)
class SigCheck:
    """A signature still to verify: `sig` by `public_key` over `message`."""

    seq: int
    what: str  # "owner signature", "worker signature", "node signature", ...
    public_key: bytes
    message: bytes
    sig: bytes


def _small_map(payload: bytes, keys: set[str]) -> dict[str, Any]:
    try:
        value = decode(payload, PAYLOAD_LIMITS)
    except ProtocolError as exc:
        raise EntryProblem(f"payload is not readable ({exc})") from exc
    if not isinstance(value, dict) or set(value) != keys:
        raise EntryProblem(f"payload must be a map with keys {', '.join(sorted(keys))}")
    return value


def check_entry(entry: Entry, node_peer_id: str, node_key: bytes) -> list[SigCheck]:
    """Raise `EntryProblem` if `entry` is malformed for its kind; else return the
    signature checks that remain."""
    kind = entry.kind
    if kind not in KINDS:
        raise EntryProblem(f"unknown kind {str(kind)[:32]!r}")
    if (entry.seq == 0) != (kind == GENESIS):
        raise EntryProblem("seq 0 must be the genesis entry, and only seq 0")
    if kind == GENESIS:
        return _check_genesis(entry, node_peer_id)
    if kind in (REJECTED, INVALIDATED):
        keys = {"reason"} if kind == REJECTED else {"reason", "evidence"}
        payload = _small_map(entry.payload, keys)
        if not isinstance(payload["reason"], str):
            raise EntryProblem("payload reason must be text")
        if kind == INVALIDATED and not isinstance(payload["evidence"], bytes):
            raise EntryProblem("payload evidence must be bytes (a signed Evidence envelope)")
        if entry.credit != 0.0 or entry.worker_sig != b"":
            raise EntryProblem(f"a {kind} entry carries no credit and no worker signature")
        return [SigCheck(entry.seq, "node signature", node_key, entry.body(), entry.owner_sig)]
    return _check_work(entry, node_peer_id)


def _check_genesis(entry: Entry, node_peer_id: str) -> list[SigCheck]:
    if entry.prev_hash != GENESIS_PREV_HASH:
        raise EntryProblem("prev_hash of the genesis entry must be 32 zero bytes")
    key = _small_map(entry.payload, {"public_key"})["public_key"]
    if not isinstance(key, bytes) or len(key) != 32:
        raise EntryProblem("genesis payload public_key must be 32 bytes")
    peer_id = peer_id_from_public_key(key)
    if not entry.owner == entry.worker == peer_id:
        raise EntryProblem("genesis owner and worker must be the peer id of its public key")
    if (entry.job_id, entry.unit_id, entry.credit, entry.worker_sig) != ("", "", 0.0, b""):
        raise EntryProblem("genesis has no job, unit, credit or worker signature")
    if peer_id != node_peer_id:
        raise EntryProblem(f"the ledger was started by {peer_id}, not this node ({node_peer_id})")
    return [SigCheck(entry.seq, "genesis signature", key, entry.body(), entry.owner_sig)]


def _check_work(entry: Entry, node_peer_id: str) -> list[SigCheck]:
    try:
        cosigned = parse_cosigned(entry.payload)
        receipt = peek_receipt(cosigned.receipt)
        owner_key = peer_key(receipt.owner)
        worker_key = peer_key(receipt.worker)
    except ProtocolError as exc:
        raise EntryProblem(f"payload is not a valid co-signed receipt ({exc})") from exc
    if receipt.sealer_key != owner_key:
        raise EntryProblem("the receipt inside is not sealed by its owner")
    columns = {
        "job_id": (entry.job_id, receipt.job_id),
        "unit_id": (entry.unit_id, receipt.unit_id),
        "owner": (entry.owner, receipt.owner),
        "worker": (entry.worker, receipt.worker),
        "credit": (entry.credit, cosigned.credit),
        "owner_sig": (entry.owner_sig, cosigned.owner_sig),
        "worker_sig": (entry.worker_sig, cosigned.worker_sig),
    }
    for name, (stored, signed) in columns.items():
        if type(stored) is not type(signed) or stored != signed:
            raise EntryProblem(f"{name} column does not match the co-signed receipt")
    role, who = ("worker", entry.worker) if entry.kind == WORK_DONE else ("owner", entry.owner)
    if who != node_peer_id:
        raise EntryProblem(f"{entry.kind} entry does not name this node as the receipt's {role}")
    return [
        SigCheck(
            entry.seq,
            "owner signature",
            owner_key,
            claim_bytes("owner", cosigned.receipt, cosigned.credit, cosigned.credit_formula),
            entry.owner_sig,
        ),
        SigCheck(
            entry.seq,
            "worker signature",
            worker_key,
            claim_bytes("worker", cosigned.receipt, cosigned.credit, cosigned.credit_formula),
            entry.worker_sig,
        ),
    ]


def failed_signatures(checks: list[SigCheck]) -> list[tuple[int, str]]:
    """Run signature checks; (seq, "<what> does not verify") for each that fails.

    PyNaCl releases the GIL inside libsodium, so calling this from several threads
    verifies on several cores."""
    failed = []
    for check in checks:
        if len(check.sig) != 64:
            failed.append((check.seq, f"{check.what} does not verify (not 64 bytes)"))
            continue
        try:
            crypto_sign_open(check.sig + check.message, check.public_key)
        except (BadSignatureError, CryptoError, ValueError, TypeError):
            failed.append((check.seq, f"{check.what} does not verify"))
    return failed
