"""The audit table: receipts seen on gossip, checked, deduplicated, conflicts flagged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_factories import DIGITS_CREDIT, cosigned, forged_cosigned, key_from, peer_id_of

from ledger import AuditFull, AuditLog, InvalidReceipt, Ledger, LedgerError

ALICE, BOB, CAROL, MALLORY = (key_from(n) for n in (11, 12, 13, 14))


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditLog]:
    with AuditLog.open(tmp_path) as log:
        yield log


def test_a_receipt_is_added_once_and_then_a_duplicate(audit: AuditLog) -> None:
    receipt = cosigned(ALICE, BOB)
    assert audit.add(receipt) == "added"
    assert audit.add(receipt) == "duplicate"
    assert audit.count() == 1


def test_a_reissued_receipt_that_agrees_is_a_duplicate(audit: AuditLog) -> None:
    assert audit.add(cosigned(ALICE, BOB, issued_at=1.0)) == "added"
    assert audit.add(cosigned(ALICE, BOB, issued_at=2.0)) == "duplicate"
    assert audit.count() == 1 and audit.conflicts() == []


@pytest.mark.parametrize(
    "second",
    [
        {"worker": CAROL},  # the owner credited two workers for one unit
        {"credit": DIGITS_CREDIT * 2},
        {"weights": "cd" * 32},
    ],
    ids=["other-worker", "other-credit", "other-weights"],
)
def test_receipts_that_disagree_on_a_unit_are_a_conflict_and_both_kept(
    audit: AuditLog, second: dict
) -> None:
    assert audit.add(cosigned(ALICE, BOB)) == "added"
    worker = second.pop("worker", BOB)
    other = cosigned(ALICE, worker, second.pop("credit", DIGITS_CREDIT), **second)
    assert audit.add(other) == "conflict"
    assert audit.add(other) == "duplicate"
    assert audit.count() == 2
    [unit] = audit.conflicts()
    assert (unit["owner"], unit["job_id"], unit["unit_id"]) == (
        peer_id_of(ALICE),
        "026ab639c21df8aa",
        "d1b608530bb248d3",
    )
    assert len(unit["receipts"]) == 2
    assert {r["worker"] for r in unit["receipts"]} == {peer_id_of(BOB), peer_id_of(worker)}


def test_network_credit_counts_agreed_receipts_and_names_conflicts(audit: AuditLog) -> None:
    audit.add(cosigned(ALICE, BOB, 2.0, unit_id="bb82030dbc2bcaba"))
    audit.add(cosigned(ALICE, BOB, 3.0, unit_id="6ca202c88e549dff"))
    audit.add(cosigned(BOB, CAROL, 5.0, unit_id="011e39efe22590f4"))
    audit.add(cosigned(ALICE, BOB, 7.0, unit_id="e9c981a479986215"))
    assert audit.add(cosigned(ALICE, CAROL, 7.0, unit_id="e9c981a479986215")) == "conflict"
    credit = audit.network_credit()
    alice, bob, carol = (credit[peer_id_of(k)] for k in (ALICE, BOB, CAROL))
    assert alice == {"earned": 0.0, "spent": 5.0, "receipts": 2, "units": 0, "conflicts": 1}
    assert bob == {"earned": 5.0, "spent": 5.0, "receipts": 3, "units": 2, "conflicts": 1}
    assert carol == {"earned": 5.0, "spent": 0.0, "receipts": 1, "units": 1, "conflicts": 1}


def test_recent_average_credit_halves_with_every_half_life(audit: AuditLog) -> None:
    """BOINC's RAC: a receipt's credit counts halved for every half-life since it was
    seen; a unit in conflict counts nothing."""
    audit.add(cosigned(ALICE, BOB, 8.0, unit_id="bb82030dbc2bcaba"))
    audit.add(cosigned(ALICE, CAROL, 4.0, unit_id="6ca202c88e549dff"))
    audit.add(cosigned(ALICE, CAROL, 4.0, unit_id="011e39efe22590f4"))
    audit.add(cosigned(ALICE, BOB, 4.0, unit_id="011e39efe22590f4"))  # disagrees: conflict
    week = 7 * 24 * 3600.0
    now = time.time()
    rac = audit.recent_credit(now, week)
    assert rac[peer_id_of(BOB)] == pytest.approx(8.0, rel=0.01)  # (its age is under an hour)
    assert rac[peer_id_of(CAROL)] == pytest.approx(4.0, rel=0.01)  # not the unit in conflict
    later = audit.recent_credit(now + 2 * week, week)
    assert later[peer_id_of(BOB)] == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize(
    "make",
    [
        lambda: forged_cosigned(ALICE, BOB, worker_signer=MALLORY),
        lambda: forged_cosigned(ALICE, BOB, owner_signer=MALLORY),
        lambda: forged_cosigned(ALICE, BOB, sealer=MALLORY),
        lambda: b"\x93\x01\x02\x03",
    ],
    ids=["countersigned-by-another", "owner-claim-by-another", "sealed-by-another", "garbage"],
)
def test_bad_signatures_are_refused_and_nothing_kept(audit: AuditLog, make) -> None:
    with pytest.raises(InvalidReceipt, match="co-signed receipt refused"):
        audit.add(make())
    assert audit.count() == 0 and audit.network_credit() == {}


def test_a_forged_conflict_cannot_be_planted(audit: AuditLog) -> None:
    """Only the owner can make a conflicting receipt: a forgery is refused, not flagged."""
    audit.add(cosigned(ALICE, BOB))
    with pytest.raises(InvalidReceipt):
        audit.add(forged_cosigned(ALICE, MALLORY, owner_signer=MALLORY))
    assert audit.conflicts() == []


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=1024))
def test_garbage_raises_only_typed_errors(audit: AuditLog, data: bytes) -> None:
    with pytest.raises(LedgerError):
        audit.add(data)
    assert audit.count() == 0


def test_the_table_is_capped(tmp_path: Path) -> None:
    with AuditLog.open(tmp_path, max_receipts=2) as log:
        log.add(cosigned(ALICE, BOB, unit_id="ca978112ca1bbdca"))
        log.add(cosigned(ALICE, BOB, unit_id="3e23e8160039594a"))
        with pytest.raises(AuditFull, match="holds 2 receipts"):
            log.add(cosigned(ALICE, BOB, unit_id="2e7d2c03a9507ae2"))
        assert log.add(cosigned(ALICE, BOB, unit_id="ca978112ca1bbdca")) == "duplicate"
        assert log.count() == 2


def test_it_persists_and_lives_beside_the_ledger_without_touching_it(tmp_path: Path) -> None:
    with Ledger.open(tmp_path, BOB) as ledger:
        receipt = cosigned(ALICE, BOB)
        ledger.append_work("work_done", receipt, DIGITS_CREDIT, DIGITS_CREDIT)
        with AuditLog.open(tmp_path) as log:
            assert log.add(receipt) == "added"
            log.add(cosigned(ALICE, CAROL, unit_id="2d711642b726b044"))
        assert ledger.verify().ok and ledger.count() == 2
    assert (tmp_path / "audit.db").exists() and (tmp_path / "ledger.db").exists()
    with AuditLog.open(tmp_path) as log:
        assert log.count() == 2
        assert log.add(receipt) == "duplicate"


def test_one_peer_cannot_fill_the_table_alone(tmp_path: Path) -> None:
    """A quota per peer, as owner and as worker (by default 1% of the table, at least
    1,000): a flood of receipts one identity made with its puppets stops at it;
    others' receipts still get in."""
    with AuditLog.open(tmp_path, max_receipts=300, max_per_peer=3) as audit:
        for i in range(3):
            assert audit.add(cosigned(MALLORY, BOB, unit_id=f"{i:016x}")) == "added"
        with pytest.raises(AuditFull, match="as owner, its quota"):
            audit.add(cosigned(MALLORY, CAROL, unit_id=f"{9:016x}"))
        with pytest.raises(AuditFull, match="as worker, its quota"):
            audit.add(cosigned(ALICE, BOB, unit_id=f"{8:016x}"))
        assert audit.add(cosigned(ALICE, CAROL, unit_id=f"{7:016x}")) == "added"
        assert audit.count() == 4
