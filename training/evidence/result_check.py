"""Checking a worker's weights file before the owner accepts it.

The daemon reads only the safetensors header (bounded, never a tensor byte): the
file must be exactly what a run of the job's model plan writes. Values are checked
for finiteness outside the daemon, in a subprocess (`check_weights_values`).
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from training.data.info import DataFiles
    from training.spec.job import JobSpec

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

_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_THREADS_ONE = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Expected = dict[str, tuple[tuple[int, ...], str]]


T = TypeVar("T")
MEMO_SIZE = 64  # jobs' plans an owner keeps; each is a few hundred bytes per tensor


def _memo_by_spec(fn: Callable[..., T]) -> Callable[..., T]:
    """Memoize `fn(spec_plain, data_file, locate)` by the spec and the data's paths.
    Both name content (blobs are stored under their sha256), so a job's answer never
    changes; without this an owner built the model on the meta device for every result
    it checked (0.1 s of CPU each for the demo's small transformer). `fn.remember(spec,
    data_file, value)` stores an answer a runner already computed: building on the
    meta device imports torch._dynamo (2.7 s of CPU, holding the daemon's GIL) through
    the meta kernels of torch's initialisers."""
    memo: OrderedDict[str, T] = OrderedDict()
    lock = threading.Lock()

    def remember(spec_plain: dict[str, Any], data_file: DataFiles, value: T) -> None:
        key = _memo_key(spec_plain, data_file)
        with lock:
            memo[key] = value
            memo.move_to_end(key)
            while len(memo) > MEMO_SIZE:
                memo.popitem(last=False)

    @functools.wraps(fn)
    def memoized(
        spec_plain: dict[str, Any],
        data_file: DataFiles = None,
        locate: Callable[[str], Path] | None = None,
    ) -> T:
        key = _memo_key(spec_plain, data_file)
        with lock:
            if key in memo:
                memo.move_to_end(key)
                return memo[key]
        value = fn(spec_plain, data_file, locate)
        remember(spec_plain, data_file, value)
        return value

    def peek(spec_plain: dict[str, Any], data_file: DataFiles = None) -> T | None:
        with lock:
            return memo.get(_memo_key(spec_plain, data_file))

    memoized.remember = remember  # type: ignore[attr-defined]
    memoized.peek = peek  # type: ignore[attr-defined]
    return memoized


def _memo_key(spec_plain: dict[str, Any], data_file: DataFiles) -> str:
    return json.dumps([spec_plain, data_file], sort_keys=True, default=str)


class WeightsRejected(ValueError):
    """The weights are not what the job's model produces; the message says how."""


@_memo_by_spec
def expected_tensors(
    spec_plain: dict[str, Any],
    data_file: DataFiles = None,
    locate: Callable[[str], Path] | None = None,
) -> Expected:
    """Tensor name -> (shape, dtype) of the weights a run of `spec_plain` writes: the
    model's state dict, built on torch's "meta" device so nothing is allocated.
    `data_file` is the job's own data (the owner's blob), probed for its shapes;
    `locate` finds a program's blob."""
    import torch

    from training.data.info import probe
    from training.model.modules import build_model
    from training.model.plan import plan_model
    from training.model.weights import DTYPES
    from training.spec.job import parse_spec

    spec = parse_spec(spec_plain)
    plan = plan_model(spec.model, probe(spec, data_file))
    if plan.program is not None:
        from training.program.job import program_of, state_shapes

        return state_shapes(program_of(spec, locate)[0])
    with torch.device("meta"):
        model = build_model(plan)
    return {
        name: (tuple(tensor.shape), DTYPES[tensor.dtype])
        for name, tensor in model.state_dict().items()
    }


def float_numel(expected: Expected, frozen: frozenset[str] = frozenset()) -> int:
    """Elements of the model's floating-point state less `frozen`: an elastic delta's length."""
    return sum(
        _numel(shape)
        for name, (shape, dtype) in expected.items()
        if dtype in _FLOAT_DTYPES and name not in frozen
    )


@_memo_by_spec
def delta_numel(
    spec_plain: dict[str, Any],
    data_file: DataFiles = None,
    locate: Callable[[str], Path] | None = None,
) -> int:
    """Values in one elastic delta of `spec_plain`: the floating-point state, buffers
    included, less the parameters `model.trainable` freezes."""
    from training.model.bind import meta_model
    from training.model.start import frozen_names
    from training.spec.job import parse_spec

    expected = expected_tensors(spec_plain, data_file, locate)
    spec = parse_spec(spec_plain)
    if not spec.start.trainable:
        return float_numel(expected)
    return float_numel(expected, frozen_names(meta_model(spec, data_file, locate)))


def model_shapes(
    spec: JobSpec, data_file: DataFiles, locate: Callable[[str], Path] | None
) -> dict[str, Any]:
    """What the owner checks a job's results against, counted in a runner so that its
    daemon need not build the model (`remember_shapes` keeps it there): the weights'
    tensors (name -> [shape, dtype]) and one elastic delta's length."""
    from training.spec.job import spec_to_plain

    plain = spec_to_plain(spec)
    tensors = expected_tensors(plain, data_file, locate)
    return {
        "tensors": {name: [list(shape), dtype] for name, (shape, dtype) in tensors.items()},
        "delta_numel": delta_numel(plain, data_file, locate),
    }


def remember_written(spec_plain: dict[str, Any], data_file: DataFiles, weights: Path) -> None:
    """The tensors of `weights`, just written from a model built from `spec_plain`
    (round 0's weights), as `expected_tensors`' answer: no second build of the model
    on the meta device, whose reference kernels import sympy (0.43 s of CPU in the
    owner's first runner of an elastic job, before its first share is offered)."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as written:
        names = written.keys()  # a safe_open is no mapping: it has no __iter__
        slices = {name: written.get_slice(name) for name in names}
        expected = {name: (tuple(s.get_shape()), s.get_dtype()) for name, s in slices.items()}
    expected_tensors.remember(spec_plain, data_file, expected)  # type: ignore[attr-defined]


def known_shapes(spec_plain: dict[str, Any], data_file: DataFiles) -> tuple[Expected, int] | None:
    """What `expected_tensors` and `delta_numel` answer for this spec, when both are
    known here already (remembered or computed); None otherwise."""
    tensors = expected_tensors.peek(spec_plain, data_file)  # type: ignore[attr-defined]
    numel = delta_numel.peek(spec_plain, data_file)  # type: ignore[attr-defined]
    return None if tensors is None or numel is None else (tensors, numel)


def remember_shapes(
    spec_plain: dict[str, Any], data_file: DataFiles, counted: dict[str, Any]
) -> None:
    """Keep what a runner counted for this job (`training.elastic.tasks.model_shapes`)
    as the answers of `expected_tensors` and `delta_numel`; raise ValueError, keeping
    nothing, unless it is well formed."""
    tensors, numel = counted.get("tensors"), counted.get("delta_numel")
    if not isinstance(tensors, dict) or type(numel) is not int or numel < 0:
        raise ValueError("the model's shapes: expected a tensors map and a delta length")
    expected: Expected = {}
    for name, entry in tensors.items():
        shape, dtype = entry if isinstance(entry, list) and len(entry) == 2 else ((), None)
        if (
            not isinstance(name, str)
            or dtype not in DTYPE_BYTES
            or not isinstance(shape, list)
            or not all(type(n) is int and n >= 0 for n in shape)
        ):
            raise ValueError(f"the model's shapes: a bad entry for tensor {str(name)[:64]!r}")
        expected[name] = (tuple(shape), dtype)
    if numel > float_numel(expected):
        raise ValueError("the model's shapes: a delta longer than the model's float state")
    expected_tensors.remember(spec_plain, data_file, expected)  # type: ignore[attr-defined]
    delta_numel.remember(spec_plain, data_file, numel)  # type: ignore[attr-defined]


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
    if expected:
        _compare(header, expected)
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


def _compare(header: dict[str, Any], expected: Expected) -> None:
    missing = sorted(set(expected) - set(header))
    extra = sorted(set(header) - set(expected))
    if missing or extra:
        raise WeightsRejected(
            f"tensor names differ from the model's: missing {missing[:5]}, unexpected "
            f"{[name[:64] for name in extra[:5]]}"
        )
    for name, (shape, dtype) in expected.items():
        info = header[name]
        found = (tuple(info.get("shape", ())), info.get("dtype")) if isinstance(info, dict) else ()
        if found != (shape, dtype):
            raise WeightsRejected(
                f"tensor {name!r}: expected {dtype} {list(shape)}, found "
                f"{found[1] if found else '?'} {list(found[0]) if found else '?'}"
            )


Forked = Callable[[list[str]], Awaitable[tuple[int, str] | None]]


async def check_weights_values(
    path: Path, time_limit_s: float = 300.0, forked: Forked | None = None
) -> None:
    """Every value finite: read in a subprocess (`python -m training.evidence.check_weights`),
    since the daemon parses no untrusted bulk data itself. `forked` runs the check in
    a child of a warm fork server instead, when it can (`node.work.run.check_forked`)."""
    await _check_in_subprocess([str(path)], time_limit_s, forked)


async def check_delta_file(
    path: Path,
    numel: int,
    job_id: str,
    round_: int,
    base_sha256: str,
    compression: str,
    time_limit_s: float = 300.0,
    forked: Forked | None = None,
) -> None:
    """An elastic delta file is this job's, this round's, from these weights, of this
    model's size, with finite values: read in a subprocess like the weights."""
    args = ["--delta", str(path), str(numel), job_id, str(round_), base_sha256, compression]
    await _check_in_subprocess(args, time_limit_s, forked)


async def _check_in_subprocess(args: list[str], time_limit_s: float, forked: Forked | None) -> None:
    import subprocess
    import sys

    import trio

    answered: tuple[int, str] | None = None
    with trio.move_on_after(time_limit_s) as deadline:
        if forked is not None:
            answered = await forked(args)
        if answered is None:
            done = await trio.run_process(
                [sys.executable, "-m", "training.evidence.check_weights", *args],
                env={**_THREADS_ONE, "PATH": "/usr/bin:/bin"},
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            answered = done.returncode, done.stdout.decode(errors="replace")
    if deadline.cancelled_caught or answered is None:
        raise WeightsRejected(f"checking the values took over {time_limit_s:g} s")
    code, printed = answered
    answer = printed.strip()[-500:]
    if code != 0 or answer != "ok":
        raise WeightsRejected(answer or f"the value check exited with {code}")


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
