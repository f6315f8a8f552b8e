"""Where a job's data comes from: the `data.source` string and what it points at.

Four forms: a local file (`train.csv`, resolved against the spec's folder), a built-in
data set (`builtin:digits`, `builtin:synthetic-regression`), a local text file for the
character LM (`builtin:text:<path>`), and a content-addressed blob (`blob:<sha256>`),
which is what the owner node rewrites a file source to after upload. A worker only
ever sees built-in and blob sources.

Pickle-based formats (`.pt`, `.pkl`, ...) are refused by name before anything opens
them: loading a pickle can run arbitrary code. A `.bin` file is the one exception, and
only when `data.format` says it is raw little-endian token ids (`tokens16`, `tokens32`):
nanoGPT's layout, which is read as numbers and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from training.errors import SpecError

FILE_FORMATS = {".csv": "csv", ".npz": "npz", ".safetensors": "safetensors", ".txt": "text"}
TOKEN_FORMATS = ("tokens16", "tokens32")
LM_KINDS = ("text", *TOKEN_FORMATS)
BLOB_FORMATS = ("csv", "npz", "safetensors", "text", *TOKEN_FORMATS)
BUILTINS = ("builtin:digits", "builtin:synthetic-regression", "builtin:text:<path>")
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".bin", ".npy")
_BLOB = re.compile(r"blob:([0-9a-fA-F]{64})")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

Kind = Literal[
    "digits", "synthetic-regression", "csv", "npz", "safetensors", "text", "tokens16", "tokens32"
]


@dataclass(frozen=True)
class Source:
    """A parsed `data.source`.

    `origin` is "builtin", "file", "text" (builtin:text) or "blob"; `kind` is the data
    set or file format; `path` is set for file and text sources, `sha256` for blobs.
    """

    origin: Literal["builtin", "file", "text", "blob"]
    kind: Kind
    path: str | None = None
    sha256: str | None = None


def parse_source(source: str, fmt: str | None, path: str = "data.source") -> Source:
    """Classify a source string; `fmt` is `data.format` (blob sources and .bin token files)."""
    if fmt is not None and not source.startswith("blob:") and not _token_file(source, fmt):
        raise SpecError(
            "data.format is only for blob: sources and for .bin token files (tokens16 or "
            f"tokens32); a file's format comes from its suffix ({', '.join(FILE_FORMATS)})"
        )
    if source == "builtin:digits":
        return Source("builtin", "digits")
    if source == "builtin:synthetic-regression":
        return Source("builtin", "synthetic-regression")
    if source.startswith("builtin:text:"):
        text_path = source[len("builtin:text:") :]
        if not text_path:
            raise SpecError(f"{path}: builtin:text: needs a file path after the colon")
        return Source("text", "text", path=text_path)
    if source.startswith("builtin:"):
        raise SpecError(f"{path}: unknown built-in {source!r}; built-ins: {', '.join(BUILTINS)}")
    if source.startswith("blob:"):
        match = _BLOB.fullmatch(source)
        if match is None:
            raise SpecError(f"{path}: a blob source is blob:<64 hex digits of sha256>")
        if fmt is None:
            raise SpecError(f"data.format is required for a blob source: {', '.join(BLOB_FORMATS)}")
        if fmt not in BLOB_FORMATS:
            raise SpecError(f"data.format must be one of {', '.join(BLOB_FORMATS)}; got {fmt!r}")
        return Source("blob", fmt, sha256=match.group(1).lower())  # type: ignore[arg-type]
    if _URL.match(source):
        raise SpecError(f"{path}: URLs are not fetched; download the file and give its path")
    if fmt is not None:
        return Source("file", fmt, path=source)  # type: ignore[arg-type]
    return Source("file", file_format(source, path), path=source)


def _token_file(source: str, fmt: str) -> bool:
    return (
        fmt in TOKEN_FORMATS
        and not source.startswith("builtin:")
        and Path(source).suffix.lower() == ".bin"
    )


def file_format(name: str, path: str = "data.source") -> Kind:
    """The format of a data file from its suffix; pickles and unknown suffixes are refused."""
    suffix = Path(name).suffix.lower()
    if suffix == ".bin":
        raise SpecError(
            f"{path}: {name!r} is a .bin file; meshminer reads one only as raw little-endian "
            'token ids: set data.format = "tokens16" or "tokens32" (meshminer never loads '
            "pickle-based tensor dumps)"
        )
    if suffix in PICKLE_SUFFIXES:
        raise SpecError(
            f"{path}: {name!r} is a {suffix} file; meshminer never loads pickle-based or "
            "raw tensor dumps (loading a pickle can run code). Save the arrays x and y "
            "as .safetensors or .npz instead"
        )
    if suffix not in FILE_FORMATS:
        raise SpecError(
            f"{path}: cannot tell the format of {name!r}; data files must end in "
            f"{', '.join(FILE_FORMATS)}"
        )
    return FILE_FORMATS[suffix]  # type: ignore[return-value]


def resolve_path(name: str, base_dir: Path | None, allowed_root: Path | None, path: str) -> str:
    """`name` made absolute against `base_dir`; refused if it leaves `allowed_root`.

    Symlinks are resolved first, so a link inside the allowed folder that points out
    of it is refused too.
    """
    if "\x00" in name:
        raise SpecError(f"{path}: a file path cannot contain a NUL character")
    candidate = Path(name)
    if not candidate.is_absolute():
        if base_dir is None and allowed_root is None:
            return name
        candidate = (base_dir or Path.cwd()) / candidate
    resolved = candidate.resolve()
    if allowed_root is not None:
        root = allowed_root.resolve()
        if not resolved.is_relative_to(root):
            raise SpecError(f"{path}: {name!r} resolves to {resolved}, outside the allowed {root}")
    return str(resolved)
