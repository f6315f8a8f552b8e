"""Each job mode's hooks on a real node.db, through the owner's real engine (`OwnerRole`:
its lifecycle, leases and modes), with no network and no runner: what a lost, failed
or accepted unit does to a single job, an elastic round and a sweep's trial, what each
unit earns and what survives a restart."""

from __future__ import annotations

import dataclasses
import re
import time
import tomllib
from pathlib import Path

import optuna
import pytest
import sqlite_utils
import trio
from nacl.signing import SigningKey

from node.identity import Identity
from node.preferences import Preferences
from node.work.blobs import (
    BlobStore,
    TransferCorrupt,
    TransferError,
    TransferRefused,
    TransferUnreachable,
)
from node.work.context import WorkContext
from node.work.jobs import Job, JobStore, Round, RoundStore, Trial, Unit, UnitKeys
from node.work.owner import MAX_ATTEMPTS, OwnerRole, round_closed_reason
from node.work.owner.modes import MODES, ElasticRounds, SingleJob, SweepTrials
from node.work.owner.modes.single import HISTORY_POINTS
from node.work.owner.modes.sweep import sweep_of
from node.work.owner.results import CheckedResult
from node.work.trust.resume import ResumePoint, resume_point, save_point
from protocol.receipts import flops_to_credit, partial_credit
from protocol.work import Progress, Result
from training.spec.examples import sweep_toml
from training.spec.job import parse_spec, spec_to_plain
from training.sweep import study as studies

WORKER = "12D3KooWworker"
OTHER = "12D3KooWother"
ELASTIC = {
    "mode": "elastic",
    "elastic": {"rounds": 3, "workers": 2, "min_workers": 1, "inner_steps": 10},
    "requirements": {"max_hours": 1.0},
}


@pytest.fixture
def owner(tmp_path: Path) -> OwnerRole:
    """The owner's engine over node.db in `tmp_path` (as tests/node/work/owner/test_work_engine.py's
    `_ctx`, with a blob store): no host, peers or runner, so nothing leaves the test."""
    db = sqlite_utils.Database(tmp_path / "node.db")
    identity = Identity(SigningKey.generate())
    ctx = WorkContext(
        identity=identity,
        host=None,  # type: ignore[arg-type]
        peers=None,  # type: ignore[arg-type]
        jobs=JobStore(db),
        blobs=BlobStore(tmp_path),
        data_dir=tmp_path,
        own_ad=None,  # type: ignore[arg-type]
        policy=None,  # type: ignore[arg-type]
        preferences=Preferences,
        ledger=None,  # type: ignore[arg-type]
        publish_receipt=None,  # type: ignore[arg-type]
        publish_evidence=None,  # type: ignore[arg-type]
        unit_keys=UnitKeys(db, bytes(identity.signing_key)),
    )
    return OwnerRole(ctx, None)  # type: ignore[arg-type]


def _job(owner: OwnerRole, spec: dict | None = None, running: bool = False) -> Job:
    spec = {"requirements": {"max_hours": 1.0}} if spec is None else spec
    job = owner.ctx.jobs.create("j", spec, "auto", {"training_flops": 3 * 10**12}, [])
    if running:  # a many-unit job: its driver moved it to running
        job = owner.ctx.jobs.transition(job.id, ("queued",), "driver", state="running")
    assert job is not None
    return job


def _unit(owner: OwnerRole, job: Job, worker: str = WORKER, **where: int) -> Unit:
    """A unit of `job` whose worker took it."""
    unit = owner.ctx.jobs.add_unit(job.id, worker, 30, deadline=time.time() + 3600, **where)
    owner.ctx.remember_unit_key(job.id, unit.unit_id, b"k" * 32)
    owner.lifecycle.start(unit, "accepted")
    fresh = owner.ctx.jobs.unit(unit.unit_id)
    assert fresh is not None and fresh.state == "running"
    return fresh


def _verifying(owner: OwnerRole, unit: Unit) -> Unit:
    moved = owner.ctx.jobs.unit_transition(unit.unit_id, ("running",), state="verifying")
    assert moved is not None
    return moved


