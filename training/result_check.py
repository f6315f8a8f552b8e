"""Checking a worker's weights file before the owner accepts it.

The daemon reads only the safetensors header (bounded, never a tensor byte): the
file must be exactly what a run of the job's model plan writes. Values are checked
for finiteness outside the daemon, in a subprocess (`check_weights_values`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 1 << 20
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}

Expected = dict[str, tuple[tuple[int, ...], str]]


class WeightsRejected(ValueError):
    """The weights are not what the job's model produces; the message says how."""


def expected_tensors(spec_plain: dict[str, Any]) -> Expected:
    """Tensor name -> (shape, dtype) of the weights a run of `spec_plain` writes.
    Empty: not known here, and only the file's own consistency is checked."""
    return {}


def max_weights_bytes(expected: Expected) -> int:
    if not expected:
        return 4 << 30
    data = sum(_numel(shape) * DTYPE_BYTES[dtype] for shape, dtype in expected.values())
    return 8 + MAX_HEADER_BYTES + data


def check_weights_header(path: Path, expected: Expected) -> None:
    """Read the header only; raise WeightsRejected unless it is a consistent
    safetensors file matching `expected` (when given) whose data exactly fills it."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise WeightsRejected("not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or length + 8 > size:
            raise WeightsRejected(f"not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise WeightsRejected(f"not a safetensors file (header: {exc})") from None
    if not isinstance(header, dict):
        raise WeightsRejected("not a safetensors file (header is not a map)")
    header.pop("__metadata__", None)
    end = 0
    for name, info in sorted(header.items(), key=lambda kv: _offsets(kv)[0]):
        dtype, shape = info.get("dtype"), tuple(info.get("shape", ()))
        start, stop = _offsets((name, info))
        if (
            dtype not in DTYPE_BYTES
            or start != end
            or stop - start != _numel(shape) * DTYPE_BYTES[dtype]
        ):
            raise WeightsRejected(f"tensor {name!r}: inconsistent dtype, shape or offsets")
        end = stop
    if 8 + length + end != size:
        raise WeightsRejected("the tensors do not exactly fill the file")


async def check_weights_values(path: Path) -> None:
    """Every value finite (checked outside the daemon)."""


def _offsets(item: tuple[str, Any]) -> tuple[int, int]:
    name, info = item
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise WeightsRejected(f"tensor {name!r}: bad data_offsets")
    return offsets[0], offsets[1]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise WeightsRejected(f"bad shape {shape!r}")
        n *= d
    return n
