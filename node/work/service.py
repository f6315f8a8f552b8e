"""The node's work service: stores, the blob server, the owner and worker roles, and
the calls the HTTP API makes about jobs (all in the trio thread).
"""

from __future__ import annotations

import hashlib
import logging
import tomllib
from contextlib import suppress
from pathlib import Path
from typing import Any

import trio

from node.work.blob_auth import Authorized
from node.work.blobs import size_text
from node.work.context import WorkContext
from node.work.jobs import Job
from node.work.owner import OwnerRole
from node.work.transfer import BlobServer, serve_blobs_libp2p
from node.work.trial_store import Trial
from node.work.unit_files import keep_sweeping
from node.work.worker import WorkerRole
from protocol.names import PROGRESS_PROTOCOL, RECEIPT_PROTOCOL, RESULT_PROTOCOL, TASK_PROTOCOL
from protocol.receipts import flops_to_credit
from protocol.work import WORK_LIMITS

log = logging.getLogger(__name__)

#: the upload's suffix tells the owner what format a data file is in
UPLOAD_FORMATS = {".csv": "csv", ".npz": "npz", ".safetensors": "safetensors", ".txt": "text"}


class SubmitError(ValueError):
    """A job could not be accepted; the message names the field and what to do."""


def runner_request(
    spec: dict[str, Any],
    blobs: dict[str, str],
    out: Path,
    *,
    gpu_memory_fraction: float,
    memory_limit_mb: int,
    gpus: list[int] | None = None,
) -> dict[str, Any]:
    device = "cpu" if spec.get("requirements", {}).get("gpu") == "none" else "auto"
    return {
        "spec": spec,
        "blobs": blobs,
        "out": str(out),
        "device": device,
        "gpu_memory_fraction": gpu_memory_fraction,
        "memory_limit_mb": memory_limit_mb,
        **({"gpus": list(gpus)} if gpus else {}),
    }


def credit_for(spec: dict[str, Any], data_file: Path | None) -> float:
    """This node's own figure (TFLOP) for a unit of `spec`: never the other side's word."""
    from training.budget import validate_for_submit
    from training.spec import parse_spec

    summary = validate_for_submit(parse_spec(spec), data_file)
    return flops_to_credit(summary.training_flops)


def validate_wire_spec(plain: dict[str, Any]) -> dict[str, Any]:
    """A spec from a peer: parse and re-validate it here; returns its plain form.

    A built-in data set needs nothing fetched, so the budget (parameters, memory) is
    checked here too and an oversized model is declined with the offer; for blob data
    the runner checks it once the data is here, before anything is allocated."""
    from training.budget import validate_for_submit
    from training.spec import SpecError, parse_spec, spec_to_plain

    spec = parse_spec(plain)
    if spec.model.arch == "program" and not spec.model.program.startswith("blob:"):
        raise SpecError("model.program: a worker reads programs only from blobs")
    origin = spec.data.parsed.origin
    if origin == "builtin":
        validate_for_submit(spec, None)
    elif origin != "blob":
        raise SpecError(
            f"data.source {spec.data.source[:100]!r}: a worker reads data only from blobs "
            "or built-in data sets"
        )
    return spec_to_plain(spec)


def note_served(ctx: WorkContext, auth: Authorized, path: str) -> None:
    """The owner's timeline says which path each blob it handed a worker took (the
    job's data, a round's weights); blobs this node served as a worker are not noted."""
    job = ctx.jobs.get(auth.grant.job_id)  # only jobs this node owns are there
    if job is None:
        return
    unit = ctx.jobs.unit(auth.grant.unit_id)
    if auth.sha256 in job.data_blobs:
        program = job.spec.get("model", {}).get("arch") == "program"
        what = "the program" if program and auth.sha256 != job.data_sha256 else "the data"
    elif unit is not None and unit.round >= 0:
        what = f"round {unit.round}'s weights"
    else:
        what = f"blob {auth.sha256[:12]}"
    note = f"{what} ({size_text(auth.size)}) fetched by {auth.requester} ({path})"
    ctx.jobs.transition(job.id, ("running",), note)


