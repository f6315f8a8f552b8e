"""A sweep job on its owner: the study asks for trials, each trial is a unit on a peer.

The driver keeps `sweep.parallel` trials in flight. It asks the study (`study.py`)
for a trial only when a peer is free to train it, builds the trial's spec (the job's
spec as a `single` job with the sampled values, validated every `report_every`
steps), and offers it like any unit (`node/work/owner/placement.py`). How a trial ends:

- its weights pass the owner's checks: `complete`, with the metric its worker
  reported (a claim, as for any single job), told to the study;
- the pruner stops it (`report`, from the worker's heartbeats): `pruned`;
- its training fails (the sampled values make the spec diverge, say): `failed` at
  once, since any worker would fail the same way;
- its unit is lost (the worker vanished, handed it back, or its weights were
  refused): offered again to another peer, once; then `failed`. A peer that declines
  the offer costs the trial nothing: it is offered to another; nor does an offer
  made as the owner stopped that no heartbeat confirmed after its restart, or a
  result whose worker vanished before it could be verified.
- the job is cancelled: every running trial ends `failed` ("the sweep was cancelled").

The job completes when every trial has ended, with the best trial's weights and
metrics; it fails when no trial completed. After an owner restart the driver loads
the study again and re-offers the trials that were running.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from node.net.peers import unfit_reason
from node.work.jobs import LIVE_UNIT_STATES, Job, Trial, TrialStore, Unit
from node.work.owner.leases import unit_deadline
from node.work.owner.modes.mode import ManyUnits, OwnerParts
from node.work.owner.modes.single import result_metrics
from protocol.receipts import flops_to_credit, partial_credit
from protocol.work import Progress
from training.spec.fields import Section
from training.spec.sweep import SweepSpec, parse_sweep
from training.sweep import study as studies
from training.sweep.trials import trial_spec

log = logging.getLogger(__name__)

MAX_LOST = 1  # a trial whose unit is lost is offered once more, then fails
WAIT_S = 0.5


def sweep_of(job: Job) -> SweepSpec:
    """The job's `[sweep]` table (checked at submit) as a `SweepSpec`."""
    return parse_sweep(Section(job.spec["sweep"], "sweep"))


