"""The ledger: appends, verify, balances, export; tampering on a copy; bad input refused
with the ledger unchanged; the co-signed receipt format."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_factories import (
    DIGITS_CREDIT,
    copy_ledger,
    cosigned,
    forged_cosigned,
    key_from,
    peer_id_of,
    read_rows,
    receipt_envelope,
    rechain,
    tamper,
)
from nacl.signing import SigningKey

from ledger import (
    CorruptLedger,
    CreditMismatch,
    DuplicateUnit,
    ForeignLedger,
    InvalidArgument,
    InvalidReceipt,
    Ledger,
    LedgerError,
    NotOurReceipt,
)
from ledger.entry import COLUMNS
from protocol import Limits, ProtocolError, decode
from protocol.receipts import (
    CoSignedReceipt,
    countersign,
    flops_to_credit,
    issue,
    open_cosigned,
    parse_cosigned,
    peek_receipt,
)

NODE = key_from(1)
PEER = key_from(2)
OTHER = key_from(3)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(tmp_path / "node", NODE) as opened:
        yield opened


def fill(ledger: Ledger, n: int) -> None:
    """n entries after the genesis: work done, work received and rejected, in turn."""
    for i in range(n):
        if i % 3 == 0:
            receipt = cosigned(PEER, NODE, 0.5 + i, unit_id=f"{i:016x}")
            ledger.append_work("work_done", receipt, 0.5 + i, 0.5 + i)
        elif i % 3 == 1:
            receipt = cosigned(NODE, PEER, 0.25, unit_id=f"{i:016x}")
            ledger.append_work("work_received", receipt, 0.25, 0.25)
        else:
            ledger.append_rejected(
                "026ab639c21df8aa", f"u{i}", peer_id_of(PEER), ledger.peer_id, f"bad {i}"
            )


def state(ledger: Ledger) -> tuple[int, bytes]:
    return ledger.count(), ledger.head().hash


# -- genesis and opening -----------------------------------------------------------------


def test_genesis_is_signed_by_the_node_and_records_its_key(ledger: Ledger) -> None:
    [genesis] = ledger.entries()
    assert (genesis.seq, genesis.kind, genesis.prev_hash) == (0, "genesis", bytes(32))
    assert genesis.owner == genesis.worker == peer_id_of(NODE)
    assert decode(genesis.payload) == {"public_key": bytes(NODE.verify_key)}
    NODE.verify_key.verify(genesis.body(), genesis.owner_sig)
    assert genesis.computed_hash() == genesis.hash
    assert ledger.verify().ok


def test_reopening_keeps_the_chain(tmp_path: Path) -> None:
    with Ledger.open(tmp_path, NODE) as first:
        fill(first, 4)
        head = first.head()
    with Ledger.open(tmp_path, NODE) as again:
        assert again.head() == head
        assert again.count() == 5
        again.append_rejected("j", "u", peer_id_of(PEER), again.peer_id, "late")
        assert again.verify().ok


def test_a_ledger_started_by_another_key_is_refused(tmp_path: Path) -> None:
    Ledger.open(tmp_path, NODE).close()
    with pytest.raises(ForeignLedger) as err:
        Ledger.open(tmp_path, OTHER)
    assert peer_id_of(NODE) in str(err.value) and peer_id_of(OTHER) in str(err.value)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(CorruptLedger, match="not an SQLite database|cannot be read"):
        Ledger.open(tmp_path, NODE)


def test_a_database_with_another_entries_table_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "ledger.db"))
    conn.execute("CREATE TABLE entries (seq INTEGER PRIMARY KEY, note TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(CorruptLedger, match="not a ledger's"):
        Ledger.open(tmp_path, NODE)


def test_a_tampered_genesis_is_refused_at_open(tmp_path: Path) -> None:
    Ledger.open(tmp_path / "a", NODE).close()
    tamper(tmp_path / "a", ("UPDATE entries SET ts = ts + 1 WHERE seq = 0", ()))
    with pytest.raises(CorruptLedger, match="seq 0: hash does not match"):
        Ledger.open(tmp_path / "a", NODE)


def test_updates_and_deletes_are_refused_by_the_database(ledger: Ledger) -> None:
    conn = sqlite3.connect(str(ledger.path))
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE entries SET credit = 1 WHERE seq = 0")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM entries")
    conn.close()


# -- appends and balances ----------------------------------------------------------------


def test_work_entries_carry_the_cosigned_receipt_and_its_signatures(ledger: Ledger) -> None:
    receipt = cosigned(
        PEER, NODE, DIGITS_CREDIT, job_id="348e5c2415f23c9c", unit_id="553f26abeeebe4be"
    )
    entry = ledger.append_work("work_done", receipt, DIGITS_CREDIT, DIGITS_CREDIT)
    parsed = parse_cosigned(entry.payload)
    assert entry.payload == receipt
    assert (entry.seq, entry.kind, entry.job_id, entry.unit_id) == (
        1,
        "work_done",
        "348e5c2415f23c9c",
        "553f26abeeebe4be",
    )
    assert (entry.owner, entry.worker, entry.credit) == (
        peer_id_of(PEER),
        peer_id_of(NODE),
        DIGITS_CREDIT,
    )
    assert (entry.owner_sig, entry.worker_sig) == (parsed.owner_sig, parsed.worker_sig)
    assert entry.prev_hash == ledger.entries()[0].hash
    assert ledger.verify().ok


def test_balances_count_earned_spent_and_rejected(ledger: Ledger) -> None:
    fill(ledger, 9)  # done at i = 0, 3, 6; received at 1, 4, 7; rejected at 2, 5, 8
    balances = ledger.balances()
    assert balances["earned"] == pytest.approx(0.5 + 3.5 + 6.5)
    assert balances["spent"] == pytest.approx(0.75)
    assert balances["net"] == pytest.approx(10.5 - 0.75)
    assert (balances["work_done"], balances["work_received"], balances["rejected"]) == (3, 3, 3)
    assert balances["entries"] == 10 and balances["unit"] == "TFLOP"
    assert balances["peer_id"] == peer_id_of(NODE)


def test_the_identical_receipt_again_returns_the_existing_entry(ledger: Ledger) -> None:
    receipt = cosigned(PEER, NODE)
    first = ledger.append_work("work_done", receipt, DIGITS_CREDIT, DIGITS_CREDIT)
    again = ledger.append_work("work_done", receipt, DIGITS_CREDIT, DIGITS_CREDIT)
    assert again == first and ledger.count() == 2


def test_a_second_receipt_for_the_same_unit_is_refused(ledger: Ledger) -> None:
    ledger.append_work(
        "work_done", cosigned(PEER, NODE, issued_at=1.0), DIGITS_CREDIT, DIGITS_CREDIT
    )
    before = state(ledger)
    reissued = cosigned(PEER, NODE, issued_at=2.0)
    with pytest.raises(
        DuplicateUnit, match="seq 1 already records work_done for unit d1b608530bb248d3"
    ):
        ledger.append_work("work_done", reissued, DIGITS_CREDIT, DIGITS_CREDIT)
    assert state(ledger) == before
    # the same unit id under another owner is another unit
    ledger.append_work("work_done", cosigned(OTHER, NODE), DIGITS_CREDIT, DIGITS_CREDIT)


def test_the_duplicate_lookup_uses_the_index_not_a_scan(ledger: Ledger) -> None:
    from ledger.chain import _SELECT_UNIT

    plan = sqlite3.connect(str(ledger.path)).execute(
        "EXPLAIN QUERY PLAN " + _SELECT_UNIT, ("work_done", "o", "j", "u")
    )
    assert "INDEX entries_work_unit" in " ".join(str(row) for row in plan)


def test_credit_within_the_tolerance_is_accepted_and_the_signed_value_stored(
    ledger: Ledger,
) -> None:
    near = DIGITS_CREDIT * (1 + 1e-12)
    entry = ledger.append_work("work_done", cosigned(PEER, NODE), near, near)
    assert entry.credit == DIGITS_CREDIT


@pytest.mark.parametrize("which", ["expected_credit", "credit"])
def test_a_receipt_whose_credit_disagrees_is_refused(ledger: Ledger, which: str) -> None:
    before = state(ledger)
    figures = {"credit": DIGITS_CREDIT, "expected_credit": DIGITS_CREDIT}
    figures[which] = DIGITS_CREDIT * (1 + 1e-6)
    with pytest.raises(CreditMismatch, match=f"{which} is .* TFLOP") as err:
        ledger.append_work("work_done", cosigned(PEER, NODE), **figures)
    assert "unit d1b608530bb248d3 of job 026ab639c21df8aa" in str(err.value)
    assert state(ledger) == before


def test_a_receipt_that_does_not_name_this_node_in_the_role_is_refused(ledger: Ledger) -> None:
    before = state(ledger)
    with pytest.raises(NotOurReceipt, match="as worker"):  # this node was the owner
        ledger.append_work("work_done", cosigned(NODE, PEER), DIGITS_CREDIT, DIGITS_CREDIT)
    with pytest.raises(NotOurReceipt, match="as owner"):  # a receipt between two others
        ledger.append_work("work_received", cosigned(PEER, OTHER), DIGITS_CREDIT, DIGITS_CREDIT)
    assert state(ledger) == before


def flip_worker_sig(data: bytes) -> bytes:
    parsed = parse_cosigned(data)
    bad = bytes([parsed.worker_sig[0] ^ 1]) + parsed.worker_sig[1:]
    return CoSignedReceipt(parsed.receipt, parsed.credit, parsed.owner_sig, bad).to_bytes()


BAD_RECEIPTS = {
    "worker signature flipped": (lambda: flip_worker_sig(cosigned(PEER, NODE)), "worker"),
    "countersigned by someone other than the worker": (
        lambda: forged_cosigned(PEER, NODE, worker_signer=OTHER),
        "worker signature on the receipt does not verify",
    ),
    "owner claim signed by someone else": (
        lambda: forged_cosigned(PEER, NODE, owner_signer=OTHER),
        "owner signature on the receipt does not verify",
    ),
    "receipt sealed by someone other than its owner": (
        lambda: forged_cosigned(PEER, NODE, sealer=OTHER),
        "sealed by",
    ),
    "credit changed after signing": (
        lambda: _with_credit(cosigned(PEER, NODE), DIGITS_CREDIT * 2),
        "does not verify",
    ),
    "not countersigned": (
        lambda: issue(receipt_envelope(PEER, NODE), DIGITS_CREDIT, PEER),
        "not countersigned",
    ),
    "owner is the worker": (lambda: forged_cosigned(NODE, NODE), "same peer as owner and worker"),
    "negative credit": (lambda: forged_cosigned(PEER, NODE, -1.0), "credit must be"),
    "garbage": (lambda: b"\x00garbage", "not valid msgpack|not a co-signed receipt"),
    "a plain receipt envelope": (lambda: receipt_envelope(PEER, NODE), "not a co-signed"),
    "oversized": (lambda: b"\x00" * 20_000, "limit"),
}


def _with_credit(data: bytes, credit: float) -> bytes:
    parsed = parse_cosigned(data)
    return CoSignedReceipt(parsed.receipt, credit, parsed.owner_sig, parsed.worker_sig).to_bytes()


@pytest.mark.parametrize("case", sorted(BAD_RECEIPTS))
def test_bad_receipts_are_refused_with_a_reason_and_nothing_written(
    ledger: Ledger, case: str
) -> None:
    fill(ledger, 3)
    before = state(ledger)
    make, reason = BAD_RECEIPTS[case]
    with pytest.raises(InvalidReceipt, match=reason) as err:
        ledger.append_work("work_done", make(), DIGITS_CREDIT, DIGITS_CREDIT)
    assert str(err.value).startswith("co-signed receipt refused: ")
    assert err.value.reason in ("bad_signature", "signer_mismatch", "malformed", "oversized")
    assert state(ledger) == before
    assert ledger.verify().ok


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "genesis"},
        {"kind": "rejected"},
        {"credit": float("nan")},
        {"expected_credit": float("inf")},
        {"credit": -1.0},
        {"expected_credit": "1.0"},
        {"credit": True},
    ],
)
def test_bad_arguments_to_append_work_are_refused(ledger: Ledger, kwargs: dict) -> None:
    args = {
        "kind": "work_done",
        "cosigned": cosigned(PEER, NODE),
        "credit": DIGITS_CREDIT,
        "expected_credit": DIGITS_CREDIT,
    }
    with pytest.raises(InvalidArgument):
        ledger.append_work(**{**args, **kwargs})
    assert ledger.count() == 1


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2048))
def test_garbage_bytes_raise_only_typed_errors(ledger: Ledger, data: bytes) -> None:
    before = state(ledger)
    with pytest.raises(LedgerError):
        ledger.append_work("work_done", data, 1.0, 1.0)
    assert state(ledger) == before


VALID = cosigned(PEER, NODE)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(0, len(VALID) - 1), xor=st.integers(1, 255))
def test_any_changed_byte_of_a_valid_receipt_is_refused(
    ledger: Ledger, position: int, xor: int
) -> None:
    before = state(ledger)
    mutated = bytearray(VALID)
    mutated[position] ^= xor
    with pytest.raises(LedgerError):
        ledger.append_work("work_done", bytes(mutated), DIGITS_CREDIT, DIGITS_CREDIT)
    assert state(ledger) == before


PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.floats()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=40)
    | st.binary(max_size=80),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=20,
)
#: maps with the co-signed receipt's keys, in order, holding anything
SHAPED = st.fixed_dictionaries(
    {
        "t": st.sampled_from(["cosigned_receipt", "receipt"]) | PLAIN,
        "v": st.sampled_from([1, True, 2, 1.0]) | PLAIN,
        "receipt": st.sampled_from([receipt_envelope(PEER, NODE), b""]) | PLAIN,
        "credit": st.floats() | PLAIN,
        "owner_sig": st.binary(min_size=64, max_size=64) | PLAIN,
        "worker_sig": st.binary(min_size=64, max_size=64) | PLAIN,
    }
)


@settings(max_examples=300, deadline=None)
@given(msg=PLAIN | SHAPED)
def test_msgpack_shaped_garbage_is_a_protocol_error(msg: object) -> None:
    data = msgpack.packb(msg, use_bin_type=True)
    with pytest.raises(ProtocolError):
        open_cosigned(data)


@settings(max_examples=300, deadline=None)
@given(envelope=st.binary(max_size=512) | PLAIN.map(lambda v: msgpack.packb(v, use_bin_type=True)))
def test_peeking_at_a_stored_receipt_raises_only_protocol_errors(envelope: bytes) -> None:
    """verify reads stored receipts with peek_receipt before any signature is checked."""
    with contextlib.suppress(ProtocolError):
        peek_receipt(envelope)


def test_rejected_entries_hold_the_reason_and_the_node_signature(ledger: Ledger) -> None:
    entry = ledger.append_rejected(
        "c37bd1a8462d7ad6", "2f3c64ad0364f2a9", peer_id_of(PEER), ledger.peer_id, "x" * 5000
    )
    assert entry.kind == "rejected" and entry.credit == 0.0 and entry.worker_sig == b""
    assert decode(entry.payload, Limits(max_str_len=5000)) == {"reason": "x" * 4000}
    NODE.verify_key.verify(entry.body(), entry.owner_sig)
    assert ledger.verify().ok


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"worker": "not a peer id"}, "worker must be a peer id"),
        ({"owner": ""}, "owner must be a peer id"),
        ({"reason": ""}, "reason must be"),
        ({"job_id": "j" * 129}, "job_id must be"),
        ({"unit_id": 7}, "unit_id must be"),
    ],
)
def test_bad_arguments_to_append_rejected_are_refused(
    ledger: Ledger, kwargs: dict, match: str
) -> None:
    args = {
        "job_id": "j",
        "unit_id": "u",
        "worker": peer_id_of(PEER),
        "owner": ledger.peer_id,
        "reason": "why",
    }
    with pytest.raises(InvalidArgument, match=match):
        ledger.append_rejected(**{**args, **kwargs})
    assert ledger.count() == 1


def test_invalidated_entries_hold_the_evidence_and_verify(ledger: Ledger) -> None:
    evidence = b"\x01" * 150_000  # the signed Evidence: large, it holds the worker's result
    entry = ledger.append_invalidated(
        "c37bd1a8462d7ad6", "2f3c64ad0364f2a9", peer_id_of(PEER), ledger.peer_id, "replay", evidence
    )
    assert entry.kind == "invalidated" and entry.credit == 0.0 and entry.worker_sig == b""
    payload = decode(entry.payload, Limits(max_bytes=200_000, max_bin_len=200_000))
    assert payload == {"reason": "replay", "evidence": evidence}
    NODE.verify_key.verify(entry.body(), entry.owner_sig)
    assert ledger.verify().ok
    balances = ledger.balances()
    assert (balances["invalidated"], balances["spent"], balances["earned"]) == (1, 0.0, 0.0)


@pytest.mark.parametrize("evidence", [b"", "text", None])
def test_invalidated_without_evidence_is_refused(ledger: Ledger, evidence: object) -> None:
    with pytest.raises(InvalidArgument, match="evidence must be"):
        ledger.append_invalidated(
            "j",
            "u",
            peer_id_of(PEER),
            ledger.peer_id,
            "why",
            evidence,  # type: ignore[arg-type]
        )
    assert ledger.count() == 1


def test_concurrent_appenders_on_two_connections_keep_one_chain(tmp_path: Path) -> None:
    first = Ledger.open(tmp_path, NODE)
    second = Ledger.open(tmp_path, NODE)

    def append(ledger: Ledger, tag: str) -> None:
        for i in range(150):
            ledger.append_rejected("j", f"{tag}{i}", peer_id_of(PEER), ledger.peer_id, "r")

    threads = [
        threading.Thread(target=append, args=(ledger, f"{name}{n}"))
        for n in range(2)
        for name, ledger in (("a", first), ("b", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = first.verify()
    assert report.ok, report.error
    assert report.entries == 601 and report.head_seq == 600
    first.close()
    second.close()


# -- reading ------------------------------------------------------------------------------


def test_entries_pages_in_seq_order(ledger: Ledger) -> None:
    fill(ledger, 12)
    assert [e.seq for e in ledger.entries(limit=5)] == [0, 1, 2, 3, 4]
    assert [e.seq for e in ledger.entries(after=4, limit=5)] == [5, 6, 7, 8, 9]
    assert [e.seq for e in ledger.entries(after=9)] == [10, 11, 12]
    assert ledger.entries(after=12) == []


@pytest.mark.parametrize("kwargs", [{"limit": 1001}, {"limit": 0}, {"after": -2}, {"limit": 1.5}])
def test_entries_limits_are_bounded(ledger: Ledger, kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        ledger.entries(**kwargs)


def test_entry_to_json_is_hex_for_bytes(ledger: Ledger) -> None:
    fill(ledger, 1)
    plain = ledger.entries()[1].to_json()
    assert list(plain) == list(COLUMNS)
    assert json.loads(json.dumps(plain)) == plain
    assert bytes.fromhex(plain["payload"]) == ledger.entries()[1].payload
    assert len(plain["hash"]) == 64


def test_export_csv_and_jsonl_hold_every_entry(ledger: Ledger) -> None:
    fill(ledger, 7)
    entries = ledger.entries()
    out = io.StringIO()
    assert ledger.export("jsonl", out) == 8
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [e.to_json() for e in entries]
    out = io.StringIO()
    assert ledger.export("csv", out) == 8
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [int(r["seq"]) for r in rows] == list(range(8))
    assert [float(r["credit"]) for r in rows] == [e.credit for e in entries]
    assert [bytes.fromhex(r["hash"]) for r in rows] == [e.hash for e in entries]
    with pytest.raises(InvalidArgument, match="csv, jsonl"):
        ledger.export("xml", io.StringIO())


# -- tampering with a copy ----------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A ledger of 21 entries, closed; tests tamper with copies of it."""
    with Ledger.open(tmp_path / "original", NODE) as ledger:
        fill(ledger, 20)
        assert ledger.verify().ok
    return tmp_path / "original"