def _checked(sha: str, metrics: dict | None = None) -> CheckedResult:
    result = Result("a" * 16, "b" * 16, True, "", sha, 1, b"", device="cpu")
    return CheckedResult(result, dict(metrics or {}), "claimed", "", "")


def _progress(unit: Unit, step: int, loss: float) -> Progress:
    return Progress(unit.job_id, unit.unit_id, "training", step, 200, loss, 9.0, 64, time.time())


def _woken(owner: OwnerRole) -> bool:
    return owner._wake.is_set()


# -- single ------------------------------------------------------------------------------


def test_a_lost_single_unit_queues_the_job_without_its_worker_and_wakes_the_engine(
    owner: OwnerRole,
) -> None:
    job = _job(owner)
    here = _unit(owner, job, owner.ctx.peer_id)
    owner.lifecycle.lost(here.unit_id, "trained here and lost")
    assert owner.ctx.jobs.get(job.id).excluded == []  # this node is never excluded
    unit = _unit(owner, job)
    owner._wake = trio.Event()
    owner.lifecycle.lost(unit.unit_id, "declined")
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.reason, fresh.attempts) == ("queued", "declined", 2)
    assert fresh.excluded == [WORKER] and fresh.worker == fresh.unit_id == ""
    assert _woken(owner)


def test_a_worker_that_vanished_after_delivering_ends_unverified_at_no_fault(
    owner: OwnerRole,
) -> None:
    """No rejection entry (the fixture's node has no ledger: any entry would raise), no
    exclusion, no receipt: the unit ends expired and the job is offered again."""
    job = _job(owner)
    unit = _verifying(owner, _unit(owner, job))
    reply = owner.results._unverified(unit.unit_id, WORKER, "its evidence: gone")
    assert b"could not verify" in reply
    ended = owner.ctx.jobs.unit(unit.unit_id)
    assert (ended.state, ended.reason) == (
        "expired",
        f"could not verify the result of {WORKER}: it stopped serving its evidence: gone",
    )
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.excluded) == ("queued", [])
    assert owner.ctx.jobs.receipt(unit.unit_id) is None
    gone, wrong = TransferUnreachable("no route"), TransferCorrupt("bad bytes", "truncated")
    assert gone.peer_gone and TransferError("slow", "timeout").peer_gone
    assert not wrong.peer_gone and not TransferRefused("no", "bad_grant").peer_gone


@pytest.mark.parametrize(
    ("error", "kept"),
    [(TransferUnreachable("no route"), True), (TransferCorrupt("bad bytes", "truncated"), False)],
)
def test_a_check_cut_short_by_a_vanished_worker_keeps_the_jobs_resume_point(
    owner: OwnerRole, error: Exception, kept: bool
) -> None:
    """The unit is lost, not failed: the next one goes on from the state the owner
    trusts. A worker that sent something wrong leaves no point (the next starts over)."""
    job = _job(owner)
    unit = _unit(owner, job)
    save_point(owner.ctx.jobs.db, ResumePoint(job.id, unit.unit_id, "a" * 64, 100))
    checks = owner.results._spot_checks

    async def cut_short(sub: object) -> None:
        raise error

    checks._check = cut_short  # type: ignore[method-assign]
    with pytest.raises(type(error)):
        trio.run(checks.check, dataclasses.make_dataclass("Sub", ["unit"])(unit))
    assert (resume_point(owner.ctx.jobs.db, job.id) is not None) == kept


def test_a_single_job_fails_after_max_attempts_times_its_replicas(owner: OwnerRole) -> None:
    job = _job(owner, {"trust": {"replicas": 2}})
    for attempt in range(MAX_ATTEMPTS * 2):
        assert owner.ctx.jobs.get(job.id).state == "queued"
        owner.lifecycle.lost(_unit(owner, job, f"{WORKER}{attempt}").unit_id, f"lost {attempt}")
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.reason) == ("failed", f"lost {MAX_ATTEMPTS * 2 - 1}")
    assert fresh.timeline[-1]["note"] == f"giving up after {MAX_ATTEMPTS * 2} attempts"