class SweepTrials(ManyUnits):
    name = "sweep"
    units_are = "trials"

    def __init__(self, parts: OwnerParts) -> None:
        super().__init__(parts)
        self.store = TrialStore(self.ctx.jobs.db)
        self._studies: dict[str, Any] = {}

    # -- the engine's hooks (`JobMode`) -------------------------------------------------

    def where(self, unit: Unit) -> str:
        return f"trial {unit.trial}"

    def unit_lost(self, unit: Unit, reason: str, state: str, at_fault: bool) -> None:
        super().unit_lost(unit, reason, state, at_fault)
        self.trial_lost(unit, reason, True, counted=at_fault)

    def unit_fatal(self, unit: Unit, reason: str) -> None:
        self.trial_lost(unit, reason, False)  # the trial's sampled values fail, not the sweep

    def progress(self, unit: Unit, progress: Progress) -> str:
        return self.report(unit, progress)

    def unit_spec(self, job: Job, unit: Unit) -> dict[str, Any]:
        return self.trial_spec(job, unit.trial)

    def spot_check_reports(self, job: Job, unit: Unit) -> tuple[dict[int, float], str]:
        return self.reports_of(job, unit.trial)

    def accept(self, job: Job, unit: Unit, peer: str, checked: Any) -> str:
        """A trial's weights, checked: complete with the metric its worker reported."""
        result = checked.result
        if not self._lifecycle.share_done(
            unit.unit_id,
            result.weights_sha256,
            self.ctx.blobs.size(result.weights_sha256),
            f"trial {unit.trial}: weights from {peer}{checked.via} checked; receipt issued",
        ):
            return "the sweep ended while it was checked"
        self.trial_done(job, unit, result.weights_sha256, checked.metrics)
        return ""

    def describe(self, job: Job) -> dict[str, Any]:
        trials = self.store.of_job(job.id)
        return {
            "trials": [t.to_json() for t in trials],
            "best": best_trial(trials, job.spec["sweep"]["direction"]),
        }

    def study_path(self, job: Job) -> Path | None:
        path = self._study_file(job.id)
        return path if path.is_file() else None

    def _study_file(self, job_id: str) -> Path:
        return self.ctx.data_dir / "studies" / f"{job_id}.journal"

    def trial_spec(self, job: Job, number: int) -> dict[str, Any]:
        """The plain spec trial `number` of `job` trains (its unit's spec)."""
        from training.spec.job import spec_to_plain

        trial = self.store.get(job.id, number)
        if trial is None:
            raise KeyError(f"job {job.id} has no trial {number}")
        return spec_to_plain(trial_spec(job.spec, trial.params, sweep_of(job).report_every))

    def reports_of(self, job: Job, number: int) -> tuple[dict[int, float], str]:
        """What trial `number` reported to the study (step -> value), and which metric."""
        trial = self.store.get(job.id, number)
        reports = {int(step): float(value) for step, value in trial.reports} if trial else {}
        return reports, sweep_of(job).metric

    # -- the job -----------------------------------------------------------------------

    async def drive(self, job_id: str) -> None:
        """Run `job_id`'s trials until every one has ended."""
        ctx = self.ctx
        job = ctx.jobs.transition(job_id, ("queued",), "sweep started", state="running")
        if job is None:
            return
        sweep = sweep_of(job)
        study = await self._study(job, sweep)
        await self._adopt(job, sweep, study)
        self._changed[job_id] = trio.Event()
        try:
            async with trio.open_nursery() as offers:
                while True:
                    job = ctx.jobs.get(job_id)
                    if job is None or job.state != "running":
                        if job is not None:
                            for trial in self.store.of_job(job_id, "running"):
                                self._end(job, trial.number, "failed", f"the sweep was {job.state}")
                        return
                    trials = self.store.of_job(job_id)
                    running = [t for t in trials if t.state == "running"]
                    await self._weigh(job, sweep, trials)
                    if len(trials) >= sweep.trials and not running:
                        self._complete(job, study)
                        return
                    await self._offer(offers, job, sweep, study, trials, running)
                    with trio.move_on_after(WAIT_S):
                        await self._changed[job_id].wait()
                    self._changed[job_id] = trio.Event()
        finally:
            self._changed.pop(job_id, None)

    async def _adopt(self, job: Job, sweep: SweepSpec, study: Any) -> None:
        """Trials the study asked for whose row was never stored (the owner stopped
        between the two) become running trials again, so none is lost."""
        known = {t.number for t in self.store.of_job(job.id)}
        for number, params in await trio.to_thread.run_sync(studies.running, study, sweep.space):
            if number in known:
                continue
            flops, steps = await trio.to_thread.run_sync(self._cost, job, params, sweep)
            self.store.add(Trial(job.id, number, params, training_flops=flops, total_steps=steps))
            log.info("job %s: trial %d was asked for before a restart; it runs now", job.id, number)

    async def _weigh(self, job: Job, sweep: SweepSpec, trials: list[Trial]) -> None:
        """The params' importances in the job's progress, again each time another
        trial has completed (in a thread: the first call imports `optuna.importance`,
        which takes seconds)."""
        done = [(t.params, t.value) for t in trials if t.state == "complete"]
        done = [(params, value) for params, value in done if value is not None]
        if len(done) < 2 or job.progress.get("importances_from") == len(done):
            return
        try:
            found = await trio.to_thread.run_sync(
                studies.importances, sweep.space, done, sweep.direction
            )
        except Exception:  # a chart is not worth the sweep
            log.exception("job %s: the params' importances could not be computed", job.id)
            found = {}
        progress = {**self._progress(job), "importances": found, "importances_from": len(done)}
        self.ctx.jobs.set_progress(job.id, progress)

    async def _study(self, job: Job, sweep: SweepSpec) -> Any:
        if job.id not in self._studies:
            path = self._study_file(job.id)
            self._studies[job.id] = await trio.to_thread.run_sync(
                studies.open_study, path, job.id, sweep, int(job.spec.get("seed", 0))
            )
        return self._studies[job.id]

    async def _offer(
        self,
        nursery: trio.Nursery,
        job: Job,
        sweep: SweepSpec,
        study: Any,
        trials: list[Trial],
        running: list[Trial],
    ) -> None:
        """A unit for each running trial without one, then new trials while there is
        room and a peer to train them."""
        live = self.ctx.jobs.units_of(job.id, *LIVE_UNIT_STATES)
        placed = {u.trial for u in live}
        candidates = await self._placement.candidates(job, {u.worker for u in live})
        waiting = [t for t in running if t.number not in placed]
        asked = len(trials)
        room = len(candidates) + self._may_train_here(job, live)
        while room > len(waiting) and len(running) < sweep.parallel and (asked < sweep.trials):
            number, params = await trio.to_thread.run_sync(studies.ask, study, sweep.space)
            flops, steps = await trio.to_thread.run_sync(self._cost, job, params, sweep)
            trial = self.store.add(
                Trial(job.id, number, params, training_flops=flops, total_steps=steps)
            )
            running.append(trial)
            waiting.append(trial)
            asked += 1
            self.ctx.jobs.set_progress(job.id, self._progress(job))
        here = self._may_train_here(job, live)
        for trial in waiting:
            if candidates:
                peer = candidates.pop(0)
            elif here:
                peer, here = self.ctx.peer_id, False
            else:
                break
            spec = self.trial_spec(job, trial.number)
            unit = self.ctx.jobs.add_unit(
                job.id,
                peer,
                self.ctx.limits.lease_s * 3,
                deadline=unit_deadline(self.ctx, job, time.time()),
                trial=trial.number,
            )
            self.store.update(job.id, trial.number, ("running",), unit_id=unit.unit_id, worker=peer)
            if peer == self.ctx.peer_id:
                nursery.start_soon(self._train_here, job, unit, spec)
                continue
            note = f"trial {trial.number}: {_shown(trial.params)}"
            nursery.start_soon(partial(self._offer_unit, job, unit, note, spec=spec))

    async def _train_here(self, job: Job, unit: Unit, spec: dict[str, Any]) -> None:
        """Train one trial on this node (every peer that fits is busy): its validations
        go to the study as a worker's heartbeats would, and a pruned trial stops at
        once. The owner's own work earns no receipt."""
        if self._lifecycle.start(unit, f"trial {unit.trial}: training on this node") is None:
            return

        def on_event(event: dict[str, Any], scope: trio.CancelScope) -> None:
            if event.get("event") != "progress" or "val_step" not in event:
                return
            if self.report(unit, progress_of(unit, event)):
                scope.cancel()  # pruned: the trial and its unit are ended already

        trained = await self._parts.run_here(job, unit, spec, on_event)
        if trained is None:
            return
        result, sha = trained
        note = f"trial {unit.trial}: trained on this node"
        size = self.ctx.blobs.size(sha)
        if self._lifecycle.share_done(unit.unit_id, sha, size, note, from_states=("running",)):
            self.trial_done(job, unit, sha, result_metrics(result))

    def _may_train_here(self, job: Job, live: list[Unit]) -> bool:
        """This node takes a trial when its policy allows, it has room, and it is not
        training one of this sweep's already."""
        ctx = self.ctx
        return (
            ctx.has_room()
            and all(u.worker != ctx.peer_id for u in live)
            and unfit_reason(ctx.own_ad(), job.spec.get("requirements", {})) is None
        )

    def _cost(self, job: Job, params: dict[str, Any], sweep: SweepSpec) -> tuple[int, int]:
        """(training flops, steps) of a trial's spec: its credit, whole or in part."""
        from training.budget import validate_for_submit

        data = job.data_files(self.ctx.blobs.path)
        summary = validate_for_submit(trial_spec(job.spec, params, sweep.report_every), data)
        return int(summary.training_flops), int(summary.total_steps)

    def credit(self, job: Job, unit: Unit) -> float:
        """What `unit` of a trial earns: the trial's credit, or the share of it for the
        steps before the pruner stopped it."""
        trial = self.store.get(job.id, unit.trial)
        if trial is None:
            return 0.0
        whole = flops_to_credit(trial.training_flops)
        if trial.state == "pruned" and trial.unit_id == unit.unit_id:
            return partial_credit(whole, trial.steps, trial.total_steps)
        return whole

    def stopped_steps(self, peer: str, job: Job, unit_id: str) -> int | None:
        """The steps before the pruner stopped `peer`'s trial on `unit_id`: its
        worker's failure report earns the partial receipt."""
        unit = self.ctx.jobs.unit(unit_id)
        if unit is None or unit.job_id != job.id or unit.worker != peer:
            return None
        trial = self.store.get(job.id, unit.trial)
        if trial is None or trial.state != "pruned" or trial.unit_id != unit_id:
            return None
        return trial.steps

    def _complete(self, job: Job, study: Any) -> None:
        self._placement.backoff.drop_job(job.id)
        done = self.store.of_job(job.id, "complete")
        if not done:
            ended = self.store.of_job(job.id)
            reasons = "; ".join(f"trial {t.number}: {t.reason}" for t in ended[-3:] if t.reason)
            self.ctx.jobs.transition(
                job.id,
                ("running",),
                "no trial completed",
                state="failed",
                reason=f"no trial completed ({reasons})",
            )
            return
        best = self.store.get(job.id, study.best_trial.number)
        assert best is not None and best.value is not None
        self.ctx.jobs.transition(
            job.id,
            ("running",),
            f"{len(done)} trials completed; best: trial {best.number} ({best.value:.6g})",
            state="completed",
            weights_sha256=best.weights_sha256,
            metrics={**best.metrics, "best_trial": best.number, "best_value": best.value},
            metrics_status=(
                "verified"  # spot-checked: the owner evaluated the trial's weights
                if "check" in best.metrics
                else "local"
                if best.worker == self.ctx.peer_id
                else "claimed"
            ),
            reason="",
        )

    # -- a trial's heartbeats ----------------------------------------------------------

    def report(self, unit: Unit, progress: Progress) -> str:
        """A trial's heartbeat: a new validation value goes to the study; "" to go on,
        or why the trial stops (the pruner said so: the trial is `pruned`)."""
        job = self.ctx.jobs.get(unit.job_id)
        trial = self.store.get(unit.job_id, unit.trial)
        if job is None or trial is None or trial.state != "running":
            return ""
        current = self.ctx.jobs.unit(unit.unit_id)
        if current is None or current.state not in ("offered", "running"):
            return ""  # its result is here already (a heartbeat sent while uploading)
        sweep = sweep_of(job)
        metric = sweep.metric
        value = {"val_loss": progress.val_loss, "val_accuracy": progress.val_accuracy}.get(
            metric, progress.loss
        )
        step = progress.val_step
        if metric == "train_loss":  # the latest batch loss, once per report_every steps
            step = progress.step - progress.step % sweep.report_every
        if value is None or step <= (trial.reports[-1][0] if trial.reports else 0):
            return ""
        study = self._loaded(job)
        pruned = studies.report(study, trial.number, step, float(value))
        self.store.update(
            job.id,
            trial.number,
            ("running",),
            steps=step,
            reports=[*trial.reports, [step, float(value)]][-1000:],
        )
        if not pruned:
            return ""
        reason = f"pruned at step {step} ({metric} {float(value):.6g})"
        self._end(job, trial.number, "pruned", reason, float(value))
        self._lifecycle.end(unit.unit_id, "cancelled", reason)
        return f"trial {trial.number} {reason} by the sweep's pruner"

    # -- how a trial's unit ended (from the lifecycle and the results) ------------------

    def trial_done(self, job: Job, unit: Unit, weights_sha256: str, metrics: dict) -> str:
        """Trial's weights accepted: complete it with its metric; "" or why not."""
        metric = sweep_of(job).metric
        value = metrics.get(metric)
        if not isinstance(value, int | float):
            self._end(job, unit.trial, "failed", f"its result has no {metric}")
            return f"the result has no {metric}"
        self.store.update(
            job.id,
            unit.trial,
            ("running",),
            weights_sha256=weights_sha256,
            steps=int(metrics.get("steps", 0)),
            metrics=metrics,
        )
        self._end(job, unit.trial, "complete", "", float(value))
        return ""

    def trial_lost(self, unit: Unit, reason: str, retry: bool, counted: bool = True) -> None:
        """Trial's unit ended without a result: offered again (once), or failed. A
        loss that is no worker's doing (an offer never confirmed, a result that could
        not be verified) is not `counted` against that once."""
        job = self.ctx.jobs.get(unit.job_id)
        trial = self.store.get(unit.job_id, unit.trial)
        if job is None or trial is None or trial.state != "running":
            return
        if trial.unit_id != unit.unit_id:
            return  # an older unit of the trial: it was offered again already
        if retry and (trial.attempts < MAX_LOST or not counted):
            attempts = trial.attempts + counted
            self.store.update(job.id, trial.number, ("running",), reason=reason, attempts=attempts)
            self.ctx.jobs.note(job.id, f"trial {trial.number}: {reason}; offered again")
        else:
            self._end(job, trial.number, "failed", reason)
        self.unit_changed(job.id)

    def _end(
        self, job: Job, number: int, state: str, reason: str, value: float | None = None
    ) -> None:
        ended = self.store.update(
            job.id, number, ("running",), state=state, reason=reason, value=value
        )
        if ended is None:
            return  # ended already: the study was told once
        studies.tell(self._loaded(job), number, state, value)
        note = f"trial {number} {state}" + (f": {value:.6g}" if value is not None else "")
        self.ctx.jobs.set_progress(
            job.id,
            self._progress(job),
            note + (f" ({reason})" if reason else ""),
        )
        self.unit_changed(job.id)

    def _loaded(self, job: Job) -> Any:
        """The job's study (its driver loads it before any unit of the job is offered;
        this is the fallback, blocking)."""
        if job.id not in self._studies:
            self._studies[job.id] = studies.open_study(
                self._study_file(job.id), job.id, sweep_of(job), int(job.spec.get("seed", 0))
            )
        return self._studies[job.id]

    def _progress(self, job: Job) -> dict[str, Any]:
        """The job's progress: trials ended of all it will run (as steps, for bars),
        and the params' importances as last computed (`_weigh`)."""
        fresh = self.ctx.jobs.get(job.id) or job
        weighed = {k: v for k, v in fresh.progress.items() if k.startswith("importances")}
        counts = {state: 0 for state in ("running", "complete", "pruned", "failed")}
        for trial in self.store.of_job(job.id):
            counts[trial.state] += 1
        total = int(job.spec["sweep"]["trials"])
        ended = total and counts["complete"] + counts["pruned"] + counts["failed"]
        return {
            "phase": "training",
            "step": ended,
            "total_steps": total,
            "fraction": round(ended / total, 4),
            "trials": counts,
            "updated_at": time.time(),
            **weighed,
        }


def _shown(params: dict[str, Any]) -> str:
    return ", ".join(
        f"{k.split('.')[-1]}={v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
        for k, v in params.items()
    )


def best_trial(trials: list[Trial], direction: str) -> dict[str, Any] | None:
    """The best complete trial so far: `number`, `params`, `value` (None before one)."""
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    best = min(done, key=lambda t: (sign * (t.value or 0.0), t.number))
    return {"number": best.number, "params": best.params, "value": best.value}


def progress_of(unit: Unit, event: dict[str, Any]) -> Progress:
    """A local runner's progress event as the heartbeat a worker would send."""
    return Progress(
        unit.job_id,
        unit.unit_id,
        "training",
        int(event.get("step", 0)),
        int(event.get("total_steps", 0)),
        event.get("loss"),
        float(event.get("samples_per_s", 0.0)),
        int(event.get("samples", 0)),
        time.time(),
        val_loss=event.get("val_loss"),
        val_step=int(event.get("val_step", -1)),
        val_accuracy=event.get("val_accuracy"),
    )