def verify_copy(filled: Path, tmp_path: Path, *statements: tuple[str, tuple]) -> object:
    copy = copy_ledger(filled, tmp_path / "copy")
    tamper(copy, *statements)
    with Ledger.open(copy, NODE) as ledger:
        return ledger.verify()


def _byte_flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_a_changed_payload_byte_is_named(filled: Path, tmp_path: Path) -> None:
    payload = read_rows(filled)[17].payload
    report = verify_copy(
        filled,
        tmp_path,
        ("UPDATE entries SET payload = ? WHERE seq = 17", (_byte_flipped(payload, 40),)),
    )
    assert not report.ok
    assert report.first_bad_seq == 17
    assert report.error == "seq 17: hash does not match its contents"


def test_a_changed_credit_is_named(filled: Path, tmp_path: Path) -> None:
    report = verify_copy(
        filled, tmp_path, ("UPDATE entries SET credit = credit * 10 WHERE seq = 10", ())
    )
    assert (report.first_bad_seq, report.error) == (10, "seq 10: hash does not match its contents")


def test_a_changed_hash_is_named(filled: Path, tmp_path: Path) -> None:
    digest = read_rows(filled)[9].hash
    report = verify_copy(
        filled, tmp_path, ("UPDATE entries SET hash = ? WHERE seq = 9", (_byte_flipped(digest, 0),))
    )
    assert report.error == "seq 9: hash does not match its contents"
    assert "seq 10: prev_hash does not link to seq 9" in report.problems


