"""The one format of identifiers a peer mints: job, unit, trial and round ids.

16 to 32 lowercase hex characters, checked at decode time for every message that
carries one. Such ids become folder names and database keys on the receiving node,
so nothing else may pass: no separators, no dots, no NUL, no case games.
"""

from __future__ import annotations

import re

from protocol.errors import DecodeError
from protocol.peer_id import public_key_from_peer_id

ID_MIN_LEN = 16
ID_MAX_LEN = 32
_ID = re.compile(r"[0-9a-f]{16,32}")


def is_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_id(value: object, path: str) -> None:
    """`DecodeError` naming `path` unless `value` is a well-formed id."""
    if not is_id(value):
        shown = repr(value)[:80]
        raise DecodeError(
            f"{path} must be {ID_MIN_LEN}..{ID_MAX_LEN} lowercase hex characters, got {shown}"
        )


def check_peer(value: object, path: str) -> None:
    """`DecodeError` naming `path` unless `value` is a canonical Ed25519 peer id."""
    try:
        public_key_from_peer_id(value)  # type: ignore[arg-type]
    except DecodeError as exc:
        raise DecodeError(f"{path} is not a peer id ({exc})") from None