def test_a_lost_replica_changes_nothing_while_its_partner_trains(owner: OwnerRole) -> None:
    job = _job(owner, {"trust": {"replicas": 2}})
    first, second = _unit(owner, job), _unit(owner, job, OTHER)
    owner._wake = trio.Event()
    owner.lifecycle.lost(first.unit_id, "vanished", "expired")
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.excluded) == ("running", []) and not _woken(owner)
    owner.lifecycle.lost(second.unit_id, "vanished too", "expired")
    fresh = owner.ctx.jobs.get(job.id)
    assert fresh.state == "queued" and fresh.excluded == [OTHER] and _woken(owner)


def test_a_fatal_single_unit_fails_the_job(owner: OwnerRole) -> None:
    job = _job(owner)
    owner.modes["single"].unit_fatal(_unit(owner, job), "loss is nan")
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.reason) == ("failed", "loss is nan")


def test_single_progress_records_step_fraction_and_a_capped_history(owner: OwnerRole) -> None:
    job = _job(owner)
    unit = _unit(owner, job)
    old = [[s, 2.0, None] for s in range(HISTORY_POINTS)]
    owner.ctx.jobs.set_progress(job.id, {"history": old})
    assert owner.modes["single"].progress(unit, _progress(unit, 50, 1.25)) == ""
    progress = owner.ctx.jobs.get(job.id).progress
    assert (progress["step"], progress["total_steps"], progress["fraction"]) == (50, 200, 0.25)
    assert progress["loss"] == 1.25 and progress["phase"] == "training"
    assert len(progress["history"]) == HISTORY_POINTS
    assert progress["history"][-1] == [50, 1.25, None] and progress["history"][0][0] == 1
    owner.lifecycle.cancel(job.id)  # a late heartbeat never writes over a final job
    owner.modes["single"].progress(unit, _progress(unit, 60, 1.0))
    assert owner.ctx.jobs.get(job.id).progress["step"] == 50


def test_single_accept_completes_the_job_and_drops_the_replica_still_training(
    owner: OwnerRole,
) -> None:
    job = _job(owner, {"trust": {"replicas": 2}})
    checked, training = _verifying(owner, _unit(owner, job)), _unit(owner, job, OTHER)
    result = _checked("c" * 64, {"val_loss": 0.5})
    assert owner.modes["single"].accept(job, checked, WORKER, result) == ""
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.metrics_status) == ("completed", "claimed")
    assert fresh.weights_sha256 == "c" * 64
    assert fresh.metrics == {"val_loss": 0.5, "device": "cpu"}
    assert owner.ctx.jobs.unit(checked.unit_id).state == "done"
    dropped = owner.ctx.jobs.unit(training.unit_id)
    assert (dropped.state, dropped.reason) == ("cancelled", "the unit settled without it")


def test_single_accept_of_a_late_replica_takes_only_the_same_weights(owner: OwnerRole) -> None:
    job = _job(owner, {"trust": {"replicas": 2}})
    first, second = (_verifying(owner, _unit(owner, job, w)) for w in (WORKER, OTHER))
    single = owner.modes["single"]
    assert single.accept(job, first, WORKER, _checked("c" * 64)) == ""
    assert single.accept(job, second, OTHER, _checked("c" * 64)) == ""
    assert owner.ctx.jobs.unit(second.unit_id).state == "done"
    third_job = _job(owner, {"trust": {"replicas": 2}})
    one, two = (_verifying(owner, _unit(owner, third_job, w)) for w in (WORKER, OTHER))
    assert single.accept(third_job, one, WORKER, _checked("c" * 64)) == ""
    why = single.accept(third_job, two, OTHER, _checked("d" * 64))
    assert why == "the job ended while it was checked"
    assert owner.ctx.jobs.get(third_job.id).weights_sha256 == "c" * 64


