"""Readers for the data file formats, numpy only, none of which can run code.

- `.npz`: a zip of `.npy` arrays named `x` and `y`, read with `allow_pickle=False`
  (object arrays are refused); other arrays in the file are ignored.
- `.safetensors`: tensors named `x` and `y`.
- `.csv`: a header row, one numeric column per feature and the label column named by
  `data.label`.
- text: UTF-8.
- tokens16 / tokens32: nanoGPT's `.bin`, nothing but little-endian uint16 / uint32
  token ids, mapped with `np.memmap` (never unpickled).

Each reader can also give just the shape of `x` and the labels `y` (`probe_*`), which
is what submit-time validation needs without loading the features.
"""

from __future__ import annotations

import csv
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.errors import SpecError

_INT = re.compile(r"\s*[+-]?\d+\s*")
MAX_TEXT_BYTES = 1 << 30
#: labels are read in full wherever a spec is checked, the node daemon included, so
#: their size is bounded before a byte of them is inflated (a zip "bomb" stays a header)
MAX_LABEL_BYTES = 128 << 20
MAX_NPZ_MEMBERS = 64
TOKEN_DTYPES = {"tokens16": np.dtype("<u2"), "tokens32": np.dtype("<u4")}
#: ids scanned per step when probing, so a large file never needs a large buffer
TOKEN_CHUNK = 1 << 22


@dataclass(frozen=True)
class Arrays:
    """Labels in full, and the features or (when probing) only their shape and dtype."""

    x_shape: tuple[int, ...]
    x_dtype: np.dtype
    y: np.ndarray
    x: np.ndarray | None = None


def _open_error(path: Path, exc: Exception) -> SpecError:
    if isinstance(exc, FileNotFoundError):
        return SpecError(f"data.source: file not found: {path}")
    return SpecError(f"data.source: cannot read {path}: {exc}")


def read_npz(path: Path, load_x: bool) -> Arrays:
    try:
        with zipfile.ZipFile(path) as archive:
            if len(archive.infolist()) > MAX_NPZ_MEMBERS:
                raise SpecError(
                    f"data.source: {path.name} holds over {MAX_NPZ_MEMBERS} arrays; an npz "
                    "data file holds `x` and `y`"
                )
            names = set(archive.namelist())
            for key in ("x", "y"):
                if f"{key}.npy" not in names:
                    found = ", ".join(sorted(n.removesuffix(".npy") for n in names)) or "none"
                    raise SpecError(
                        f"data.source: {path.name} has no array {key!r} (found: {found}); "
                        "an npz data file holds features `x` and labels `y`"
                    )
            shapes = {}
            for key in ("x", "y"):  # headers first: refuse sizes the file cannot hold
                member = archive.getinfo(f"{key}.npy")
                with archive.open(member) as handle:
                    shape, dtype = _npy_header(handle, path)
                _check_dtype(dtype, key, path)
                if math.prod(shape) * dtype.itemsize > member.file_size:
                    raise SpecError(
                        f"data.source: array {key!r} in {path.name} declares shape {shape} "
                        f"but holds only {member.file_size} bytes"
                    )
                shapes[key] = (shape, dtype)
            _check_label_bytes(math.prod(shapes["y"][0]) * shapes["y"][1].itemsize, path)
            if archive.getinfo("y.npy").file_size > MAX_LABEL_BYTES + 4096:
                _check_label_bytes(archive.getinfo("y.npy").file_size, path)
            with archive.open("y.npy") as handle:
                y = _read_npy(handle, "y", path)
            if not load_x:
                return Arrays(*shapes["x"], y)
            with archive.open("x.npy") as handle:
                x = _read_npy(handle, "x", path)
            return Arrays(x.shape, x.dtype, y, x)
    except SpecError:
        raise
    except zipfile.BadZipFile as exc:
        raise SpecError(f"data.source: {path.name} is not an npz (zip) file: {exc}") from exc
    except (OSError, ValueError, EOFError, KeyError) as exc:
        raise _open_error(path, exc) from exc