def test_a_deleted_row_is_named_as_a_gap(filled: Path, tmp_path: Path) -> None:
    report = verify_copy(filled, tmp_path, ("DELETE FROM entries WHERE seq = 9", ()))
    assert report.first_bad_seq == 9
    assert report.error == "seq 9 missing (seq jumps from 8 to 10)"


def test_a_deleted_tail_is_not_detectable_but_the_rest_verifies(
    filled: Path, tmp_path: Path
) -> None:
    # truncation leaves a valid shorter chain: the head hash, kept elsewhere, is the defence
    report = verify_copy(filled, tmp_path, ("DELETE FROM entries WHERE seq >= 18", ()))
    assert report.ok and report.head_seq == 17


def test_two_swapped_rows_are_named(filled: Path, tmp_path: Path) -> None:
    report = verify_copy(
        filled,
        tmp_path,
        ("UPDATE entries SET seq = -1 WHERE seq = 4", ()),
        ("UPDATE entries SET seq = 4 WHERE seq = 5", ()),
        ("UPDATE entries SET seq = 5 WHERE seq = -1", ()),
    )
    assert report.first_bad_seq == 4
    assert report.error == "seq 4: hash does not match its contents"


def test_an_edit_with_the_chain_rehashed_is_caught_by_the_signatures(
    filled: Path, tmp_path: Path
) -> None:
    copy = copy_ledger(filled, tmp_path / "copy")
    # seq 6 is a rejected entry (fill: seq 1, 4, 7... done; 2, 5, 8... received; 3, 6... rejected)
    tamper(copy, ("UPDATE entries SET payload = ? WHERE seq = 6", (b"\x81\xa6reason\xa3lie",)))
    rechain(copy, 6)
    with Ledger.open(copy, NODE) as ledger:
        report = ledger.verify()
    assert report.error == "seq 6: node signature does not verify"
    # the node signs prev_hash too: every later entry it signed is broken by the re-hash
    assert report.problems == [
        f"seq {s}: node signature does not verify" for s in (6, 9, 12, 15, 18)
    ]