def test_single_accept_after_a_cancel_says_why_and_the_job_stays_cancelled(
    owner: OwnerRole,
) -> None:
    job = _job(owner)
    unit = _verifying(owner, _unit(owner, job))
    owner.lifecycle.cancel(job.id)
    why = owner.modes["single"].accept(job, unit, WORKER, _checked("c" * 64))
    assert why == "the job ended while it was checked"
    fresh = owner.ctx.jobs.get(job.id)
    assert (fresh.state, fresh.weights_sha256) == ("cancelled", "")


def test_single_restart_keeps_the_unit_and_requeues_only_a_job_with_none_live(
    owner: OwnerRole,
) -> None:
    single = owner.modes["single"]
    job = _job(owner)
    unit = _unit(owner, job)
    assert single.recover_unit(unit) is False
    assert owner.ctx.jobs.unit(unit.unit_id).state == "running"
    assert single.recover_job(owner.ctx.jobs.get(job.id)) == ""
    owner.ctx.jobs.unit_transition(unit.unit_id, ("running",), state="expired")
    assert single.recover_job(owner.ctx.jobs.get(job.id)) == "owner restarted; re-offering"


# -- elastic -----------------------------------------------------------------------------


def test_each_mode_names_a_units_place_in_its_job(owner: OwnerRole) -> None:
    job = _job(owner, ELASTIC, running=True)
    share = _unit(owner, job, round_=2, slot=1)
    elastic = owner.modes["elastic"]
    assert (elastic.where(share), elastic.delta_round(share)) == ("round 2", 2)
    store, later = elastic.store, time.time() + 60
    store.open(job.id, 1, "a" * 64, "", later)
    store.update(job.id, 1, "open", state="closed", next_update_sha256="e" * 64)
    store.open(job.id, 2, "b" * 64, "", later)
    assert elastic.served(share, "b" * 64, 100) == "round 2's weights"  # a newcomer's
    assert elastic.served(share, "e" * 64, 30) == "round 2's weights update"
    assert store.get(job.id, 2).bytes_out == 130  # the round's bytes down
    alone = _unit(owner, _job(owner))
    single = owner.modes["single"]
    assert single.where(alone) == f"unit {alone.unit_id}"
    assert (single.delta_round(alone), single.served(alone, "b" * 64, 1)) == (None, None)
    trial = dataclasses.replace(alone, trial=3)
    assert owner.modes["sweep"].where(trial) == "trial 3"


def test_a_lost_share_notes_its_round_and_excludes_only_a_failed_worker(
    owner: OwnerRole,
) -> None:
    job = _job(owner, ELASTIC, running=True)
    bad, gone = _unit(owner, job, round_=1, slot=0), _unit(owner, job, OTHER, round_=1, slot=1)
    owner.lifecycle.lost(bad.unit_id, "its delta was refused")
    owner.lifecycle.lost(gone.unit_id, "vanished", "expired")
    fresh = owner.ctx.jobs.get(job.id)
    assert fresh.state == "running" and fresh.excluded == [WORKER]
    notes = [entry["note"] for entry in fresh.timeline[-2:]]
    assert notes == ["round 1: its delta was refused", "round 1: vanished"]


def test_an_accepted_delta_marks_the_share_done_unless_its_round_closed(
    owner: OwnerRole,
) -> None:
    job = _job(owner, ELASTIC, running=True)
    elastic = owner.modes["elastic"]
    sha = owner.ctx.blobs.put_bytes(b"delta bytes")
    on_time = _verifying(owner, _unit(owner, job, round_=0, slot=0))
    assert elastic.accept(job, on_time, WORKER, _checked(sha)) == ""
    done = owner.ctx.jobs.unit(on_time.unit_id)
    assert (done.state, done.output_sha256, done.output_bytes) == ("done", sha, 11)
    assert "round 0: delta from" in owner.ctx.jobs.get(job.id).timeline[-1]["note"]
    late = _verifying(owner, _unit(owner, job, OTHER, round_=0, slot=1))
    owner.lifecycle.end(late.unit_id, "expired", round_closed_reason(0))
    why = elastic.accept(job, late, OTHER, _checked(sha))
    assert why.startswith("the round closed")
    assert owner.ctx.jobs.unit(late.unit_id).state == "expired"


