"""The one way a message's `check()` refuses a field: a `DecodeError` that names it.

Every dataclass message on the wire has a `check(path)` that `protocol.schema` calls
after decoding; they all say what is wrong the same way, through `require`."""

from __future__ import annotations

from protocol.errors import DecodeError

_HEX = frozenset("0123456789abcdef")


def require_sha256(value: str, path: str, allow_empty: bool = False) -> None:
    """Refuse anything but a lowercase sha256 hex digest (or "" when allowed)."""
    if allow_empty and value == "":
        return
    require(len(value) == 64 and set(value) <= _HEX, path, "must be a lowercase sha256 hex digest")


def require(ok: bool, path: str, rule: str) -> None:
    """Refuse with "<path> <rule>" unless `ok`."""
    if not ok:
        raise DecodeError(f"{path} {rule}")
