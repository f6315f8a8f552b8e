"""Our own reader of a `torch.export.save` archive (`.pt2`): zip entries, JSON and raw
tensor bytes, nothing else.

`torch.export.load` must never read a stranger's file: it unpickles, `exec`s guard
code, `sympify`s size expressions and `dlopen`s compiled code (measured facts in
docs/programs.md). This reader opens only the entries the format defines, refuses
every other entry by name, never opens the sample inputs (a pickle in every honest
archive), and builds tensors from bytes whose extent it has checked first.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.program.errors import ProgramError
from training.program.graph import DTYPES, STATE_NAME, STRIDED

MAX_ARCHIVE_BYTES = 16 * 2**30
MAX_JSON_BYTES = 64 * 2**20
MAX_ENTRIES = 100_000
_ROOT = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_TENSOR_FILE = {
    "weights": re.compile(r"weight_[0-9]{1,9}"),
    "constants": re.compile(r"tensor_[0-9]{1,9}"),
}
_FIXED = {
    "archive_format",
    "archive_version",
    "byteorder",
    ".data/version",
    ".data/serialization_id",
    "models/model.json",
    "data/weights/model_weights_config.json",
    "data/constants/model_constants_config.json",
    "data/sample_inputs/model.pt",
}
_GUARD = re.compile(
    r"(?:\s|[0-9]{1,9}|[()*+<>=!-]|L\['[A-Za-z_][A-Za-z0-9_]{0,99}'\]\.size\(\)\[[0-9]{1,2}\])*"
)
_NEVER_READ = "data/sample_inputs/model.pt"  # torch.save's pickle: present, never opened


@dataclass(frozen=True)
class Archive:
    """What a `.pt2` holds that a program keeps: the graph and the named tensors."""

    graph_module: dict[str, Any]  # torch's serialized graph and signature
    tensors: dict[str, torch.Tensor]  # state name -> tensor (tied names share one)
    persistent: frozenset[str]  # names from the weights config (the rest are constants)


def read_pt2(path: Path, label: str | None = None) -> Archive:
    """Read and check `path`; `ProgramError` naming the entry or field that is refused,
    the file called `label` (default: its name) in the message."""
    path = Path(path)
    label = label or path.name
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ProgramError(f"{label}: cannot read it: {exc.strerror or exc}") from None
    if size > MAX_ARCHIVE_BYTES:
        raise ProgramError(f"{label}: over {MAX_ARCHIVE_BYTES >> 30} GiB")
    try:
        with zipfile.ZipFile(path) as archive:
            return _read(archive, label)
    except zipfile.BadZipFile as exc:
        raise ProgramError(f"{label}: not a torch.export archive: {exc}") from None


def _read(archive: zipfile.ZipFile, label: str) -> Archive:
    entries = _entries(archive, label)
    _expect(entries, "archive_format", b"pt2", label)
    _expect(entries, "byteorder", b"little", label)
    model = _json(entries, "models/model.json", label)
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise ProgramError(f"{label}: models/model.json has no graph_module")
    _check_guards(model.get("guards_code"), label)
    schema = model.get("schema_version")
    if not isinstance(schema, dict) or schema.get("major") != 8:
        raise ProgramError(f"{label}: schema version {str(schema)[:60]} is not 8.x (torch 2.13's)")
    tensors: dict[str, torch.Tensor] = {}
    persistent: set[str] = set()
    for folder in ("weights", "constants"):
        config = _json(entries, f"data/{folder}/model_{folder}_config.json", label, missing={})
        names = _tensors(entries, folder, config, label, tensors)
        if folder == "weights":
            persistent |= names
    return Archive(model["graph_module"], tensors, frozenset(persistent))


@dataclass(frozen=True)
class _Entries:
    zip: zipfile.ZipFile
    infos: dict[str, zipfile.ZipInfo]

    def __contains__(self, name: str) -> bool:
        return name in self.infos


def _check_guards(guards: Any, label: str) -> None:
    """Guards are Python that `torch.export.load` would exec. They are never run here
    (a program carries none; the interpreter checks its inputs itself), and an archive
    whose guards are anything but comparisons of input sizes is refused as hostile."""
    if guards is None:
        return
    if not isinstance(guards, list) or len(guards) > 64:
        raise ProgramError(f"{label}: guards_code must be a short list")
    for guard in guards:
        if not isinstance(guard, str) or len(guard) > 512 or not _GUARD.fullmatch(guard):
            raise ProgramError(
                f"{label}: guard {str(guard)[:80]!r} is not a comparison of input sizes; "
                "guard code is never run, and an archive carrying other code is refused"
            )


def _entries(archive: zipfile.ZipFile, label: str) -> _Entries:
    infos = archive.infolist()
    if len(infos) > MAX_ENTRIES:
        raise ProgramError(f"{label}: {len(infos)} entries; at most {MAX_ENTRIES}")
    roots = {info.filename.split("/", 1)[0] for info in infos}
    if len(roots) != 1 or not _ROOT.fullmatch(next(iter(roots), "")):
        raise ProgramError(f"{label}: entries must sit under one plain root folder")
    entries: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename.split("/", 1)[1] if "/" in info.filename else ""
        if info.is_dir() or name == "":
            continue
        if not _known(name):
            raise ProgramError(f"{label}: entry {name[:120]!r} is not part of the format")
        if info.flag_bits & 0x1:
            raise ProgramError(f"{label}: entry {name!r} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise ProgramError(f"{label}: entry {name!r} is compressed; the format stores entries")
        if name in entries:
            raise ProgramError(f"{label}: entry {name!r} appears twice")
        entries[name] = info
    if "models/model.json" not in entries:
        raise ProgramError(f"{label}: no models/model.json (is this a torch.export archive?)")
    return _Entries(archive, entries)


def _known(name: str) -> bool:
    if name in _FIXED:
        return True
    folder, _, file = name.removeprefix("data/").partition("/")
    pattern = _TENSOR_FILE.get(folder)
    return name.startswith("data/") and pattern is not None and bool(pattern.fullmatch(file))


def _bytes(entries: _Entries, name: str, label: str, limit: int) -> bytes:
    assert name != _NEVER_READ
    info = entries.infos[name]
    if info.file_size > limit:
        raise ProgramError(f"{label}: entry {name!r} is over {limit} bytes")
    data = entries.zip.read(info)
    if len(data) != info.file_size:
        raise ProgramError(f"{label}: entry {name!r} is not the size its header says")
    return data


def _expect(entries: _Entries, name: str, value: bytes, label: str) -> None:
    if name not in entries or _bytes(entries, name, label, 64).strip() != value:
        raise ProgramError(f"{label}: {name} must be {value.decode()!r}")


def _json(entries: _Entries, name: str, label: str, missing: Any = None) -> Any:
    if name not in entries:
        if missing is not None:
            return missing
        raise ProgramError(f"{label}: no {name}")
    try:
        return json.loads(_bytes(entries, name, label, MAX_JSON_BYTES))
    except (ValueError, RecursionError) as exc:
        raise ProgramError(f"{label}: {name} is not valid JSON: {str(exc)[:200]}") from None


def _tensors(
    entries: _Entries, folder: str, config: Any, label: str, out: dict[str, torch.Tensor]
) -> set[str]:
    where = f"{label}: data/{folder}/model_{folder}_config.json"
    table = config.get("config") if isinstance(config, dict) else None
    if not isinstance(table, dict):
        raise ProgramError(f"{where} has no config table")
    storages: dict[str, bytes] = {}
    made: dict[tuple, torch.Tensor] = {}
    for name, entry in table.items():
        if not isinstance(name, str) or not STATE_NAME.fullmatch(name):
            raise ProgramError(f"{where}: {str(name)[:80]!r} is not a dotted name of identifiers")
        if name in out:
            raise ProgramError(f"{where}: tensor {name!r} is defined twice")
        if not isinstance(entry, dict):
            raise ProgramError(f"{where}: {name}: expected a table")
        if entry.get("use_pickle") is not False:
            raise ProgramError(f"{where}: {name} is stored as a pickle (use_pickle); refused")
        file = entry.get("path_name")
        pattern = _TENSOR_FILE[folder]
        if not isinstance(file, str) or not pattern.fullmatch(file):
            raise ProgramError(
                f"{where}: {name}: path {str(file)[:80]!r} is not a raw tensor entry "
                "(custom and opaque objects are refused)"
            )
        entry_name = f"data/{folder}/{file}"
        if entry_name not in entries:
            raise ProgramError(f"{where}: {name}: entry {entry_name} is missing")
        if file not in storages:
            storages[file] = _bytes(entries, entry_name, label, MAX_ARCHIVE_BYTES)
        key, tensor = _view(storages[file], entry.get("tensor_meta"), f"{where}: {name}")
        out[name] = made.setdefault((file, *key), tensor)
    return set(table)


def _view(storage: bytes, meta: Any, where: str) -> tuple[tuple, torch.Tensor]:
    """The tensor that `meta` describes inside `storage`, copied out after its extent
    (offset and every stride) was checked against the bytes there are."""
    if not isinstance(meta, dict):
        raise ProgramError(f"{where}: no tensor_meta")
    dtype_name = DTYPES.get(meta.get("dtype"))  # type: ignore[arg-type]
    if dtype_name is None:
        raise ProgramError(f"{where}: dtype code {meta.get('dtype')!r} is not accepted")
    if meta.get("layout") != STRIDED:
        raise ProgramError(f"{where}: only strided tensors are accepted")
    sizes = _ints(meta.get("sizes"), where, "sizes")
    strides = _ints(meta.get("strides"), where, "strides")
    offset = _ints([meta.get("storage_offset")], where, "storage_offset")[0]
    if len(sizes) != len(strides):
        raise ProgramError(f"{where}: {len(sizes)} sizes but {len(strides)} strides")
    dtype = getattr(torch, dtype_name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    elements = len(storage) // itemsize
    last = offset + sum((s - 1) * st for s, st in zip(sizes, strides, strict=True))
    if math.prod(sizes) and (last >= elements or len(storage) % itemsize):
        raise ProgramError(
            f"{where}: the view reaches element {last}, past the {elements} its bytes hold"
        )
    if not math.prod(sizes):
        return (dtype_name, tuple(sizes), tuple(strides), offset), torch.zeros(sizes, dtype=dtype)
    flat = torch.frombuffer(bytearray(storage), dtype=dtype)
    tensor = flat.as_strided(sizes, strides, offset).clone()
    return (dtype_name, tuple(sizes), tuple(strides), offset), tensor


def _ints(raw: Any, where: str, field: str) -> list[int]:
    if not isinstance(raw, list) or len(raw) > 16:
        raise ProgramError(f"{where}: {field} must be a list of at most 16 ints")
    values = []
    for item in raw:
        value = item.get("as_int") if isinstance(item, dict) and len(item) == 1 else None
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**48:
            raise ProgramError(f"{where}: {field} holds {str(item)[:60]!r}, not a plain size")
        values.append(value)
    return values