def test_a_delta_being_checked_may_start_its_slots_next_share_which_ends_if_it_fails(
    owner: OwnerRole,
) -> None:
    """An eager share may start from a delta still being checked (`delta_fetched`);
    when that check fails, the worker's later shares of the job end with it, its
    other jobs' units and other workers' shares do not."""
    job = _job(owner, ELASTIC, running=True)
    elastic = owner.modes["elastic"]
    checked = _verifying(owner, _unit(owner, job, round_=0, slot=0))
    elastic.delta_fetched(checked, "d" * 64, 100)
    fresh = owner.ctx.jobs.unit(checked.unit_id)
    assert (fresh.state, fresh.output_sha256, fresh.output_bytes) == ("verifying", "d" * 64, 100)
    assert elastic._delivered(job.id, 0) == {0: "d" * 64}
    ahead = _unit(owner, job, round_=1, slot=0)  # its eager share, from that delta
    others = _unit(owner, job, OTHER, round_=1, slot=1)
    elsewhere = _unit(owner, _job(owner, ELASTIC, running=True), round_=1, slot=0)
    owner.lifecycle.lost(checked.unit_id, "failed a spot check")
    assert owner.ctx.jobs.unit(ahead.unit_id).state == "failed"
    assert "share of round 0 failed" in owner.ctx.jobs.unit(ahead.unit_id).reason
    assert owner.ctx.jobs.unit(others.unit_id).state == "running"
    assert owner.ctx.jobs.unit(elsewhere.unit_id).state == "running"
    assert elastic._delivered(job.id, 0) == {}
    late = _unit(owner, job, round_=2, slot=0)  # moved on: its output is not recorded
    elastic.delta_fetched(late, "e" * 64, 100)
    assert owner.ctx.jobs.unit(late.unit_id).output_sha256 == ""


def test_an_elastic_job_resumes_its_rounds_after_a_restart(owner: OwnerRole) -> None:
    """A share whose key survived waits for its worker to re-attach (no volunteer
    trains it twice); one whose key is gone is offered again, at no fault."""
    job = _job(owner, ELASTIC, running=True)
    share = _unit(owner, job, round_=0, slot=0)
    keyless = _unit(owner, job, OTHER, round_=0, slot=1)
    owner.ctx.forget_unit_key(job.id, keyless.unit_id)
    owner.leases.recover()
    kept = owner.ctx.jobs.unit(share.unit_id)
    assert kept.state == "running" and kept.lease_expires > time.time()
    assert owner.ctx.grant_keys[(job.id, share.unit_id)] == b"k" * 32
    lost = owner.ctx.jobs.unit(keyless.unit_id)
    assert (lost.state, lost.reason) == ("expired", "owner restarted and lost the unit's key")
    fresh = owner.ctx.jobs.get(job.id)
    assert fresh.state == "queued" and fresh.excluded == []
    assert fresh.timeline[-1]["note"] == "owner restarted; resuming its rounds"


