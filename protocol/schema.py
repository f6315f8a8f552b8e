"""Dataclass <-> plain data, with strict type checks that name the field path.

Messages are dataclasses; on the wire they are msgpack maps keyed by field name.
`from_plain` accepts exactly the fields a dataclass declares, each of the declared
type (``bool`` is not an ``int``; an ``int`` is accepted where a ``float`` is
declared), and then runs the class's own ``check()`` for value rules.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

from protocol.errors import DecodeError

T = TypeVar("T")


def to_plain(obj: Any) -> Any:
    """Turn a message dataclass (recursively) into msgpack-ready plain data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def from_plain(cls: type[T], data: Any, path: str = "") -> T:
    """Build `cls` from plain data, or raise `DecodeError` naming the bad field."""
    value = _convert(cls, data, path or cls.__name__)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(tp: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if data is None and type(None) in options:
            return None
        non_none = [o for o in options if o is not type(None)]
        if len(non_none) == 1:
            return _convert(non_none[0], data, path)
        raise DecodeError(f"{path}: unsupported union type {tp}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(data, list):
            raise DecodeError(f"{path} must be a list, got {_kind(data)}")
        return [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(data, dict):
            raise DecodeError(f"{path} must be a map, got {_kind(data)}")
        return {
            _convert(key_tp, k, f"{path} key"): _convert(val_tp, v, f"{path}[{k!r}]")
            for k, v in data.items()
        }
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, data, path)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise DecodeError(f"{path} must be a number, got {_kind(data)}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise DecodeError(f"{path} must be an integer, got {_kind(data)}")
        return data
    if tp in (str, bool, bytes):
        if type(data) is not tp:
            raise DecodeError(f"{path} must be {tp.__name__}, got {_kind(data)}")
        return data
    raise DecodeError(f"{path}: unsupported field type {tp}")


def _convert_dataclass(cls: Any, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise DecodeError(f"{path} must be a map, got {_kind(data)}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in fields)
    if unknown:
        raise DecodeError(f"{path}: unknown field(s) {', '.join(unknown)}")
    kwargs = {}
    for name, field in fields.items():
        if name not in data:
            has_default = (
                field.default is not dataclasses.MISSING
                or field.default_factory is not dataclasses.MISSING
            )
            if has_default:
                continue
            raise DecodeError(f"{path}.{name} is missing")
        kwargs[name] = _convert(hints[name], data[name], f"{path}.{name}")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(path)
    return obj


def _kind(value: Any) -> str:
    return "nil" if value is None else type(value).__name__