def test_a_rehashed_credit_edit_is_caught_by_the_receipt(filled: Path, tmp_path: Path) -> None:
    copy = copy_ledger(filled, tmp_path / "copy")
    tamper(copy, ("UPDATE entries SET credit = 99.0 WHERE seq = 7", ()))
    rechain(copy, 7)
    with Ledger.open(copy, NODE) as ledger:
        report = ledger.verify()
    assert report.error == "seq 7: credit column does not match the co-signed receipt"


def test_a_forged_countersignature_with_the_chain_rehashed_is_named(
    filled: Path, tmp_path: Path
) -> None:
    entry = read_rows(filled)[4]
    forged = flip_worker_sig(entry.payload)
    copy = copy_ledger(filled, tmp_path / "copy")
    tamper(
        copy,
        (
            "UPDATE entries SET payload = ?, worker_sig = ? WHERE seq = 4",
            (forged, parse_cosigned(forged).worker_sig),
        ),
    )
    rechain(copy, 4)
    with Ledger.open(copy, NODE) as ledger:
        report = ledger.verify()
    assert (report.first_bad_seq, report.error) == (4, "seq 4: worker signature does not verify")


def test_verify_reports_counts_on_a_good_ledger(filled: Path) -> None:
    with Ledger.open(filled, NODE) as ledger:
        report = ledger.verify(threads=1)
        assert report.ok and report.error is None and report.first_bad_seq is None
        assert (report.entries, report.head_seq) == (21, 20)
        assert report.head_hash == ledger.head().hash
        # genesis 1 + 7 rejected x 1 + 14 work x 2
        assert report.signatures_checked == 1 + 6 + 14 * 2
        assert report.to_json()["ok"] is True and "ledger ok" in str(report)


