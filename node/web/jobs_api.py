"""Job routes: submit (spec + uploaded files), list, show, weights, a sweep's study, cancel.

A submission's files (`data`, or a sharded data set's `shard0`, `shard1`, ...; a
program's `program` and `eval_program` archives; `init`) are each streamed to a
temporary file in the data dir with a size cap, then handed to the work service, which
stores each as a content-addressed blob. The API never opens a server path named by a
request.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

from aiohttp import BodyPartReader, web

from node.net.bridge import TrioBridge
from node.web.api import WriteGuard, json_body
from training.spec.shards import MAX_SHARDS

MAX_SPEC_BYTES = 64 * 1024
UPLOAD_FIELDS = ("data", "program", "eval_program", "init")
#: field `shard<k>` carries `data.shards[k]` (a sharded spec uploads these, not `data`)
SHARD_FIELDS = tuple(f"shard{k}" for k in range(MAX_SHARDS))
JOB_ID = r"{job_id:[0-9a-f]{16}}"


class Jobs(Protocol):
    async def submit(self, spec_toml: str, uploads: dict[str, tuple[Path, str]]) -> dict: ...
    def jobs(self) -> list[dict[str, Any]]: ...
    def job(self, job_id: str) -> dict[str, Any] | None: ...
    def weights_path(self, job_id: str) -> Path | None: ...
    def study_path(self, job_id: str) -> Path | None: ...
    def cancel(self, job_id: str) -> dict[str, Any] | None: ...


def job_routes(
    jobs: Jobs,
    bridge: TrioBridge,
    guard: WriteGuard,
    upload_dir: Path,
    max_upload_bytes: int,
    submit_error: type[Exception],
):
    """Returns a function that adds the job routes to an app."""

    async def submit(request: web.Request) -> web.Response:
        guard.check(request)
        upload_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_hex(8)
        fields = UPLOAD_FIELDS + SHARD_FIELDS
        paths = {field: upload_dir / f"upload-{token}-{field}" for field in fields}
        try:
            spec, uploads = await _read_submission(request, paths, max_upload_bytes)
            try:
                job = await bridge.call_async(jobs.submit, spec, uploads)
            except submit_error as exc:
                raise web.HTTPBadRequest(text=str(exc)) from exc
        finally:
            for path in paths.values():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return web.json_response(job, status=201)

    async def list_jobs(request: web.Request) -> web.Response:
        return web.json_response(await bridge.call(jobs.jobs))

    async def show(request: web.Request) -> web.Response:
        job = await bridge.call(jobs.job, request.match_info["job_id"])
        if job is None:
            raise web.HTTPNotFound(text=f"no job {request.match_info['job_id']} on this node")
        return web.json_response(job)

    async def weights(request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["job_id"]
        path = await bridge.call(jobs.weights_path, job_id)
        if path is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no weights (unknown or not completed)")
        return _download(path, f"{job_id}.safetensors")

    async def study(request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["job_id"]
        path = await bridge.call(jobs.study_path, job_id)
        if path is None:
            raise web.HTTPNotFound(text=f"job {job_id} has no study (unknown or not a sweep)")
        return _download(path, f"{job_id}.journal")

    async def cancel(request: web.Request) -> web.Response:
        guard.check(request)
        job = await bridge.call(jobs.cancel, request.match_info["job_id"])
        if job is None:
            raise web.HTTPNotFound(text=f"no job {request.match_info['job_id']} on this node")
        return web.json_response(job)

    def add(app: web.Application) -> None:
        app.router.add_post("/api/v1/jobs", submit)
        app.router.add_get("/api/v1/jobs", list_jobs)
        app.router.add_get(f"/api/v1/jobs/{JOB_ID}", show)
        app.router.add_get(f"/api/v1/jobs/{JOB_ID}/weights", weights)
        app.router.add_get(f"/api/v1/jobs/{JOB_ID}/study", study)
        app.router.add_post(f"/api/v1/jobs/{JOB_ID}/cancel", cancel)

    return add


def _download(path: Path, filename: str) -> web.FileResponse:
    return web.FileResponse(
        path,
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{filename}"',
        },
    )


async def _read_submission(
    request: web.Request, paths: dict[str, Path], max_bytes: int
) -> tuple[str, dict[str, tuple[Path, str]]]:
    """(spec TOML, {field: (where it was saved, the file name the client gave)})."""
    if request.content_type == "application/json":
        body = await json_body(request)
        spec = body.get("spec")
        if not isinstance(spec, str):
            raise web.HTTPBadRequest(text="'spec' must be the job spec as TOML text")
        return spec, {}
    if request.content_type != "multipart/form-data":
        raise web.HTTPUnsupportedMediaType(
            text="send multipart/form-data (fields 'spec' and optional files "
            f"{', '.join(repr(f) for f in UPLOAD_FIELDS)} or 'shard0'..'shard{MAX_SHARDS - 1}'"
            ') or JSON {"spec": "..."}'
        )
    reader = await request.multipart()
    spec: str | None = None
    uploads: dict[str, tuple[Path, str]] = {}
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise web.HTTPBadRequest(text="nested multipart is not accepted")
        if part.name == "spec":
            raw = await part.read(decode=False)
            if len(raw) > MAX_SPEC_BYTES:
                raise web.HTTPRequestEntityTooLarge(max_size=MAX_SPEC_BYTES, actual_size=len(raw))
            spec = raw.decode("utf-8", errors="replace")
        elif part.name in paths:
            if part.name in uploads:
                raise web.HTTPBadRequest(text=f"one {part.name!r} file per job")
            await _save_part(part, paths[part.name], max_bytes)
            uploads[part.name] = (paths[part.name], Path(part.filename or part.name).name)
        elif part.name is not None and part.name.startswith("shard"):
            raise web.HTTPBadRequest(
                text=f"unexpected form field {part.name!r}: shards are fields 'shard0' to "
                f"'shard{MAX_SHARDS - 1}' (data.shards[k] as 'shard<k>', at most {MAX_SHARDS})"
            )
        else:
            raise web.HTTPBadRequest(text=f"unexpected form field {part.name!r}")
    if spec is None:
        raise web.HTTPBadRequest(text="the form has no 'spec' field (the job spec as TOML)")
    _check_shard_fields(uploads)
    return spec, uploads


def _check_shard_fields(uploads: dict[str, tuple[Path, str]]) -> None:
    """Shard fields number the spec's `data.shards` from 0 with no gap, and come instead
    of a `data` file (the work service checks the count against the spec)."""
    shards = [field for field in SHARD_FIELDS if field in uploads]
    if not shards:
        return
    if "data" in uploads:
        raise web.HTTPBadRequest(
            text="form field 'data' came with shard fields: a sharded job (data.shards) "
            "uploads data.shards[k] as 'shard<k>' and no 'data'"
        )
    for k, field in enumerate(shards):
        if field != f"shard{k}":
            raise web.HTTPBadRequest(
                text=f"form field {field!r} came without 'shard{k}': shard fields number "
                "data.shards from 'shard0', with no gap"
            )


async def _save_part(part: BodyPartReader, path: Path, max_bytes: int) -> None:
    size = 0
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        while chunk := await part.read_chunk(1 << 20):
            size += len(chunk)
            if size > max_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size)
            f.write(chunk)
