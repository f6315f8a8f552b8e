"""The co-signed receipt: what both sides of a unit agree it was worth.

A `Receipt` (protocol/work.py) is sealed by the job's owner alone and says nothing about
credit. Credit needs both parties' word, so the ledger and the audit table keep a
`CoSignedReceipt` instead: the owner's Receipt envelope, exactly as sealed, plus the
credit (TFLOP) and two detached Ed25519 signatures over the same *claim*::

    claim(role) = domain(role) + msgpack([receipt envelope bytes, float(credit)])
    domain("owner")  = b"meshminer/cosigned-receipt/owner/1\\x00"
    domain("worker") = b"meshminer/cosigned-receipt/worker/1\\x00"

`owner_sig` is made with the key of `receipt.owner` and `worker_sig` with the key of
`receipt.worker`; both keys are read from the peer ids in the receipt. The claim
covers the whole envelope, so the owner's claim signature also vouches for the receipt
it wraps; separate domains mean neither signature can be replayed in the other role
(or as any other meshminer signature).

Flow: the owner seals its Receipt as before, computes the credit from the job spec and
calls `issue()`, which gives a half-signed receipt (`worker_sig` empty). The worker
calls `countersign()`, which refuses unless the credit equals its own figure for the
spec, and sends the complete receipt back. Anyone can check one with `open_cosigned()`.

Wire form: a msgpack map, keys in this order::

    {"t": "cosigned_receipt", "v": 1, "receipt": bin, "credit": float,
     "owner_sig": bin(64), "worker_sig": bin(64) or bin(0) while half-signed}
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgpack
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.signing import SigningKey, VerifyKey

from protocol.codec import Limits, decode, encode
from protocol.envelope import open_envelope
from protocol.errors import (
    CreditMismatch,
    DecodeError,
    SignatureError,
    SignerMismatch,
    TooLarge,
)
from protocol.peer_id import peer_id_from_public_key, public_key_from_peer_id
from protocol.work import Receipt

#: a Receipt envelope: ids <= 128 chars, two peer ids, <= 64 metrics of 64-char keys
#: come to under 6 KB; twice that leaves room without letting gossip carry megabytes
MAX_RECEIPT_BYTES = 12 * 1024
#: the most credit one unit may carry (10^24 FLOPs; a 10^9-parameter model at the
#: largest budget is far below it)
MAX_CREDIT_TFLOP = 1e12
#: two credit figures agree when they differ by at most this fraction
CREDIT_REL_TOL = 1e-9
FLOPS_PER_TFLOP = 10**12
#: the versions of the credit formula a receipt may name, and what each computes;
#: both sides sign the version with the figure, so a change of formula cannot pass
#: as a disagreement about one job
CREDIT_FORMULAS = {
    1: "model FLOPs per sample (forward) x samples trained x 3",
    2: "model FLOPs per sample (forward; a program's: torch.utils.flop_counter.FlopCounterMode "
    "of torch 2.13 on the meta device) x samples trained x (3, or with model.trainable "
    "2 + trainable / all parameters, in integers)",
}
CREDIT_FORMULA = 2  # the one this code computes (`flops_to_credit`); 1 on receipts before it

RECEIPT_LIMITS = Limits(
    max_bytes=MAX_RECEIPT_BYTES,
    max_depth=2,  # envelope map; payload: Receipt map -> metrics map
    max_container_len=64,
    max_str_len=128,
    max_bin_len=MAX_RECEIPT_BYTES,
)
COSIGNED_LIMITS = Limits(
    max_bytes=MAX_RECEIPT_BYTES + 512,
    max_depth=1,
    max_container_len=8,
    max_str_len=64,
    max_bin_len=MAX_RECEIPT_BYTES,
)

OWNER_DOMAIN = b"meshminer/cosigned-receipt/owner/1\x00"
WORKER_DOMAIN = b"meshminer/cosigned-receipt/worker/1\x00"
_KEYS = ("t", "v", "receipt", "credit", "credit_formula", "owner_sig", "worker_sig")

Role = Literal["owner", "worker"]


def flops_to_credit(training_flops: int) -> float:
    """Credit in TFLOP for a job's `training_flops` (training.budget.SpecSummary)."""
    return training_flops / FLOPS_PER_TFLOP


_FLOP_UNITS = ((1e6, "EFLOP"), (1e3, "PFLOP"), (1.0, "TFLOP"), (1e-3, "GFLOP"),
               (1e-6, "MFLOP"), (1e-9, "kFLOP"))  # fmt: skip