class WorkService:
    def __init__(self, ctx: WorkContext, memory_limit_mb: int) -> None:
        self.ctx = ctx
        self._memory_limit_mb = memory_limit_mb
        self.blob_server = BlobServer(
            ctx.blobs,
            ctx.identity,
            ctx.host.listen_ip,
            0,
            lambda job, unit: ctx.grant_keys.get((job, unit)),
            on_served=self._served,
        )
        self._token: trio.lowlevel.TrioToken | None = None
        ctx.credit_for = credit_for
        self.owner = OwnerRole(ctx, self._request)
        self.worker: WorkerRole | None = None

    def _request(self, spec: dict[str, Any], blobs: dict[str, str], out: Path) -> dict[str, Any]:
        return runner_request(
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
                self._token.run_sync_soon(note_served, self.ctx, auth, path)

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
                )
                log.info("blob data channel on port %d", self.ctx.data_port)
                nursery.start_soon(self.owner.run)
                nursery.start_soon(
                    keep_sweeping,
                    self.ctx.data_dir / "units",
                    self.ctx.unit_files_keep_s,
                    lambda: set(self.ctx.units_here),
                )
                await trio.sleep_forever()
        finally:
            self.blob_server.stop()  # quick; the scope may already be cancelled

    # -- the API's calls -------------------------------------------------------------

    async def submit(self, spec_toml: str, uploads: dict[str, tuple[Path, str]]) -> dict[str, Any]:
        """Validate a spec and its uploaded files (data, a program's archives), store them
        as blobs, queue the job. A refused job stores nothing."""
        from training.budget import validate_for_submit
        from training.spec import SpecError, parse_spec, spec_to_plain

        try:
            spec = parse_spec(tomllib.loads(spec_toml))
        except tomllib.TOMLDecodeError as exc:
            raise SubmitError(f"the job spec is not valid TOML: {exc}") from exc
        except SpecError as exc:
            raise SubmitError(str(exc)) from exc
        try:
            spec, data_path = await self._uploaded_data(spec, uploads.get("data"))
            spec, program = await trio.to_thread.run_sync(_converted_program, spec, uploads)
            summary = await trio.to_thread.run_sync(validate_for_submit, spec, data_path)
        except (SpecError, ValueError) as exc:
            raise SubmitError(str(exc)) from exc
        blobs: list[str] = []
        if data_path is not None:
            blobs.append(await trio.to_thread.run_sync(self.ctx.blobs.put_file, data_path))
        if program is not None:
            blobs.append(await trio.to_thread.run_sync(self.ctx.blobs.put_bytes, program))
        job = self.ctx.jobs.create(
            spec.name, spec_to_plain(spec), spec.placement, _plain(summary), blobs
        )
        log.info("job %s (%s) submitted", job.id, job.name)
        self.owner.wake()
        return job.to_json()

    async def _uploaded_data(
        self, spec: Any, upload: tuple[Path, str] | None
    ) -> tuple[Any, Path | None]:
        """The spec reading its uploaded data file as a blob, and that file."""
        from training.spec import local_files, with_blob_source

        needs = local_files(spec)
        if not needs:
            if upload is not None:
                raise SubmitError("a data file was uploaded, but data.source names no file")
            return spec, None
        if upload is None:
            raise SubmitError(
                f"data.source names a local file ({needs[0].name}): upload it with the "
                "spec (`meshminer submit` does this); the API never reads server paths"
            )
        path, filename = upload
        suffix = Path(filename).suffix.lower()
        if str(spec.data.source).startswith("builtin:text:"):
            fmt = "text"
        elif suffix == ".bin":  # raw token ids: only the spec can say how wide
            fmt = spec.data.format
        else:
            fmt = UPLOAD_FORMATS.get(suffix)
        if fmt is None:
            raise SubmitError(
                f"data file {filename!r}: use .csv, .npz, .safetensors, .txt, or .bin "
                'token ids with data.format = "tokens16" or "tokens32" (pickle and .pt '
                "files are never accepted)"
            )
        sha = await trio.to_thread.run_sync(_sha256_file, path)
        return with_blob_source(spec, sha, fmt), path

    def jobs(self) -> list[dict[str, Any]]:
        return [_brief(job, self.ctx.peer_id) for job in self.ctx.jobs.list()]

    def job(self, job_id: str) -> dict[str, Any] | None:
        job = self.ctx.jobs.get(job_id)
        if job is None:
            return None
        out = labelled_job(job, self.ctx.peer_id)
        if job.spec.get("mode") == "elastic":
            out["rounds"] = [r.to_json() for r in self.owner.rounds.store.of_job(job_id)]
        if job.spec.get("mode") == "sweep":
            trials = self.owner.sweeps.store.of_job(job_id)
            out["trials"] = [t.to_json() for t in trials]
            out["best"] = best_trial(trials, job.spec["sweep"]["direction"])
        return out

    def study_path(self, job_id: str) -> Path | None:
        """A sweep job's study file (Optuna journal storage), once it exists."""
        job = self.ctx.jobs.get(job_id)
        if job is None or job.spec.get("mode") != "sweep":
            return None
        path = self.owner.sweeps.study_path(job_id)
        return path if path.is_file() else None

    def weights_path(self, job_id: str) -> Path | None:
        job = self.ctx.jobs.get(job_id)
        if job is None or not job.weights_sha256 or not self.ctx.blobs.has(job.weights_sha256):
            return None
        return self.ctx.blobs.path(job.weights_sha256)

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        job = self.owner.cancel(job_id)
        return None if job is None else labelled_job(job, self.ctx.peer_id)


def _converted_program(spec: Any, uploads: dict[str, tuple[Path, str]]) -> tuple[Any, bytes | None]:
    """A program spec's uploaded archives converted (read by our own reader, checked,
    dry-run): the spec now naming the program blob with its figures, and the blob's bytes.
    """
    from training.program.job import convert
    from training.spec import program_files

    wanted = program_files(spec)
    extra = [field for field in ("program", "eval_program") if field in uploads]
    if not wanted:
        if extra:
            raise SubmitError(f"a {extra[0]} file was uploaded, but model.arch is not program")
        return spec, None
    for field, name in wanted.items():
        if field not in uploads:
            raise SubmitError(
                f"model.{field} names {name.name}: upload it with the spec as form field "
                f"{field!r} (`meshminer submit` and meshminer.submit do this)"
            )
    if set(extra) - set(wanted):
        raise SubmitError("an eval_program file was uploaded, but model.eval_program is not set")
    return convert(spec, {field: uploads[field][0] for field in wanted})


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def best_trial(trials: list[Trial], direction: str) -> dict[str, Any] | None:
    """The best complete trial so far: `number`, `params`, `value` (None before one)."""
    done = [t for t in trials if t.state == "complete" and t.value is not None]
    if not done:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    best = min(done, key=lambda t: (sign * (t.value or 0.0), t.number))
    return {"number": best.number, "params": best.params, "value": best.value}


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
