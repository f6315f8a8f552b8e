"""What a submission's uploaded files become before its job exists: the spec rewritten
to name blobs, and the files those blobs will be made from.

Form fields carry the files the spec names: `data` (`data.source`), or `shard0`,
`shard1`, ... (`data.shards[k]` as field `shard<k>`, each its own blob), `program` and
`eval_program` (a program's `.pt2` archives, converted here by our own reader into the
program blob), `init` (`model.init`'s safetensors). `model.trainable` is counted here.
Everything is checked before anything is stored, so a refused job stores nothing. Plain
functions that block: the work service runs them in a worker thread.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.data.info import DataFiles

#: the upload's suffix tells the owner what format a data file is in
UPLOAD_FORMATS = {".csv": "csv", ".npz": "npz", ".safetensors": "safetensors", ".txt": "text"}
MODEL_FIELDS = ("program", "eval_program", "init")
SHARD_FIELD = re.compile(r"shard(0|[1-9][0-9]*)")  # `shard<k>` carries data.shards[k]

Uploads = dict[str, tuple[Path, str]]  # form field -> (where it was saved, its file name)


class SubmitError(ValueError):
    """A job could not be accepted; the message names the field and what to do."""


def with_uploaded_data(spec: Any, upload: tuple[Path, str] | None) -> tuple[Any, Path | None]:
    """The spec reading its uploaded data file as a blob, and that file."""
    from training.spec.job import local_files, with_blob_source

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
    return with_blob_source(spec, sha256_file(path), fmt), path


def with_uploaded_shards(spec: Any, uploads: Uploads) -> tuple[Any, tuple[Path, ...] | None]:
    """A sharded spec reading each uploaded shard as its own blob, and the shard files
    in shard order; (spec, None) for a spec without `data.shards` (no shard may come).

    Each shard must be token ids of `data.format`'s width; the caller validates the
    data as a whole (`validate_for_submit` with the tuple) before storing anything."""
    from training.data.formats import read_tokens
    from training.errors import SpecError
    from training.spec.job import with_blob_shards

    came = sorted((f for f in uploads if SHARD_FIELD.fullmatch(f)), key=lambda f: int(f[5:]))
    shards = spec.data.shards
    if not shards:
        if came:
            raise SubmitError(f"form field {came[0]!r} came, but the spec has no data.shards")
        return spec, None
    if "data" in uploads:
        raise SubmitError(
            "a 'data' file came, but the spec names data.shards: upload shard k as form "
            "field 'shard<k>' (`meshminer submit` does this)"
        )
    for k, shard in enumerate(shards):
        if shard.startswith("blob:"):
            raise SubmitError(
                f"data.shards[{k}] names a blob: a submission uploads every shard, so name "
                "each by its .bin file"
            )
    wanted = [f"shard{k}" for k in range(len(shards))]
    if extra := [f for f in came if f not in wanted]:
        raise SubmitError(
            f"form field {extra[0]!r} came, but data.shards names {len(shards)} files "
            f"(fields 'shard0' to {wanted[-1]!r})"
        )
    if missing := [f for f in wanted if f not in uploads]:
        k = int(missing[0][5:])
        raise SubmitError(
            f"form field {missing[0]!r} is missing: data.shards names {len(shards)} files, "
            f"{len(came)} came; upload data.shards[{k}] ({Path(shards[k]).name}) as "
            f"{missing[0]!r} (`meshminer submit` does this)"
        )
    files = tuple(uploads[f][0] for f in wanted)
    shas = []
    for k, (field, path) in enumerate(zip(wanted, files, strict=True)):
        try:
            read_tokens(path, spec.data.format)  # the width and emptiness, before hashing
        except SpecError as exc:
            problem = str(exc).removeprefix("data.source: ").replace(path.name, uploads[field][1])
            raise SubmitError(f"data.shards[{k}] (form field {field!r}): {problem}") from None
        sha = sha256_file(path)
        if sha in shas:
            raise SubmitError(
                f"form fields {wanted[shas.index(sha)]!r} and {field!r} hold the same bytes; "
                "each shard must be different"
            )
        shas.append(sha)
    return with_blob_shards(spec, shas), files


def named_uploads(message: str, uploads: Uploads) -> str:
    """`message` with each upload's saved name replaced by the name the client gave it
    and its form field, so a refusal names the user's file."""
    by_length = sorted(uploads.items(), key=lambda item: -len(item[1][0].name))
    for field, (path, filename) in by_length:
        message = message.replace(path.name, f"{filename} (form field {field!r})")
    return message


def with_uploaded_model(
    spec: Any, uploads: Uploads, data_file: DataFiles, scratch: Path
) -> tuple[Any, list[Path]]:
    """The spec with its `[model]` files as blobs (a program converted, the init checked
    against the model) and `model.trainable` counted; returns the files to store.
    `data_file` is the uploaded data (a sharded spec's: every shard, in order). The
    converted program is written into `scratch` (the caller removes what is left).
    torch is imported only for a spec with such files or a `model.trainable`: a plain
    spec's submit took 3.5 s on a busy machine importing it into the daemon."""
    import dataclasses

    from training.spec.job import model_files

    wanted = model_files(spec)
    for field in MODEL_FIELDS:
        if field in uploads and field not in wanted:
            raise SubmitError(f"a file came as {field!r}, but the spec sets no model.{field}")
        if field in wanted and field not in uploads:
            raise SubmitError(
                f"model.{field} names {wanted[field].name}: upload it with the spec as form "
                f"field {field!r} (`meshminer submit` and meshminer.submit do this)"
            )
    stored: list[Path] = []
    blobs: dict[str, Path] = {}
    if "program" in wanted:
        from training.program.job import convert

        spec, data = convert(spec, {f: uploads[f][0] for f in wanted if f != "init"})
        sha = spec.model.program.removeprefix("blob:")
        blobs[sha] = scratch / f"program-{sha}"
        blobs[sha].write_bytes(data)
        stored.append(blobs[sha])
    if "init" in wanted:
        from training.model.bind import meta_model
        from training.model.start import check_init, read_init

        path = uploads["init"][0]
        start = dataclasses.replace(spec.start, init=f"blob:{sha256_file(path)}")
        spec = dataclasses.replace(spec, start=start)
        check_init(meta_model(spec, data_file, blobs.get), read_init(path))
        stored.append(path)
    if not spec.start.trainable:
        return spec, stored
    from training.model.bind import bind_trainable

    return bind_trainable(spec, data_file, blobs.get), stored


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
