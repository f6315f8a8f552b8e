"""The `[data]` table: one source (a built-in set, a local file, a blob) or, for an
elastic job, token files in shards (`shards.py`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.sources import (
    BLOB_FORMATS,
    LM_KINDS,
    TOKEN_FORMATS,
    Source,
    parse_source,
    resolve_path,
)
from training.errors import SpecError
from training.spec.fields import Section
from training.spec.shards import MAX_SHARDS, parse_shards

TASKS = ("classification", "regression", "lm")


@dataclass(frozen=True)
class DataSpec:
    source: str = ""  # empty exactly when `shards` is set
    format: str | None = None
    label: str | None = None
    batch_size: int = 32
    validation: float = 0.1
    task: str | None = None
    vocab_size: int | None = None  # token data: ids are < this (default: max id + 1)
    shards: tuple[str, ...] = ()  # token files, each a blob (training.spec.shards)

    @property
    def parsed(self) -> Source:
        if self.shards:
            raise SpecError("data.shards: a sharded data set has no single source")
        return parse_source(self.source, self.format)

    @property
    def kind(self) -> str:
        """The data set or file format (a sharded set's: its `format`)."""
        return str(self.format) if self.shards else self.parsed.kind


def parse_data(section: Section, base_dir: Path | None, allowed_root: Path | None) -> DataSpec:
    if section.has("shards"):
        return _parse_sharded(section, base_dir, allowed_root)
    source = section.string("source")
    fmt = section.string("format", None, choices=BLOB_FORMATS)
    parsed = parse_source(source, fmt)
    if parsed.origin == "file":
        source = resolve_path(source, base_dir, allowed_root, "data.source")
    elif parsed.origin == "text":
        source = "builtin:text:" + resolve_path(
            parsed.path or "", base_dir, allowed_root, "data.source"
        )
    elif parsed.origin == "blob":
        source = f"blob:{parsed.sha256}"
    label = section.string("label", None, max_len=256)
    if parsed.kind == "csv" and label is None:
        raise SpecError("data.label is required for a csv source: name the label column")
    task = section.string("task", None, choices=TASKS)
    if task is not None and (task == "lm") != (parsed.kind in LM_KINDS):
        raise SpecError(
            f"data.task {task!r} does not fit this source: task lm is for text and token data"
        )
    vocab_size = section.integer("vocab_size", None, lo=1, hi=2**32)
    if vocab_size is not None and parsed.kind not in TOKEN_FORMATS:
        raise SpecError(
            "data.vocab_size is for token data (data.format tokens16 or tokens32); "
            f"this source is {parsed.kind}"
        )
    data = DataSpec(
        source=source,
        format=fmt,
        label=label,
        batch_size=section.integer("batch_size", 32, lo=1, hi=65536),
        validation=section.number("validation", 0.1, lo=0, hi=0.9),
        task=task,
        vocab_size=vocab_size,
    )
    section.finish()
    return data


def _parse_sharded(section: Section, base_dir: Path | None, allowed_root: Path | None) -> DataSpec:
    if section.has("source"):
        raise SpecError("data: give data.source or data.shards, not both")
    fmt = section.string("format", None, choices=TOKEN_FORMATS)
    shards = parse_shards(section.string_list("shards", max_len=MAX_SHARDS), fmt, base_dir,
                          allowed_root)  # fmt: skip
    vocab_size = section.integer("vocab_size", None, lo=1, hi=2**32)
    if vocab_size is None:
        raise SpecError(
            "data.vocab_size is required with data.shards: each worker reads only some "
            "shards, so the vocabulary cannot come from the data"
        )
    data = DataSpec(
        format=fmt,
        batch_size=section.integer("batch_size", 32, lo=1, hi=65536),
        validation=section.number("validation", 0.1, lo=0, hi=0.9),
        task=section.string("task", None, choices=("lm",)),
        vocab_size=vocab_size,
        shards=shards,
    )
    section.finish()
    return data


def data_plain(data: DataSpec) -> dict[str, Any]:
    plain = {k: v for k, v in dataclasses.asdict(data).items() if v is not None}
    if data.shards:
        del plain["source"]
        plain["shards"] = list(data.shards)
    else:
        del plain["shards"]  # left out: specs from before shards stay equal
    return plain
