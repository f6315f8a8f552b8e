"""A small TOML writer for plain job specs: the node takes specs as TOML text.

It writes str, int, float, bool, lists of those (nested lists too), tables, and lists
of tables as arrays of tables (`[[model.layers]]`); anything else, None included, is a
TypeError naming its key, since TOML has no null and a spec has no other types.
`tomllib.loads(dumps(table)) == table` for every table it accepts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_INT64 = range(-(2**63), 2**63)
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def dumps(table: Mapping[str, Any]) -> str:
    """`table` as a TOML document."""
    lines: list[str] = []
    _write_table(table, (), lines)
    return "\n".join(lines) + "\n" if lines else ""


def _write_table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    """Key/value lines first, then sub-tables and arrays of tables: in TOML every key after
    a header belongs to that header's table."""
    nested = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise TypeError(f"{_dotted(path)}: table keys must be strings, got {key!r}")
        if isinstance(value, Mapping) or _is_table_list(value):
            nested.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value, (*path, key))}")
    for key, value in nested:
        inner = (*path, key)
        header = ".".join(_key(k) for k in inner)
        if isinstance(value, Mapping):
            lines.append(f"[{header}]")
            _write_table(value, inner, lines)
        else:
            for item in value:
                lines.append(f"[[{header}]]")
                _write_table(item, inner, lines)


def _is_table_list(value: Any) -> bool:
    return _is_list(value) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _value(value: Any, path: tuple[str, ...]) -> str:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        if value not in _INT64:
            raise TypeError(f"{_dotted(path)}: {value} does not fit TOML's 64-bit integers")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if _is_list(value):
        if any(isinstance(v, Mapping) for v in value):
            raise TypeError(
                f"{_dotted(path)}: a list with tables in it must hold only tables, "
                "directly under a key"
            )
        return "[" + ", ".join(_value(v, (*path, f"[{i}]")) for i, v in enumerate(value)) + "]"
    raise TypeError(f"{_dotted(path)}: TOML cannot hold {type(value).__name__} ({value!r})")


def _string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path).replace(".[", "[") or "(top level)"