# -- the co-signed receipt format --------------------------------------------------------


def test_the_worker_will_not_countersign_a_credit_it_does_not_compute() -> None:
    half = issue(receipt_envelope(PEER, NODE), DIGITS_CREDIT, PEER)
    with pytest.raises(CreditMismatch, match="not countersigning"):
        countersign(half, NODE, DIGITS_CREDIT * 1.01)
    with pytest.raises(ProtocolError, match="names worker"):
        countersign(half, OTHER, DIGITS_CREDIT)
    full = countersign(half, NODE, DIGITS_CREDIT)
    assert open_cosigned(full).credit == DIGITS_CREDIT


def test_only_the_receipts_owner_can_issue_it() -> None:
    with pytest.raises(ProtocolError, match="names owner"):
        issue(receipt_envelope(PEER, NODE), DIGITS_CREDIT, SigningKey.generate())


def test_credit_is_training_flops_in_tflop() -> None:
    assert flops_to_credit(34_048 * 500 * 64 * 3) == pytest.approx(0.003268608, rel=1e-15)


def test_the_worked_examples_in_the_docs_match_the_code() -> None:
    """docs/ledger.md's figures for (a) the first spec of docs/jobspec.md and (b) the spec
    in docs/ledger.md are what training.budget computes."""
    import tomllib

    from training.budget import validate_for_submit
    from training.spec.job import parse_spec

    docs = Path(__file__).resolve().parents[2] / "docs"
    doc = (docs / "ledger.md").read_text()
    specs = [
        re.search(r"```toml\n(.*?)```", (docs / "jobspec.md").read_text(), re.S),
        re.search(r"```toml\n(.*?)```", doc, re.S),
    ]
    for match in specs:
        assert match is not None
        summary = validate_for_submit(parse_spec(tomllib.loads(match.group(1))), None)
        flops = summary.flops_per_sample
        samples = summary.total_steps * summary.batch_size
        assert summary.training_flops == flops * samples * 3
        assert f"forward FLOPs per sample: 2 x {flops // 2:,} = {flops:,}" in doc or (
            f"forward FLOPs per sample: {flops:,}" in doc
        )
        assert f"{summary.total_steps:,} x {summary.batch_size} = {samples:,}" in doc
        assert f"{flops:,} x {samples:,} x 3 = {summary.training_flops:,}" in doc
        assert f"**{flops_to_credit(summary.training_flops)!r} TFLOP**" in doc


def test_a_receipt_naming_an_unknown_credit_formula_is_refused(ledger: Ledger) -> None:
    """Both sides sign the formula's version with the figure; one this node does not
    know is refused by name, and nothing is written."""
    before = state(ledger)
    receipt = forged_cosigned(PEER, NODE, formula=99)
    with pytest.raises(InvalidReceipt, match="credit_formula 99 is not one this node knows"):
        ledger.append_work("work_done", receipt, DIGITS_CREDIT, DIGITS_CREDIT)
    assert state(ledger) == before
    genuine = forged_cosigned(PEER, NODE)
    assert parse_cosigned(genuine).credit_formula == 1
    ledger.append_work("work_done", genuine, DIGITS_CREDIT, DIGITS_CREDIT)
