"""Building a job spec from Python arguments: keyword paths and merging.

A spec is the plain dict `docs/jobspec.md` describes, written out as TOML for the node,
which checks every key; nothing here duplicates those rules. What this module adds is
how keys are given from Python: `optim__lr=3e-4` is `{"optim": {"lr": 3e-4}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PATH_SEPARATOR = "__"


def from_keywords(keys: Mapping[str, Any]) -> dict[str, Any]:
    """`{"optim__lr": 3e-4, "placement": "local"}` -> `{"optim": {"lr": 3e-4},
    "placement": "local"}`; a path with an empty part is a ValueError naming it."""
    spec: dict[str, Any] = {}
    for keyword, value in keys.items():
        parts = keyword.split(PATH_SEPARATOR)
        if not all(parts):
            raise ValueError(
                f"{keyword!r} is not a spec key path: write table and key joined by "
                f"'{PATH_SEPARATOR}', e.g. optim__lr=3e-4 for [optim] lr"
            )
        nested: Any = value
        for part in reversed(parts[1:]):
            nested = {part: nested}
        spec = merged(spec, {parts[0]: nested})
    return spec


def merged(base: Mapping[str, Any], over: Mapping[str, Any], path: str = "") -> dict[str, Any]:
    """`base` with `over` laid on top: tables merge key by key, any other value replaces.
    A table meeting a non-table is a ValueError: one of the two would be lost silently."""
    out = dict(base)
    for key, value in over.items():
        key_path = f"{path}.{key}" if path else key
        if key in out and isinstance(out[key], Mapping) != isinstance(value, Mapping):
            raise ValueError(f"{key_path} is given both as a table and as a single value")
        if isinstance(value, Mapping):
            out[key] = merged(out.get(key, {}), value, key_path)
        else:
            out[key] = value
    return out