def test_closed_rounds_are_evaluated_in_order_while_the_rounds_go_on(
    owner: OwnerRole, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outer step only writes the weights; each closed round's validation comes
    after, in order, and fills the round's row and the job's progress; a job stopped
    meanwhile is not evaluated further. (`RoundTasks.validate` is the runner task
    `elastic_validate`, checked against the inline validation in test_elastic.py.)"""
    job = _job(owner, ELASTIC, running=True)
    elastic = owner.modes["elastic"]
    for r in range(3):
        elastic.store.open(job.id, r, f"{r}" * 64, "", time.time() + 60)
        elastic.store.update(
            job.id, r, "open", state="closed", next_weights_sha256=f"{r + 1}" * 64, workers=[WORKER]
        )
    evaluated: list[int] = []

    async def validate(job: Job, closed: Round) -> dict[str, float]:
        evaluated.append(closed.round)
        if closed.round == 1:  # the job is cancelled while round 1 is evaluated
            owner.ctx.jobs.transition(job.id, ("running",), "cancelled", state="cancelled")
        return {"val_loss": 3.0 - closed.round}

    monkeypatch.setattr(elastic.tasks, "validate", validate)

    async def main() -> None:
        send, receive = trio.open_memory_channel[Round](3)
        for r in range(3):
            send.send_nowait(elastic.store.get(job.id, r))
        send.close()
        await elastic._validations(job.id, receive)

    trio.run(main)
    assert evaluated == [0, 1]
    rows = [elastic.store.get(job.id, r) for r in range(3)]
    assert [(r.val_loss, r.metrics) for r in rows] == [
        (3.0, {"val_loss": 3.0}),
        (2.0, {"val_loss": 2.0}),
        (None, {}),
    ]
    assert 0 < rows[0].evaluated_at <= rows[1].evaluated_at <= time.time()
    assert rows[2].evaluated_at == 0.0  # when its figures came: never
    history = owner.ctx.jobs.get(job.id).progress["history"]
    assert history == [[10, None, 3.0]]  # a cancelled job's progress stays as it was


def test_an_elastic_job_describes_its_rounds(owner: OwnerRole) -> None:
    job = _job(owner, ELASTIC, running=True)
    elastic = owner.modes["elastic"]
    assert elastic.describe(job) == {"rounds": []}
    RoundStore(owner.ctx.jobs.db).open(job.id, 0, "a" * 64, "", time.time() + 60)
    (shown,) = elastic.describe(job)["rounds"]
    assert (shown["round"], shown["state"], shown["weights_sha256"]) == (0, "open", "a" * 64)


# -- sweep -------------------------------------------------------------------------------


def _sweep(owner: OwnerRole) -> tuple[Job, SweepTrials, optuna.Study]:
    """A running sweep job and its study, in the journal file the mode keeps."""
    plain = spec_to_plain(parse_spec(tomllib.loads(sweep_toml(trials=4, parallel=2))))
    job = _job(owner, plain, running=True)
    sweep = owner.modes["sweep"]
    assert sweep.study_path(job) is None
    path = owner.ctx.data_dir / "studies" / f"{job.id}.journal"
    study = studies.open_study(path, job.id, sweep_of(job), 0)
    assert sweep.study_path(job) == path
    return job, sweep, study


def _trial(owner: OwnerRole, job: Job, study: optuna.Study, worker: str = WORKER) -> Unit:
    """A trial the study asked for, and its unit, taken by `worker`."""
    sweep = owner.modes["sweep"]
    number, params = studies.ask(study, sweep_of(job).space)
    sweep.store.add(Trial(job.id, number, params, training_flops=2 * 10**12, total_steps=200))
    unit = _unit(owner, job, worker, trial=number)
    sweep.store.update(job.id, number, ("running",), unit_id=unit.unit_id, worker=worker)
    return unit


def _told(study: optuna.Study, number: int) -> optuna.trial.TrialState:
    return study.trials[number].state  # read back from the journal the mode wrote


def test_a_sweep_keeps_its_live_trials_and_resumes_its_driver_after_a_restart(
    owner: OwnerRole,
) -> None:
    job, sweep, study = _sweep(owner)
    unit = _trial(owner, job, study)
    owner.leases.recover()
    assert owner.ctx.jobs.unit(unit.unit_id).state == "running"  # its worker re-attaches
    fresh = owner.ctx.jobs.get(job.id)
    assert fresh.state == "queued"  # so the engine starts its driver again
    assert fresh.timeline[-1]["note"] == "owner restarted; resuming its trials"


def test_a_fatal_trial_fails_the_trial_not_the_sweep(owner: OwnerRole) -> None:
    job, sweep, study = _sweep(owner)
    unit = _trial(owner, job, study)
    sweep._changed[job.id] = driver = trio.Event()
    owner.lifecycle.fatal(unit.unit_id, "loss is nan")
    trial = sweep.store.get(job.id, unit.trial)
    assert (trial.state, trial.reason) == ("failed", "loss is nan")
    assert owner.ctx.jobs.get(job.id).state == "running"
    assert _told(study, unit.trial) == optuna.trial.TrialState.FAIL
    assert driver.is_set()


def test_a_lost_trial_is_offered_once_more_then_fails(owner: OwnerRole) -> None:
    job, sweep, study = _sweep(owner)
    first = _trial(owner, job, study)
    owner.lifecycle.lost(first.unit_id, "vanished", "expired")
    trial = sweep.store.get(job.id, first.trial)
    assert (trial.state, trial.attempts, trial.reason) == ("running", 1, "vanished")
    assert owner.ctx.jobs.get(job.id).excluded == []  # an expired unit is no one's fault
    assert _told(study, first.trial) == optuna.trial.TrialState.RUNNING
    again = _unit(owner, job, OTHER, trial=first.trial)
    sweep.store.update(job.id, first.trial, ("running",), unit_id=again.unit_id, worker=OTHER)
    owner.lifecycle.lost(again.unit_id, "its weights were refused")
    trial = sweep.store.get(job.id, first.trial)
    assert (trial.state, trial.reason) == ("failed", "its weights were refused")
    assert owner.ctx.jobs.get(job.id).excluded == [OTHER]
    assert _told(study, first.trial) == optuna.trial.TrialState.FAIL


def test_an_offer_no_heartbeat_confirmed_after_a_restart_costs_the_trial_nothing(
    owner: OwnerRole,
) -> None:
    """The owner stopped while offering a trial's unit (after the trial had lost one
    unit already): the worker may never have had it, so its expiry is not the
    trial's second loss."""
    job, sweep, study = _sweep(owner)
    first = _trial(owner, job, study)
    owner.lifecycle.lost(first.unit_id, "vanished", "expired")
    offered = owner.ctx.jobs.add_unit(
        job.id, OTHER, 30, deadline=time.time() + 3600, trial=first.trial
    )
    owner.ctx.remember_unit_key(job.id, offered.unit_id, b"k" * 32)
    sweep.store.update(job.id, first.trial, ("running",), unit_id=offered.unit_id, worker=OTHER)
    owner.leases.recover()
    owner.leases.expire(owner.ctx.jobs.unit(offered.unit_id).lease_expires + 1)
    gone = owner.ctx.jobs.unit(offered.unit_id)
    assert (gone.state, gone.reason) == ("expired", f"the offer to {OTHER} was never confirmed")
    trial = sweep.store.get(job.id, first.trial)
    assert (trial.state, trial.attempts) == ("running", 1)  # offered again, as before
    assert owner.ctx.jobs.get(job.id).excluded == []


