"""The one msgpack codec, with hard limits checked before and while decoding.

Peers are untrusted, so the decoder refuses oversized input before parsing, lets
msgpack enforce string/container sizes while it parses, and bounds nesting depth
(msgpack itself does not). Encoding is deterministic for the types we use (maps keep
the insertion order our dataclasses give them), which is what signatures rely on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.errors import DecodeError, TooLarge


@dataclass(frozen=True)
class Limits:
    """Hard bounds for one decode. Defaults suit small control messages."""

    max_bytes: int = 64 * 1024
    max_depth: int = 8
    max_container_len: int = 1024
    max_str_len: int = 4096
    max_bin_len: int = 64 * 1024


DEFAULT_LIMITS = Limits()


def encode(value: Any) -> bytes:
    """Encode plain data (dicts, lists, str, bytes, int, float, bool, None)."""
    try:
        return msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise DecodeError(f"cannot encode value: {exc}") from exc


def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode msgpack bytes into plain data, enforcing `limits`.

    Raises `TooLarge` or `DecodeError` only.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > limits.max_bytes:
        raise TooLarge(f"message is {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_container_len,
            max_map_len=limits.max_container_len,
            max_ext_len=0,
            ext_hook=_reject_ext,  # max_ext_len=0 still lets zero-length ext values through
        )
    except (msgpack.StackError, RecursionError) as exc:
        # msgpack's own nesting bound (~1024) trips before our max_depth check can run
        raise TooLarge("message nests too deeply") from exc
    except ValueError as exc:
        # msgpack reports exceeded limits as ValueError("... exceeds max_..._len(...)");
        # ext types are disallowed (max_ext_len=0), which is a shape error, not a size one
        if "exceeds max" in str(exc) and "max_ext_len" not in str(exc):
            raise TooLarge(f"message exceeds a size limit: {exc}") from exc
        raise DecodeError(f"not valid msgpack: {exc}") from exc
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise DecodeError(f"not valid msgpack: {type(exc).__name__}: {exc}") from exc
    _check_depth(value, limits.max_depth)
    return value


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def _check_depth(value: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise TooLarge(f"message nests deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
