"""Typed, path-naming reads from a parsed TOML table.

A job spec arrives as plain data from a file or a peer, so every read checks the type
and the range and, when either is wrong, names the full key path and the rule. A
section also remembers which keys were read, so `finish()` can refuse a key nobody
asked for: a misspelled `lerning_rate` must be an error, not a silent default.
"""

from __future__ import annotations

import math
from typing import Any

from training.errors import SpecError

_MISSING: Any = object()


def kind(value: Any) -> str:
    """A short name for the type of a plain value, for error messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    if value is None:
        return "null"
    return type(value).__name__


def shown(value: Any) -> str:
    """The value itself, shortened, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def int_rule(lo: int | None, hi: int | None) -> str:
    parts = []
    if lo is not None:
        parts.append("> 0" if lo == 1 else f">= {lo}")
    if hi is not None:
        parts.append(f"<= {hi}")
    return " and ".join(parts)


def check_int(value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
    """`value` as an int within [lo, hi], or a SpecError naming `path`."""
    rule = int_rule(lo, hi)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path} must be an integer {rule}, got {kind(value)}".rstrip())
    if lo is not None and value < lo:
        raise SpecError(f"{path} must be {int_rule(lo, None)}, got {value}")
    if hi is not None and value > hi:
        raise SpecError(f"{path} must be {int_rule(None, hi)}, got {value}")
    return value


def check_number(
    value: Any,
    path: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """`value` as a finite float within the bounds; ints are accepted as numbers."""
    low = f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else ""
    high = f"{'<' if hi_open else '<='} {hi:g}" if hi is not None else ""
    rule = " and ".join(part for part in (low, high) if part)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{path} must be a number {rule}, got {kind(value)}".rstrip())
    if isinstance(value, int) and abs(value) > 2**63:
        raise SpecError(f"{path} must be {rule or 'a reasonable number'}, got {value}")
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(f"{path} must be a finite number, got {number}")
    if lo is not None and (number <= lo if lo_open else number < lo):
        raise SpecError(f"{path} must be {low}, got {number:g}")
    if hi is not None and (number >= hi if hi_open else number > hi):
        raise SpecError(f"{path} must be {high}, got {number:g}")
    return number


class Section:
    """One TOML table being read, with its key path (`""` for the top level)."""

    def __init__(self, raw: Any, path: str) -> None:
        if not isinstance(raw, dict):
            raise SpecError(f"{path or 'the spec'} must be a table, got {kind(raw)}")
        for key in raw:
            if not isinstance(key, str):
                raise SpecError(f"{path or 'the spec'} has a key that is not text: {shown(key)}")
        self.raw: dict[str, Any] = raw
        self.path = path
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        """The full path of `name` in this section."""
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.raw

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The raw value; a missing key without a default is an error."""
        self._read.add(name)
        if name in self.raw:
            return self.raw[name]
        if default is _MISSING:
            raise SpecError(f"{self.key(name)} is required")
        return default

    def string(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        choices: tuple[str, ...] | None = None,
        max_len: int = 4096,
    ) -> Any:
        value = self.get(name, default)
        if value is default and not self.has(name):
            return value
        path = self.key(name)
        if not isinstance(value, str):
            raise SpecError(f"{path} must be a string, got {kind(value)}")
        if choices is not None and value not in choices:
            raise SpecError(f"{path} must be one of {', '.join(choices)}; got {shown(value)}")
        if not 1 <= len(value) <= max_len:
            raise SpecError(f"{path} must be 1..{max_len} characters, got {len(value)}")
        return value

    def integer(
        self, name: str, default: Any = _MISSING, *, lo: int | None = None, hi: int | None = None
    ) -> Any:
        value = self.get(name, default)
        if value is default and not self.has(name):
            return value
        return check_int(value, self.key(name), lo, hi)

    def number(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> Any:
        value = self.get(name, default)
        if value is default and not self.has(name):
            return value
        return check_number(value, self.key(name), lo, hi, lo_open=lo_open, hi_open=hi_open)

    def boolean(self, name: str, default: Any = _MISSING) -> Any:
        value = self.get(name, default)
        if value is default and not self.has(name):
            return value
        if not isinstance(value, bool):
            raise SpecError(f"{self.key(name)} must be true or false, got {kind(value)}")
        return value

    def int_list(
        self,
        name: str,
        default: Any = _MISSING,
        *,
        lo: int,
        hi: int,
        min_len: int = 1,
        max_len: int = 64,
    ) -> Any:
        value = self.get(name, default)
        if value is default and not self.has(name):
            return value
        path = self.key(name)
        if not isinstance(value, list | tuple):
            raise SpecError(f"{path} must be a list of integers, got {kind(value)}")
        if not min_len <= len(value) <= max_len:
            raise SpecError(f"{path} must have {min_len}..{max_len} entries, got {len(value)}")
        return tuple(check_int(v, f"{path}[{i}]", lo, hi) for i, v in enumerate(value))

    def string_list(self, name: str, *, min_len: int = 1, max_len: int = 64) -> Any:
        """A list of non-empty strings (each at most 4096 characters)."""
        value = self.get(name)
        path = self.key(name)
        if not isinstance(value, list | tuple):
            raise SpecError(f"{path} must be a list of strings, got {kind(value)}")
        if not min_len <= len(value) <= max_len:
            raise SpecError(f"{path} must have {min_len}..{max_len} entries, got {len(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not 1 <= len(item) <= 4096:
                raise SpecError(f"{path}[{i}] must be a string of 1..4096 characters")
        return tuple(value)

    def table(self, name: str) -> Section:
        """A sub-table; a missing one reads as empty (every key then takes its default)."""
        return Section(self.get(name, {}), self.key(name))

    def finish(self) -> None:
        """Refuse any key that no getter asked for."""
        unknown = sorted(set(self.raw) - self._read)
        if unknown:
            known = ", ".join(sorted(self._read)) or "none"
            raise SpecError(f"{self.key(unknown[0])} is not a known key (known here: {known})")
