"""What declaring a node setting takes, and the value checks every entry point shares.

A setting is one field of `node.settings.declarations.Settings`, declared with
`setting(...)`: its default, help text, unit, TOML table, CLI flag, whether
`PUT /api/v1/policy` may change it and its value rule (`Bounds`, or a list of
choices). `Setting` is that declaration
read back, with the field's name and type; the config file, the CLI options, the API
and docs/settings.md all come from these records.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

#: the value types a setting may have, as written in its annotation
TYPES = ("str", "bool", "int", "float", "list[str]", "list[int]")
#: a unit's name on the command line (`--lease SECONDS`)
_METAVARS = {"s": "SECONDS", "min": "MINUTES", "h": "HOURS", "MiB": "MIB", "%": "PERCENT"}
_TYPE_NAMES = {"list[str]": "a list of strings", "list[int]": "a list of integers"}
MAX_TEXT = 1000  # the longest text value the API takes


class ConfigError(Exception):
    """The configuration is invalid; the message names the key and what to do."""


def _number(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


@dataclass(frozen=True)
class Bounds:
    """A number's allowed range (of each entry, for a list): `low`..`high`, either
    end open-ended when None; `low_open` excludes `low` itself. Only finite numbers
    pass."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or value <= self.high

    def text(self) -> str:
        """ "0..100", "> 0", ">= 0" or "in (0, 1]"."""
        low = None if self.low is None else _number(self.low)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low_open:
            return f"in ({low}, {_number(self.high)}]"
        return f"{low}..{_number(self.high)}" if low is not None else f"<= {_number(self.high)}"


@dataclass(frozen=True)
class Setting:
    """One setting as declared: see the module docstring."""

    name: str
    type: str  # one of TYPES
    default: Any
    help: str
    unit: str = ""  # "s", "min", "h", "MiB", "%" or ""
    section: str = ""  # the TOML table it goes in: "" (top level) or "policy"
    api: bool = False  # PUT /api/v1/policy may change it while the node runs
    flag: str = ""  # its `node run` option ("--lease", "--mdns/--no-mdns"); "" = file only
    bounds: Bounds | None = None
    choices: tuple[str, ...] = ()
    value_name: str = ""  # what the option's value is called in `--help` ("PEER_ID")

    @property
    def key(self) -> str:
        """Its key in the config file: `listen`, `policy.load_limit_pct`."""
        return f"{self.section}.{self.name}" if self.section else self.name

    @property
    def flags(self) -> tuple[str, ...]:
        """The option's names: ("--mdns", "--no-mdns") for a switch."""
        return tuple(self.flag.split("/")) if self.flag else ()

    @property
    def metavar(self) -> str | None:
        """The option's value in `--help`: its name, else its unit's; None: typer's."""
        return self.value_name or _METAVARS.get(self.unit)

    @property
    def description(self) -> str:
        """Its help text with its rule: the same words in `--help`, the docs and errors."""
        rule = self.rule()
        return f"{self.help} ({rule})" if rule else self.help

    def rule(self) -> str:
        """What a value must be, for errors and the docs ("" when anything of its type
        goes)."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        if self.bounds is None:
            return ""
        return ("entries " if self.type.startswith("list") else "") + self.bounds.text()

    def broken_rule(self, value: Any) -> str | None:
        """`must be ...` when `value` (already of the setting's type) breaks its rule
        (`entries must be ...` for a list)."""
        if self.choices and value not in self.choices:
            return f"must be {self.rule()}"
        if self.bounds is not None:
            values = value if isinstance(value, list) else [value]
            if not all(self.bounds.holds(v) for v in values):
                if isinstance(value, list):
                    return f"entries must be {self.bounds.text()}"
                return f"must be {self.rule()}"
        return None


def setting(
    default: Any,
    help: str,
    *,
    unit: str = "",
    section: str = "",
    api: bool = False,
    flag: str = "",
    bounds: Bounds | None = None,
    choices: tuple[str, ...] = (),
    value_name: str = "",
) -> Any:
    """A `Settings` field with its declaration (list defaults are copied per instance)."""
    meta = {
        "setting": {
            "help": help,
            "unit": unit,
            "section": section,
            "api": api,
            "flag": flag,
            "bounds": bounds,
            "choices": choices,
            "value_name": value_name,
        }
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def declared(cls: type) -> tuple[Setting, ...]:
    """The `Setting` of every field of `cls` declared with `setting(...)`, in order."""
    return tuple(_record(f) for f in fields(cls) if "setting" in f.metadata)


def _record(f: Field[Any]) -> Setting:
    tp = str(f.type)
    if tp not in TYPES:
        raise TypeError(f"setting {f.name}: type {tp} is not one of {', '.join(TYPES)}")
    default = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
    return Setting(name=f.name, type=tp, default=default, **f.metadata["setting"])


def from_toml(name: str, tp: str, value: Any) -> Any:
    """A value from the config file (or `preferences.json`) checked against the
    setting's type; an integer is taken for a float, nothing else is converted."""
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": _is_int(value),
        "float": _is_number(value),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "list[int]": isinstance(value, list) and all(_is_int(v) for v in value),
    }[tp]
    if not ok:
        raise ConfigError(
            f"setting '{name}' must be {_TYPE_NAMES.get(tp, tp)}, "
            f"got {type(value).__name__} {value!r}"
        )
    return float(value) if tp == "float" else value


def from_json(s: Setting, value: Any) -> Any:
    """A value sent to the API (JSON, or text from the page's form fields) converted to
    the setting's type; raises ValueError naming the key."""
    if s.type.startswith("list"):
        kind = int if s.type == "list[int]" else str
        if isinstance(value, str):  # the page's text field: "0, 1" or one id a line
            value = [v for v in re.split(r"[\s,]+", value) if v]
            if kind is int and not all(v.isdigit() for v in value):
                raise ValueError(f"{s.name} must be device indexes like 0, 1")
            value = [kind(v) for v in value]
        if not isinstance(value, list) or not all(
            isinstance(v, kind) and not isinstance(v, bool) for v in value
        ):
            raise ValueError(f"{s.name} must be a list of {kind.__name__}s")
        return list(value)
    if s.type == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{s.name} must be true or false")
        return value
    if s.type == "str":
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise ValueError(f"{s.name} must be text")
        return value
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"{s.name} must be a number")
    if s.type == "int":
        if value != int(value):
            raise ValueError(f"{s.name} must be a whole number")
        return int(value)
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