def test_a_trial_earns_its_whole_credit_or_the_pruned_share(owner: OwnerRole) -> None:
    job, sweep, study = _sweep(owner)
    unit = _trial(owner, job, study)
    whole = flops_to_credit(2 * 10**12)
    assert sweep.credit(job, unit) == whole
    assert sweep.credit(job, dataclasses.replace(unit, trial=99)) == 0.0
    earlier = dataclasses.replace(unit, unit_id="e" * 16)  # an older unit of the trial
    sweep.store.update(job.id, unit.trial, ("running",), state="pruned", steps=50)
    assert sweep.credit(job, unit) == partial_credit(whole, 50, 200) == whole / 4
    assert sweep.credit(job, earlier) == whole


def test_stopped_steps_only_for_the_pruned_trials_own_unit_and_peer(owner: OwnerRole) -> None:
    job, sweep, study = _sweep(owner)
    unit = _trial(owner, job, study)
    assert sweep.stopped_steps(WORKER, job, unit.unit_id) is None  # still running
    sweep.store.update(job.id, unit.trial, ("running",), state="pruned", steps=50)
    assert sweep.stopped_steps(WORKER, job, unit.unit_id) == 50
    assert sweep.stopped_steps(OTHER, job, unit.unit_id) is None
    other_job = _job(owner)
    assert sweep.stopped_steps(WORKER, other_job, unit.unit_id) is None
    older = owner.ctx.jobs.add_unit(job.id, WORKER, 30, trial=unit.trial)
    assert sweep.stopped_steps(WORKER, job, older.unit_id) is None