def credit_text(tflop: float) -> str:
    """Credit as people read it: 1.32096e-05 TFLOP is "13.2 MFLOP"."""
    size = abs(tflop)
    if size == 0:
        return "0 FLOP"
    for scale, unit in _FLOP_UNITS:
        if size >= scale:
            return f"{tflop / scale:.3g} {unit}"
    return f"{tflop * 1e12:.3g} FLOP"


#: the weights hash of a receipt for work that returned no weights (a pruned trial):
#: the sha256 of no bytes
NO_WEIGHTS_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def partial_credit(credit: float, steps: int, total_steps: int) -> float:
    """The share of a unit's `credit` for `steps` of its `total_steps`: what a trial
    the sweep's pruner stopped earns (both sides compute it from the step it names)."""
    return credit * min(max(steps, 0), total_steps) / max(total_steps, 1)


def credit_matches(a: float, b: float) -> bool:
    """True when two credit figures agree to within `CREDIT_REL_TOL` (both finite)."""
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=CREDIT_REL_TOL)


def claim_bytes(role: Role, receipt: bytes, credit: float, formula: int = CREDIT_FORMULA) -> bytes:
    """The exact bytes `role` signs for this receipt, credit and credit formula."""
    domain = OWNER_DOMAIN if role == "owner" else WORKER_DOMAIN
    return domain + encode([receipt, float(credit), formula])


@dataclass(frozen=True)
class CoSignedReceipt:
    """A Receipt envelope with its credit, signed by the owner and the worker."""

    TYPE: ClassVar[str] = "cosigned_receipt"
    VERSION: ClassVar[int] = 2

    receipt: bytes  # the owner's sealed Receipt envelope, byte for byte
    credit: float  # TFLOP, from the job spec by `credit_formula`
    owner_sig: bytes  # owner's signature over claim_bytes("owner", receipt, credit, formula)
    worker_sig: bytes  # worker's over claim_bytes("worker", ...); b"" until countersigned
    credit_formula: int = CREDIT_FORMULA  # a key of CREDIT_FORMULAS

    def check(self, path: str) -> None:
        if not 0 < len(self.receipt) <= MAX_RECEIPT_BYTES:
            raise DecodeError(f"{path}.receipt must be 1..{MAX_RECEIPT_BYTES} bytes")
        if not (math.isfinite(self.credit) and 0 <= self.credit <= MAX_CREDIT_TFLOP):
            raise DecodeError(f"{path}.credit must be a finite number in 0..{MAX_CREDIT_TFLOP:g}")
        if len(self.owner_sig) != 64:
            raise DecodeError(f"{path}.owner_sig must be a 64-byte Ed25519 signature")
        if len(self.worker_sig) not in (0, 64):
            raise DecodeError(f"{path}.worker_sig must be empty or a 64-byte Ed25519 signature")
        if self.credit_formula not in CREDIT_FORMULAS:
            known = "; ".join(f"{k} = {v}" for k, v in CREDIT_FORMULAS.items())
            raise DecodeError(
                f"{path}.credit_formula {self.credit_formula!r:.20} is not one this node knows "
                f"({known}); a newer meshminer may know it"
            )

    @property
    def countersigned(self) -> bool:
        return len(self.worker_sig) == 64

    def to_bytes(self) -> bytes:
        return encode(
            {
                "t": self.TYPE,
                "v": self.VERSION,
                "receipt": self.receipt,
                "credit": float(self.credit),
                "credit_formula": self.credit_formula,
                "owner_sig": self.owner_sig,
                "worker_sig": self.worker_sig,
            }
        )


@dataclass(frozen=True)
class VerifiedReceipt:
    """A co-signed receipt whose signatures have been checked."""

    cosigned: CoSignedReceipt
    receipt: Receipt
    raw: bytes  # the CoSignedReceipt bytes as received

    @property
    def owner(self) -> str:
        return self.receipt.owner

    @property
    def worker(self) -> str:
        return self.receipt.worker

    @property
    def credit(self) -> float:
        return self.cosigned.credit

    @property
    def job_id(self) -> str:
        return self.receipt.job_id

    @property
    def unit_id(self) -> str:
        return self.receipt.unit_id


