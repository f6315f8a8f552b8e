"""The templates' filters: plain text from values of any type (a page must render
whatever a job's JSON holds), and a job spec as TOML the way its owner wrote it."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime


def short_id(peer_id: object) -> str:
    text = str(peer_id or "")
    return text if len(text) <= 16 else f"{text[:4]}…{text[-8:]}"


def ago(ts: object, now: float | None = None) -> str:
    if not isinstance(ts, int | float) or not ts:
        return "never"
    delta = (time.time() if now is None else now) - float(ts)
    if delta < 2:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if delta >= size:
            return f"{int(delta // size)} {unit} ago"
    return f"{int(delta)} s ago"


def when(ts: object) -> str:
    if not isinstance(ts, int | float) or not ts:
        return ""
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: object, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def pretty_json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = (f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{ " + ", ".join(items) + " }"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _toml_key(key: object) -> str:
    text = str(key)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else json.dumps(text)


def to_toml(spec: object, prefix: str = "") -> str:
    """A plain job spec as TOML, the way its owner wrote it (tables after scalars)."""
    if not isinstance(spec, dict):
        return pretty_json(spec)
    lines, tables = [], []
    for key, value in spec.items():
        if value is None:
            continue
        if isinstance(value, dict) and value:
            tables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables:
        name = f"{prefix}{_toml_key(key)}"
        lines.append(f"\n[{name}]")
        lines.append(to_toml(value, f"{name}.").strip("\n"))
    return "\n".join(line for line in lines if line != "").strip("\n") + "\n"