def _npy_header(handle, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        raise SpecError(f"data.source: {path.name}: x.npy has format version {version}; use 1.0")
    return tuple(shape), dtype


def _read_npy(handle, key: str, path: Path) -> np.ndarray:
    try:
        array = np.lib.format.read_array(handle, allow_pickle=False)
    except ValueError as exc:
        raise SpecError(
            f"data.source: array {key!r} in {path.name} cannot be read without pickle "
            f"({exc}); store plain numeric arrays"
        ) from exc
    _check_dtype(array.dtype, key, path)
    return array


def _check_label_bytes(size: int, path: Path) -> None:
    if size > MAX_LABEL_BYTES:
        raise SpecError(
            f"data.source: the labels y in {path.name} are {size} bytes; at most "
            f"{MAX_LABEL_BYTES >> 20} MiB of labels are accepted"
        )


def _check_dtype(dtype: np.dtype, key: str, path: Path) -> None:
    if dtype.kind not in "biuf":
        raise SpecError(
            f"data.source: array {key!r} in {path.name} has dtype {dtype}; "
            "use numbers (bool, int or float)"
        )


def read_safetensors(path: Path, load_x: bool) -> Arrays:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            keys = set(handle.keys())
            for key in ("x", "y"):
                if key not in keys:
                    found = ", ".join(sorted(keys)) or "none"
                    raise SpecError(
                        f"data.source: {path.name} has no tensor {key!r} (found: {found}); "
                        "a safetensors data file holds features `x` and labels `y`"
                    )
            labels = handle.get_slice("y")
            _check_label_bytes(
                math.prod(labels.get_shape()) * _st_dtype(labels.get_dtype(), path).itemsize, path
            )
            y = handle.get_tensor("y")
            _check_dtype(y.dtype, "y", path)
            if load_x:
                x = handle.get_tensor("x")
                _check_dtype(x.dtype, "x", path)
                return Arrays(x.shape, x.dtype, y, x)
            meta = handle.get_slice("x")
            return Arrays(tuple(meta.get_shape()), _st_dtype(meta.get_dtype(), path), y)
    except SpecError:
        raise
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise _open_error(path, exc) from exc
        raise SpecError(
            f"data.source: {path.name} is not a readable safetensors file: {exc}"
        ) from exc


def _st_dtype(name: str, path: Path) -> np.dtype:
    table = {"F64": "f8", "F32": "f4", "F16": "f2", "I64": "i8", "I32": "i4", "I16": "i2"}
    table.update({"I8": "i1", "U8": "u1", "BOOL": "?", "U16": "u2", "U32": "u4", "U64": "u8"})
    if name not in table:
        raise SpecError(f"data.source: tensor 'x' in {path.name} has dtype {name}; use F32")
    return np.dtype(table[name])


def read_csv(path: Path, label: str, load_x: bool) -> Arrays:
    """A CSV with a header row; `label` names the label column, the rest are features.

    Labels written as integers everywhere are kept as int64 (classification); any
    other numeric labels are float64 (regression).
    """
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = csv.reader(handle)
            header = next(rows, None)
            if header is None:
                raise SpecError(f"data.source: {path.name} is empty; it needs a header row")
            header = [name.strip() for name in header]
            if label not in header:
                raise SpecError(
                    f"data.label: no column {label!r} in {path.name} "
                    f"(columns: {', '.join(header[:20])})"
                )
            at = header.index(label)
            labels: list[str] = []
            features: list[list[float]] = []
            for line, row in enumerate(rows, start=2):
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise SpecError(
                        f"data.source: {path.name} line {line} has {len(row)} fields; "
                        f"the header has {len(header)}"
                    )
                labels.append(row[at])
                values = _floats(row[:at] + row[at + 1 :], path, line)  # checked either way
                if load_x:
                    features.append(values)
    except SpecError:
        raise
    except UnicodeDecodeError as exc:
        raise SpecError(f"data.source: {path.name} is not UTF-8 text: {exc}") from exc
    except (OSError, csv.Error) as exc:
        raise _open_error(path, exc) from exc
    if not labels:
        raise SpecError(f"data.source: {path.name} has a header but no rows")
    if all(_INT.fullmatch(value) for value in labels):
        y = np.array([int(value) for value in labels], dtype=np.int64)
    else:
        y = np.array(
            [_floats([value], path, i + 2)[0] for i, value in enumerate(labels)], dtype=np.float64
        )
    shape = (len(labels), len(header) - 1)
    if shape[1] == 0:
        raise SpecError(f"data.source: {path.name} has only the label column; no features")
    if load_x:
        x = np.array(features, dtype=np.float64).reshape(shape)
        return Arrays(shape, x.dtype, y, x)
    return Arrays(shape, np.dtype("f8"), y)


def _floats(cells: list[str], path: Path, line: int) -> list[float]:
    try:
        return [float(cell) for cell in cells]
    except ValueError:
        bad = next(cell for cell in cells if not _is_float(cell))
        raise SpecError(
            f"data.source: {path.name} line {line}: {bad!r} is not a number; "
            "csv features and labels must be numeric"
        ) from None


def _is_float(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def read_text(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            blob = handle.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise _open_error(path, exc) from exc
    if len(blob) > MAX_TEXT_BYTES:
        raise SpecError(f"data.source: {path.name} is over {MAX_TEXT_BYTES} bytes")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"data.source: {path.name} is not UTF-8 text: {exc}") from exc
    if not text:
        raise SpecError(f"data.source: {path.name} is empty")
    return text


def read_tokens(path: Path, fmt: str) -> np.ndarray:
    """A token file's ids, mapped read-only rather than read, so probing costs no copy."""
    dtype = TOKEN_DTYPES[fmt]
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise _open_error(path, exc) from exc
    if size % dtype.itemsize:
        raise SpecError(
            f"data.source: {path.name} is {size} bytes, not a multiple of {dtype.itemsize}; "
            f"{fmt} is {dtype.itemsize}-byte token ids and nothing else (is data.format right?)"
        )
    if size == 0:
        raise SpecError(f"data.source: {path.name} is empty")
    try:
        return np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as exc:
        raise _open_error(path, exc) from exc


def token_vocab(ids: np.ndarray, declared: int | None, name: str) -> int:
    """The vocabulary of token ids: `declared` (every id checked against it), else max id + 1."""
    top = 0
    for start in range(0, len(ids), TOKEN_CHUNK):
        chunk = ids[start : start + TOKEN_CHUNK]
        high = int(chunk.max())
        if declared is not None and high >= declared:
            at = start + int(np.argmax(chunk >= declared))
            raise SpecError(
                f"data.source: {name} holds token id {int(ids[at])} (at position {at}); "
                f"data.vocab_size is {declared}, so ids must be below it"
            )
        top = max(top, high)
    return declared if declared is not None else top + 1