def peer_key(peer_id: str) -> bytes:
    """`public_key_from_peer_id`, cached: a ledger names the same few peers over and
    over, and base58 in pure Python is the slowest step of checking a receipt."""
    if not isinstance(peer_id, str):
        raise DecodeError(f"a peer id is a string, got {type(peer_id).__name__}")
    return _peer_key(peer_id)


_peer_key = functools.lru_cache(maxsize=4096)(public_key_from_peer_id)


def parse_cosigned(data: bytes) -> CoSignedReceipt:
    """Decode the outer structure only (no signature checks); `DecodeError`/`TooLarge`."""
    value = decode(data, COSIGNED_LIMITS)
    if not isinstance(value, dict) or tuple(value) != _KEYS:
        raise DecodeError(f"not a co-signed receipt (expected keys {', '.join(_KEYS)} in order)")
    version = value["v"]
    if (
        value["t"] != CoSignedReceipt.TYPE
        or type(version) is not int
        or version != CoSignedReceipt.VERSION
    ):
        raise DecodeError(
            f"expected a {CoSignedReceipt.TYPE} v{CoSignedReceipt.VERSION}, "
            f"got {str(value['t'])[:64]} v{str(version)[:16]}"
        )
    receipt, credit = value["receipt"], value["credit"]
    owner_sig, worker_sig = value["owner_sig"], value["worker_sig"]
    for name, field in (("receipt", receipt), ("owner_sig", owner_sig), ("worker_sig", worker_sig)):
        if type(field) is not bytes:
            raise DecodeError(f"{CoSignedReceipt.TYPE}.{name} must be bytes")
    if type(credit) is not float:  # always written as float64, never as an integer
        raise DecodeError(f"{CoSignedReceipt.TYPE}.credit must be a float")
    formula = value["credit_formula"]
    if type(formula) is not int:
        raise DecodeError(f"{CoSignedReceipt.TYPE}.credit_formula must be an integer")
    cosigned = CoSignedReceipt(receipt, credit, owner_sig, worker_sig, formula)
    cosigned.check(CoSignedReceipt.TYPE)
    return cosigned


def open_receipt(envelope: bytes) -> Receipt:
    """Open a Receipt envelope and check it is sealed by its own `owner`, who is not
    its `worker` (a node cannot earn credit from itself)."""
    signed = open_envelope(envelope, Receipt, limits=RECEIPT_LIMITS)
    receipt = signed.message
    owner_key = peer_key(receipt.owner)  # both must be Ed25519 peer ids
    peer_key(receipt.worker)
    if signed.signer_key != owner_key:
        raise SignerMismatch(
            f"receipt names owner {receipt.owner} but is sealed by {signed.signer}"
        )
    if receipt.owner == receipt.worker:
        raise DecodeError("receipt names the same peer as owner and worker")
    return receipt


@dataclass(frozen=True)
class ReceiptHeader:
    """Who and what a receipt is about, read without checking its seal."""

    job_id: str
    unit_id: str
    owner: str
    worker: str
    sealer_key: bytes  # the key in the envelope (its signature is *not* checked here)


def peek_receipt(envelope: bytes) -> ReceiptHeader:
    """The ids and parties of a Receipt envelope, *without* checking the seal or the
    other fields: for re-reading receipts whose bytes are already covered by a checked
    signature (the owner's claim signs the whole envelope). `DecodeError`/`TooLarge`."""
    outer = decode(envelope, RECEIPT_LIMITS)
    if not isinstance(outer, dict) or set(outer) != {"t", "v", "p", "k", "s"}:
        raise DecodeError("not a signed envelope (expected keys t, v, p, k, s)")
    if outer["t"] != Receipt.TYPE or type(outer["v"]) is not int or outer["v"] != Receipt.VERSION:
        raise DecodeError(f"expected a {Receipt.TYPE} envelope")
    payload, key = outer["p"], outer["k"]
    if type(payload) is not bytes or type(key) is not bytes or len(key) != 32:
        raise DecodeError("receipt envelope payload and key must be bytes (key: 32)")
    fields = _decode_shallow(payload)
    names = ("job_id", "unit_id", "owner", "worker")
    if not isinstance(fields, dict) or any(type(fields.get(n)) is not str for n in names):
        raise DecodeError("receipt payload must hold job_id, unit_id, owner and worker as text")
    return ReceiptHeader(*(fields[n] for n in names), sealer_key=key)