def test_a_sweep_describes_its_trials_and_the_best_one(owner: OwnerRole) -> None:
    job, sweep, study = _sweep(owner)
    assert sweep.describe(job) == {"trials": [], "best": None}
    sha = owner.ctx.blobs.put_bytes(b"weights")
    units = [_verifying(owner, _trial(owner, job, study, w)) for w in (WORKER, OTHER, WORKER)]
    late = units.pop()
    for unit, loss in zip(units, (0.5, 0.25), strict=True):
        assert sweep.accept(job, unit, unit.worker, _checked(sha, {"val_loss": loss})) == ""
    shown = sweep.describe(job)
    assert [t["state"] for t in shown["trials"]] == ["complete", "complete", "running"]
    assert (shown["best"]["number"], shown["best"]["value"]) == (units[1].trial, 0.25)
    assert _told(study, units[1].trial) == optuna.trial.TrialState.COMPLETE
    owner.lifecycle.cancel(job.id)  # the third trial's unit is cancelled with it
    why = sweep.accept(job, late, WORKER, _checked(sha, {"val_loss": 0.1}))
    assert why == "the sweep ended while it was checked"


# -- the engine --------------------------------------------------------------------------


def test_the_engine_asks_the_mode_the_spec_names(owner: OwnerRole) -> None:
    specs = ({}, {"mode": "elastic"}, {"mode": "sweep"})
    jobs = [owner.ctx.jobs.create("j", spec, "auto", {}, []) for spec in specs]
    assert [job.mode for job in jobs] == ["single", "elastic", "sweep"]
    assert isinstance(owner.mode_of(_job(owner)), SingleJob)
    assert isinstance(owner.mode_of(_job(owner, ELASTIC)), ElasticRounds)
    assert isinstance(owner.mode_of(_job(owner, {"mode": "sweep"})), SweepTrials)
    assert isinstance(owner.lifecycle.mode("0" * 16), SingleJob)  # gone from node.db
    names = [mode.name for mode in MODES]
    assert len(set(names)) == len(names) == len(owner.modes)


def test_a_many_unit_modes_unit_end_wakes_its_driver(owner: OwnerRole) -> None:
    for spec in (ELASTIC, {"mode": "sweep"}):
        job = _job(owner, spec, running=True)
        mode = owner.mode_of(job)
        assert mode.many_units
        mode._changed[job.id] = driver = trio.Event()
        owner.lifecycle.end(_unit(owner, job).unit_id, "cancelled", "no longer needed")
        assert driver.is_set()
        assert owner.ctx.jobs.get(job.id).state == "running"  # the driver decides the job


GUARDED = re.compile(r"""(round|trial) (>=|<) 0|spec\[["']mode["']\]|spec\.get\(["']mode["']""")
#: the job JSON the API serves names the job's mode (`node.work.jobs` imports nothing
#: of the modes, so it cannot ask the modes): the one line outside them that may
ALLOWED = {("node/work/jobs/store.py", 'return str(self.spec.get("mode", "single"))')}


def test_only_the_modes_test_a_units_round_or_trial_or_the_specs_mode() -> None:
    """Scans node/work/ only: node/web reads the `mode` field of the API's job JSON
    (`pages.py`), which is what that field is for."""
    root = Path(__file__).resolve().parents[4]
    modes = root / "node" / "work" / "owner" / "modes"
    found = []
    for path in sorted((root / "node" / "work").rglob("*.py")):
        if modes in path.parents:
            continue
        name = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if GUARDED.search(line) and (name, line.strip()) not in ALLOWED:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []
