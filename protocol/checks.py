"""The one way a message's `check()` refuses a field: a `DecodeError` that names it.

Every dataclass message on the wire has a `check(path)` that `protocol.schema` calls
after decoding; they all say what is wrong the same way, through `require`."""

from __future__ import annotations

from protocol.errors import DecodeError


def require(ok: bool, path: str, rule: str) -> None:
    """Refuse with "<path> <rule>" unless `ok`."""
    if not ok:
        raise DecodeError(f"{path} {rule}")
