"""The node's work service: stores, the blob server, the owner and worker roles, and
the calls the HTTP API makes about jobs (all in the trio thread).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import tomllib
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.work.blobs import Authorized, BlobServer, serve_blobs_libp2p, size_text
from node.work.context import WorkContext
from node.work.jobs import Job
from node.work.owner import JobMode, OwnerRole, SubmitError, with_uploaded_data, with_uploaded_model
from node.work.owner.submission import named_uploads, with_uploaded_shards
from node.work.run import RunnerRequest, keep_removing_old_folders
from node.work.worker import WorkerRole
from protocol.names import PROGRESS_PROTOCOL, RECEIPT_PROTOCOL, RESULT_PROTOCOL, TASK_PROTOCOL
from protocol.receipts import flops_to_credit
from protocol.work import WORK_LIMITS

if TYPE_CHECKING:
    from training.data.info import DataFiles

log = logging.getLogger(__name__)

BLOB_STOP_S = 2.0  # at shutdown, how long the blob server's threads have to end


def credit_for(spec: dict[str, Any], data_file: Path | None) -> float:
    """This node's own figure (TFLOP) for a unit of `spec`: never the other side's word."""
    from training.budget import validate_for_submit
    from training.spec.job import parse_spec

    summary = validate_for_submit(parse_spec(spec), data_file)
    return flops_to_credit(summary.training_flops)


def validate_wire_spec(plain: dict[str, Any]) -> dict[str, Any]:
    """A spec from a peer: parse and re-validate it here; returns its plain form.

    A built-in data set needs nothing fetched, so the budget (parameters, memory) is
    checked here too and an oversized model is declined with the offer; for blob data
    the runner checks it once the data is here, before anything is allocated."""
    from training.budget import validate_for_submit
    from training.spec.job import SpecError, parse_spec, spec_to_plain

    spec = parse_spec(plain)
    if spec.model.arch == "program" and not spec.model.program.startswith("blob:"):
        raise SpecError("model.program: a worker reads programs only from blobs")
    if spec.data.shards:
        for k, shard in enumerate(spec.data.shards):
            if not shard.startswith("blob:"):
                raise SpecError(f"data.shards[{k}]: a worker reads shards only from blobs")
        return spec_to_plain(spec)
    origin = spec.data.parsed.origin
    if origin == "builtin":
        validate_for_submit(spec, None)
    elif origin != "blob":
        raise SpecError(
            f"data.source {spec.data.source[:100]!r}: a worker reads data only from blobs "
            "or built-in data sets"
        )
    return spec_to_plain(spec)


def note_served(
    ctx: WorkContext, mode_of: Callable[[Job], JobMode], auth: Authorized, path: str
) -> None:
    """The owner's timeline says which path each blob it handed a worker took (the
    job's data, a round's weights); blobs this node served as a worker are not noted."""
    job = ctx.jobs.get(auth.grant.job_id)  # only jobs this node owns are there
    if job is None:
        return
    unit = ctx.jobs.unit(auth.grant.unit_id)
    if auth.sha256 in job.data_blobs:
        program = job.spec.get("model", {}).get("arch") == "program"
        what = "the program" if program and auth.sha256 not in job.data_shas else "the data"
    else:
        named = mode_of(job).served(unit, auth.sha256, auth.size) if unit is not None else None
        what = named or f"blob {auth.sha256[:12]}"
    note = f"{what} ({size_text(auth.size)}) fetched by {auth.requester} ({path})"
    ctx.jobs.note(job.id, note)


class WorkService:
    def __init__(self, ctx: WorkContext, memory_limit_mb: int, warm_runners: bool = False) -> None:
        self.ctx = ctx
        self._memory_limit_mb = memory_limit_mb
        self._warm_runners = warm_runners
        self.blob_server = BlobServer(
            ctx.blobs,
            ctx.identity,
            ctx.host.listen_ip,
            0,
            lambda job, unit: ctx.grant_keys.get((job, unit)),
            on_served=self._served,
            rate=ctx.upload_cap,
        )
        self._token: trio.lowlevel.TrioToken | None = None
        ctx.credit_for = credit_for
        self.owner = OwnerRole(ctx, self._request)
        self.worker: WorkerRole | None = None

    def _request(self, spec: dict[str, Any], blobs: dict[str, str], out: Path) -> RunnerRequest:
        return RunnerRequest.for_spec(
            spec,
            blobs,
            out,
            gpu_memory_fraction=self.ctx.policy().max_gpu_memory_share,
            memory_limit_mb=self._memory_limit_mb,
            gpus=self.ctx.preferences().gpus,
        )

    def _served(self, auth: Authorized, path: str) -> None:
        """From any thread: a blob went out whole; noted in the trio thread."""
        if self._token is not None:
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(note_served, self.ctx, self.owner.mode_of, auth, path)

    async def run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.ctx.data_port = await trio.to_thread.run_sync(self.blob_server.start)
        try:
            async with trio.open_nursery() as nursery:
                self.worker = WorkerRole(self.ctx, self._request, validate_wire_spec, nursery)
                host = self.ctx.host
                host.serve(TASK_PROTOCOL, self.worker.handle_offer, WORK_LIMITS.max_bytes)
                host.serve(PROGRESS_PROTOCOL, self.owner.handle_progress, WORK_LIMITS.max_bytes)
                host.serve(
                    RESULT_PROTOCOL, self.owner.handle_result, WORK_LIMITS.max_bytes, timeout=900
                )
                host.serve(RECEIPT_PROTOCOL, self.owner.handle_countersigned, WORK_LIMITS.max_bytes)
                serve_blobs_libp2p(
                    host,
                    self.ctx.blobs,
                    lambda job, unit: self.ctx.grant_keys.get((job, unit)),
                    on_served=self._served,
                    rate=self.ctx.upload_cap,
                )
                log.info("blob data channel on port %d", self.ctx.data_port)
                nursery.start_soon(self.owner.run)
                if self._warm_runners:
                    nursery.start_soon(self._warm_at_start)
                nursery.start_soon(
                    keep_removing_old_folders,
                    self.ctx.data_dir / "units",
                    self.ctx.limits.unit_files_keep_s,
                    lambda: set(self.ctx.units_here),
                )
                await trio.sleep_forever()
        finally:
            # quick, but the node's stop bounds it (and the scope may already be cancelled)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + BLOB_STOP_S):
                await trio.to_thread.run_sync(self.blob_server.stop, abandon_on_cancel=True)

    async def _warm_at_start(self) -> None:
        """The runners' fork server, started with the node (`warm_runners`): the first
        task then skips torch's import (1-3 s of CPU; on a machine whose nodes all
        start at once, a job's first round waited for each node's in turn)."""
        try:
            await self.ctx.warm_runners()
        except Exception as exc:  # its first task starts a runner fresh
            log.warning("could not start the runners' fork server: %s", exc)

    # -- the API's calls -------------------------------------------------------------

    async def submit(self, spec_toml: str, uploads: dict[str, tuple[Path, str]]) -> dict[str, Any]:
        """Validate a spec and its uploaded files (data or its shards, a program's
        archives), store them as blobs, queue the job. A refused job stores nothing."""
        from training.budget import validate_for_submit
        from training.spec.job import SpecError, parse_spec, spec_to_plain

        try:
            spec = parse_spec(tomllib.loads(spec_toml))
        except tomllib.TOMLDecodeError as exc:
            raise SubmitError(f"the job spec is not valid TOML: {exc}") from exc
        except SpecError as exc:
            raise SubmitError(str(exc)) from exc
        scratch = Path(tempfile.mkdtemp(prefix="submit-", dir=self.ctx.data_dir))
        try:
            # a sharded spec's data: every shard its own blob, in shard order
            spec, shards = await trio.to_thread.run_sync(with_uploaded_shards, spec, uploads)
            data: DataFiles = shards
            if shards is None:
                spec, data = await trio.to_thread.run_sync(
                    with_uploaded_data, spec, uploads.get("data")
                )
            spec, files = await trio.to_thread.run_sync(
                with_uploaded_model, spec, uploads, data, scratch
            )
            summary = await trio.to_thread.run_sync(validate_for_submit, spec, data)
            # the data's blobs first (every shard, in order), then a program's, an init's
            files[:0] = shards if shards is not None else [data] if data is not None else []
            blobs = [await trio.to_thread.run_sync(self.ctx.blobs.put_file, f) for f in files]
        except (SpecError, ValueError) as exc:
            raise SubmitError(named_uploads(str(exc), uploads)) from exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        job = self.ctx.jobs.create(
            spec.name, spec_to_plain(spec), spec.placement, _plain(summary), blobs
        )
        log.info("job %s (%s) submitted", job.id, job.name)
        self.owner.wake()
        return job.to_json()

    def jobs(self) -> list[dict[str, Any]]:
        return [_brief(job, self.ctx.peer_id) for job in self.ctx.jobs.list()]

    def job(self, job_id: str) -> dict[str, Any] | None:
        job = self.ctx.jobs.get(job_id)
        if job is None:
            return None
        return {**labelled_job(job, self.ctx.peer_id), **self.owner.mode_of(job).describe(job)}

    def study_path(self, job_id: str) -> Path | None:
        """A sweep job's study file (Optuna journal storage), once it exists."""
        job = self.ctx.jobs.get(job_id)
        return None if job is None else self.owner.mode_of(job).study_path(job)

    def weights_path(self, job_id: str) -> Path | None:
        job = self.ctx.jobs.get(job_id)
        if job is None or not job.weights_sha256 or not self.ctx.blobs.has(job.weights_sha256):
            return None
        return self.ctx.blobs.path(job.weights_sha256)

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        job = self.owner.cancel(job_id)
        return None if job is None else labelled_job(job, self.ctx.peer_id)


def labelled_job(job: Job, me: str) -> dict[str, Any]:
    """The job's JSON with `metrics_status` said for rows from before it was stored:
    metrics a remote worker reported are its claim, ours are local."""
    out = job.to_json()
    if not out["metrics_status"] and job.metrics:
        out["metrics_status"] = "claimed" if job.worker and job.worker != me else "local"
    return out


def _brief(job: Job, me: str) -> dict[str, Any]:
    out = labelled_job(job, me)
    out["progress"] = {k: v for k, v in job.progress.items() if k != "history"}
    out.pop("spec")
    out.pop("timeline")
    return out


def _plain(summary: Any) -> dict[str, Any]:
    if isinstance(summary, dict):
        return summary
    from dataclasses import asdict, is_dataclass

    return asdict(summary) if is_dataclass(summary) else {"summary": str(summary)}
