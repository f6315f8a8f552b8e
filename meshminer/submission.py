"""Submitting a job from Python: `submit()` builds the spec, uploads it with its files.

What the node receives is what `meshminer submit` sends, plus the program files: a
multipart form with `spec` (the TOML text), `data` (a local data file) or, for a
sharded data set, `shard0`, `shard1`, ... (`data.shards[k]` as `shard<k>`), `program`
and `eval_program` (an exported model's `.pt2` files) and `init` (initial weights, a
safetensors file). The node checks everything; its refusal comes back as `NodeError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshminer.connection import Connection
from meshminer.exporting import EVAL_PROGRAM_FILE, PROGRAM_FILE, Exported, export
from meshminer.jobs import Job
from meshminer.multipart import Form
from meshminer.spec import from_keywords, merged
from meshminer.toml import dumps

if TYPE_CHECKING:
    import torch

#: data sources that name no local file: used as they are, nothing uploaded
REMOTE_SOURCES = ("builtin:", "blob:")


def submit(
    model_or_exported: torch.nn.Module | Exported | Mapping[str, Any],
    example_batch: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    *,
    data: str | Path | Sequence[str | Path],
    steps: int | None = None,
    mode: str = "single",
    name: str | None = None,
    output: str = "logits",
    init: str | Path | None = None,
    api: str | None = None,
    token: str | None = None,
    spec: Mapping[str, Any] | None = None,
    **keys: Any,
) -> Job:
    """Submit a training job to the node and return it (queued; `Job.wait()` follows it).

    The model is a module (exported first, with `example_batch`), an `Exported`, or a
    dict, which is a declarative `[model]` table (`{"arch": "mlp", "hidden": [32]}`).
    `data` is a local file (uploaded), a `builtin:`/`blob:` source, or a list of local
    `.bin` token files, an elastic job's `data.shards` (each uploaded as its own blob;
    give `data__format` and `data__vocab_size` too). `output` says what
    a program's forward returns (`logits`, or `loss` for `forward(x, y)`). `init` is a
    safetensors file of initial weights. Any other spec key is a keyword with `__`
    between table and key (`optim__lr=3e-4`, `elastic__workers=3`) or a nested dict in
    `spec`; the arguments come first, `spec` over them, the keywords over both.
    """
    data_table, data_files = _data(data)
    init_file = _existing_file(init, "init") if init is not None else None
    model_table, programs, default_name = _model(model_or_exported, example_batch, output)
    if init_file is not None:
        model_table["init"] = init_file.name
    base: dict[str, Any] = {
        "name": name or default_name,
        "mode": mode,
        "model": model_table,
        "data": data_table,
    }
    if steps is not None:
        base["optim"] = {"steps": steps}
    full_spec = merged(merged(base, spec or {}), from_keywords(keys))

    form = Form()
    form.add_text("spec", dumps(full_spec))
    for field, data_file in data_files.items():
        form.add_file(field, data_file, data_file.name)
    for field, (path, file_name) in programs.items():
        form.add_file(field, path, file_name)
    if init_file is not None:
        form.add_file("init", init_file, init_file.name)
    connection = Connection.to(api, token)
    return Job(connection.post_form("/api/v1/jobs", form), connection)


def _data(data: str | Path | Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Path]]:
    """The spec's `[data]` table (`source`, or `shards`) and the files to upload by form
    field: `data`, or `shard<k>` for `data.shards[k]`."""
    if isinstance(data, str | Path):
        source, data_file = _data_source(data)
        return {"source": source}, {} if data_file is None else {"data": data_file}
    files = [_existing_file(shard, f"data[{k}]") for k, shard in enumerate(data)]
    if not files:
        raise ValueError("data: an empty list names no shard")
    names = [file.name for file in files]
    for k, name in enumerate(names):
        if name in names[:k]:
            raise ValueError(
                f"data[{k}]: a second file named {name!r}; the node sees only names, so "
                "each shard needs its own"
            )
    return {"shards": names}, {f"shard{k}": file for k, file in enumerate(files)}


def _data_source(data: str | Path) -> tuple[str, Path | None]:
    """The spec's `data.source` and the file to upload, if any: a local file goes by its
    name only, since the node never reads a path it is given."""
    if isinstance(data, str) and data.startswith(REMOTE_SOURCES):
        return data, None
    file = _existing_file(data, "data")
    return file.name, file


def _existing_file(path: str | Path, what: str) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{what}: no such file: {file}")
    return file


def _model(
    model: Any, example_batch: Any, output: str
) -> tuple[dict[str, Any], dict[str, tuple[Path, str]], str]:
    """The `[model]` table, the program files by form field, and the job's default name."""
    if isinstance(model, Mapping):
        if example_batch is not None:
            raise TypeError("example_batch is for a module to export; a dict model needs none")
        return dict(model), {}, str(model.get("arch", "model"))
    if isinstance(model, Exported):
        if example_batch is not None:
            raise TypeError("example_batch is for a module to export; this one is exported")
        exported, default_name = model, "program"
    else:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"a model is a torch.nn.Module, an Exported or a dict, not {type(model).__name__}"
            )
        if example_batch is None:
            raise TypeError("submit(module, example_batch, ...): a module needs an example batch")
        exported, default_name = export(model, example_batch), type(model).__name__
    table: dict[str, Any] = {"arch": "program", "program": PROGRAM_FILE}
    programs = {"program": (exported.program, PROGRAM_FILE)}
    if exported.eval_program is not None:
        table["eval_program"] = EVAL_PROGRAM_FILE
        programs["eval_program"] = (exported.eval_program, EVAL_PROGRAM_FILE)
    table["output"] = output
    return table, programs, default_name