def _decode_shallow(payload: bytes) -> Any:
    """`decode` with RECEIPT_LIMITS' size limits but without walking the result for its
    depth (that walk, in Python, is most of the cost of re-reading a stored receipt).
    Only for `peek_receipt`, which then reads four top-level text fields and nothing
    else; msgpack's own stack bound still refuses deep nesting."""
    if len(payload) > RECEIPT_LIMITS.max_bytes:
        raise TooLarge(f"receipt payload is {len(payload)} bytes")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            max_str_len=RECEIPT_LIMITS.max_str_len,
            max_bin_len=RECEIPT_LIMITS.max_bin_len,
            max_array_len=RECEIPT_LIMITS.max_container_len,
            max_map_len=RECEIPT_LIMITS.max_container_len,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise DecodeError(f"receipt payload is not valid msgpack: {type(exc).__name__}") from exc


def verify_claim(role: Role, peer_id: str, cosigned: CoSignedReceipt, sig: bytes) -> None:
    """Check `peer_id`'s signature in `role` over `cosigned`, or raise `SignatureError`."""
    key = peer_key(peer_id)
    claim = claim_bytes(role, cosigned.receipt, cosigned.credit, cosigned.credit_formula)
    try:
        VerifyKey(key).verify(claim, sig)
    except (BadSignatureError, CryptoError, ValueError) as exc:
        raise SignatureError(
            f"the {role} signature on the receipt does not verify against {role} {peer_id}"
        ) from exc


def issue(receipt: bytes, credit: float, owner_key: SigningKey) -> bytes:
    """Owner: wrap a Receipt envelope this node sealed, with the spec's credit, and sign.

    Returns a half-signed CoSignedReceipt (no worker signature yet) to send to the
    worker. Raises `ProtocolError` if the receipt is not this key's or `credit` is bad.
    """
    parsed = open_receipt(receipt)
    signer = peer_id_from_public_key(bytes(owner_key.verify_key))
    if parsed.owner != signer:
        raise SignerMismatch(f"receipt names owner {parsed.owner}; this key is {signer}")
    sig = owner_key.sign(claim_bytes("owner", receipt, credit)).signature
    cosigned = CoSignedReceipt(receipt, float(credit), sig, b"")
    cosigned.check(CoSignedReceipt.TYPE)
    return cosigned.to_bytes()


def countersign(half_signed: bytes, worker_key: SigningKey, expected_credit: float) -> bytes:
    """Worker: check the owner's half-signed receipt and add this node's signature.

    `expected_credit` is the worker's own figure from the job spec; a receipt whose
    credit differs (beyond `CREDIT_REL_TOL`) raises `CreditMismatch` and is not signed.
    Returns the complete CoSignedReceipt bytes.
    """
    cosigned = parse_cosigned(half_signed)
    receipt = open_receipt(cosigned.receipt)
    verify_claim("owner", receipt.owner, cosigned, cosigned.owner_sig)
    signer = peer_id_from_public_key(bytes(worker_key.verify_key))
    if receipt.worker != signer:
        raise SignerMismatch(f"receipt names worker {receipt.worker}; this key is {signer}")
    if not credit_matches(cosigned.credit, expected_credit):
        raise CreditMismatch(
            f"the owner offers {cosigned.credit!r} TFLOP for unit {receipt.unit_id}, but the "
            f"job spec gives {expected_credit!r} TFLOP; not countersigning"
        )
    claim = claim_bytes("worker", cosigned.receipt, cosigned.credit, cosigned.credit_formula)
    return dataclasses.replace(cosigned, worker_sig=worker_key.sign(claim).signature).to_bytes()


def open_cosigned(data: bytes) -> VerifiedReceipt:
    """Check a complete co-signed receipt: structure, the Receipt envelope's seal by its
    owner, the owner's and the worker's claim signatures.

    Raises `TooLarge`, `DecodeError`, `SignatureError` or `SignerMismatch` (all
    `ProtocolError`) and nothing else.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"a co-signed receipt is bytes, got {type(data).__name__}")
    data = bytes(data)
    cosigned = parse_cosigned(data)
    if not cosigned.countersigned:
        raise SignatureError("the receipt is not countersigned by its worker")
    receipt = open_receipt(cosigned.receipt)
    verify_claim("owner", receipt.owner, cosigned, cosigned.owner_sig)
    verify_claim("worker", receipt.worker, cosigned, cosigned.worker_sig)
    return VerifiedReceipt(cosigned=cosigned, receipt=receipt, raw=data)
