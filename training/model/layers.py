"""The allow-list of torch layers for `arch = "layers"`, and shape propagation over it.

A peer's model is data, never code: a list of tables such as
`{type = "Linear", out_features = 64}`. Each allowed type lists its allowed keyword
arguments (ints, floats and bools only, each with a range). Input sizes
(`in_features`, `in_channels`, `normalized_shape`, `num_features`) are inferred by
propagating the per-sample shape through the list in plain Python, which also gives
exact parameter and FLOP counts with no tensor allocated: a 10^12-parameter request
costs microseconds to refuse. The torch modules are built later, from the kwargs this
module resolves (see `training.model.modules`).

Shapes here are per sample (no batch dimension); `Flatten` dims keep torch's batched
meaning, so its default `start_dim = 1` flattens each sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from training.errors import SpecError
from training.spec.fields import check_int, check_number, kind

SIZE_MAX = 2**24  # features, channels, embedding rows: large enough for 10^12 params
SMALL_MAX = 2**16  # kernel sizes, strides, paddings, dilations
MAX_LAYERS = 256
_REQUIRED: Any = object()

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Arg:
    """One allowed keyword argument: its type, default and range."""

    type: type  # int, float or bool
    default: Any = _REQUIRED  # _REQUIRED: must be given; None: absent unless given
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    inferred: bool = False  # an input size: inferred from the shape, checked if given

    def check(self, value: Any, path: str) -> Any:
        if self.type is bool:
            if not isinstance(value, bool):
                raise SpecError(f"{path} must be true or false, got {kind(value)}")
            return value
        if self.type is int:
            lo = None if self.lo is None else int(self.lo)
            hi = None if self.hi is None else int(self.hi)
            return check_int(value, path, lo, hi)
        return check_number(
            value, path, self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open
        )


@dataclass(frozen=True)
class LayerOut:
    """What one layer does to a sample: its output shape, cost and torch kwargs."""

    shape: Shape
    params: int
    flops: int  # per sample, 2 per multiply-add
    kwargs: dict[str, Any]


Propagate = Callable[[Shape, dict[str, Any], str], LayerOut]


@dataclass(frozen=True)
class LayerType:
    name: str
    args: dict[str, Arg]
    propagate: Propagate


def _size(default: Any = _REQUIRED, inferred: bool = False) -> Arg:
    return Arg(int, default, 1, SIZE_MAX, inferred=inferred)


def _small(default: Any = _REQUIRED, lo: int = 1) -> Arg:
    return Arg(int, default, lo, SMALL_MAX)


def _flag(default: bool) -> Arg:
    return Arg(bool, default)


def _match(args: dict[str, Any], key: str, actual: int, path: str) -> int:
    given = args.get(key)
    if given is not None and given != actual:
        raise SpecError(
            f"{path}.{key} is {given} but its input gives {actual}; leave it out to infer it"
        )
    return actual


def _need_rank(shape: Shape, rank: int, what: str, type_name: str, path: str) -> None:
    if len(shape) != rank:
        raise SpecError(f"{path} ({type_name}) needs {what} per sample, got shape {shape}")


def _window_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """torch's output length for a conv or pool window (pooling_output_shape)."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _spatial(shape: Shape, a: dict[str, Any], path: str, ceil: bool) -> Shape:
    k, p, d = a["kernel_size"], a["padding"], a.get("dilation", 1)
    s = a["stride"] or k  # pools default their stride to the kernel size
    out = tuple(_window_out(n, k, s, p, d, ceil) for n in shape)
    if min(out) < 1:
        raise SpecError(
            f"{path}: kernel {k} (dilation {d}, padding {p}) is larger than its input "
            f"{'x'.join(map(str, shape))}; nothing would come out"
        )
    return out


def _conv(nd: int) -> Propagate:
    name = f"Conv{nd}d"
    what = "(channels, length)" if nd == 1 else "(channels, height, width)"

    def propagate(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
        _need_rank(shape, nd + 1, what, name, path)
        c_in = _match(a, "in_channels", shape[0], path)
        c_out, groups, k = a["out_channels"], a["groups"], a["kernel_size"]
        if c_in % groups or c_out % groups:
            raise SpecError(f"{path}.groups ({groups}) must divide {c_in} and {c_out}")
        out = _spatial(shape[1:], a, path, ceil=False)
        weights = c_out * (c_in // groups) * k**nd
        kwargs = {key: a[key] for key in ("out_channels", "kernel_size", "stride", "padding")}
        kwargs.update(in_channels=c_in, dilation=a["dilation"], groups=groups, bias=a["bias"])
        return LayerOut(
            (c_out, *out), weights + c_out * a["bias"], 2 * weights * math.prod(out), kwargs
        )

    return propagate


def _pool(nd: int, op: str) -> Propagate:
    name = f"{op}Pool{nd}d"
    what = "(channels, length)" if nd == 1 else "(channels, height, width)"

    def propagate(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
        _need_rank(shape, nd + 1, what, name, path)
        k, p = a["kernel_size"], a["padding"]
        effective = a.get("dilation", 1) * (k - 1) + 1
        if 2 * p > effective:
            raise SpecError(f"{path}.padding ({p}) must be at most half the kernel ({k})")
        out = _spatial(shape[1:], a, path, ceil=a["ceil_mode"])
        kwargs = {key: value for key, value in a.items() if value is not None}
        return LayerOut((shape[0], *out), 0, 0, kwargs)

    return propagate


def _same(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
    return LayerOut(shape, 0, 0, {key: value for key, value in a.items() if value is not None})


def _linear(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
    f_in = _match(a, "in_features", shape[-1], path)
    f_out = a["out_features"]
    kwargs = {"in_features": f_in, "out_features": f_out, "bias": a["bias"]}
    params = f_in * f_out + f_out * a["bias"]
    return LayerOut((*shape[:-1], f_out), params, 2 * f_in * f_out * math.prod(shape[:-1]), kwargs)


def _flatten(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
    ndim = len(shape) + 1  # torch sees the batch dimension too
    start = a["start_dim"] + ndim if a["start_dim"] < 0 else a["start_dim"]
    end = a["end_dim"] + ndim if a["end_dim"] < 0 else a["end_dim"]
    if not 1 <= start <= end < ndim:
        raise SpecError(
            f"{path}: start_dim {a['start_dim']} / end_dim {a['end_dim']} do not fit a "
            f"sample of shape {shape}; dims count from 1 (0 is the batch)"
        )
    out = (*shape[: start - 1], math.prod(shape[start - 1 : end]), *shape[end:])
    return LayerOut(out, 0, 0, {"start_dim": a["start_dim"], "end_dim": a["end_dim"]})


def _layer_norm(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
    n = _match(a, "normalized_shape", shape[-1], path)
    params = n * a["elementwise_affine"] * (1 + a["bias"])
    kwargs = {"normalized_shape": n, "eps": a["eps"]}
    kwargs.update(elementwise_affine=a["elementwise_affine"], bias=a["bias"])
    return LayerOut(shape, params, 0, kwargs)


def _batch_norm(nd: int) -> Propagate:
    ranks = (1, 2) if nd == 1 else (3,)
    what = "(features,) or (channels, length)" if nd == 1 else "(channels, height, width)"

    def propagate(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
        if len(shape) not in ranks:
            raise SpecError(f"{path} (BatchNorm{nd}d) needs {what} per sample, got {shape}")
        n = _match(a, "num_features", shape[0], path)
        kwargs = {"num_features": n, "eps": a["eps"], "momentum": a["momentum"]}
        kwargs.update(affine=a["affine"], track_running_stats=a["track_running_stats"])
        return LayerOut(shape, 2 * n * a["affine"], 0, kwargs)

    return propagate


def _embedding(shape: Shape, a: dict[str, Any], path: str) -> LayerOut:
    n, dim = a["num_embeddings"], a["embedding_dim"]
    kwargs = {"num_embeddings": n, "embedding_dim": dim}
    if a.get("padding_idx") is not None:
        if a["padding_idx"] >= n:
            raise SpecError(f"{path}.padding_idx must be < num_embeddings ({n})")
        kwargs["padding_idx"] = a["padding_idx"]
    return LayerOut((*shape, dim), n * dim, 0, kwargs)


_EPS = Arg(float, 1e-5, 0, 1, lo_open=True)
_CONV = {
    "out_channels": _size(),
    "kernel_size": _small(),
    "stride": _small(1),
    "padding": _small(0, lo=0),
    "dilation": _small(1),
    "groups": _size(1),
    "bias": _flag(True),
    "in_channels": _size(None, inferred=True),
}
_MAX_POOL = {
    "kernel_size": _small(),
    "stride": _small(None),
    "padding": _small(0, lo=0),
    "dilation": _small(1),
    "ceil_mode": _flag(False),
}
_AVG_POOL = {
    "kernel_size": _small(),
    "stride": _small(None),
    "padding": _small(0, lo=0),
    "ceil_mode": _flag(False),
    "count_include_pad": _flag(True),
}
_BATCH_NORM = {
    "eps": _EPS,
    "momentum": Arg(float, 0.1, 0, 1, lo_open=True),
    "affine": _flag(True),
    "track_running_stats": _flag(True),
    "num_features": _size(None, inferred=True),
}

LAYER_TYPES: dict[str, LayerType] = {
    t.name: t
    for t in [
        LayerType(
            "Linear",
            {"out_features": _size(), "bias": _flag(True), "in_features": _size(None, True)},
            _linear,
        ),
        LayerType("Conv1d", _CONV, _conv(1)),
        LayerType("Conv2d", _CONV, _conv(2)),
        LayerType("MaxPool1d", _MAX_POOL, _pool(1, "Max")),
        LayerType("MaxPool2d", _MAX_POOL, _pool(2, "Max")),
        LayerType("AvgPool1d", _AVG_POOL, _pool(1, "Avg")),
        LayerType("AvgPool2d", _AVG_POOL, _pool(2, "Avg")),
        LayerType("ReLU", {}, _same),
        LayerType("GELU", {}, _same),
        LayerType("Tanh", {}, _same),
        LayerType("SiLU", {}, _same),
        LayerType("Sigmoid", {}, _same),
        LayerType("Identity", {}, _same),
        LayerType("LeakyReLU", {"negative_slope": Arg(float, 0.01, 0, 1)}, _same),
        LayerType("ELU", {"alpha": Arg(float, 1.0, 0, 100, lo_open=True)}, _same),
        LayerType("Dropout", {"p": Arg(float, 0.5, 0, 1, hi_open=True)}, _same),
        LayerType(
            "Flatten", {"start_dim": Arg(int, 1, -8, 8), "end_dim": Arg(int, -1, -8, 8)}, _flatten
        ),
        LayerType(
            "LayerNorm",
            {
                "eps": _EPS,
                "elementwise_affine": _flag(True),
                "bias": _flag(True),
                "normalized_shape": _size(None, inferred=True),
            },
            _layer_norm,
        ),
        LayerType("BatchNorm1d", _BATCH_NORM, _batch_norm(1)),
        LayerType("BatchNorm2d", _BATCH_NORM, _batch_norm(2)),
        LayerType(
            "Embedding",
            {
                "num_embeddings": Arg(int, _REQUIRED, 1, 2**31),
                "embedding_dim": _size(),
                "padding_idx": Arg(int, None, 0, 2**31),
            },
            _embedding,
        ),
    ]
}

#: layers whose first appearance decides how a sample is shaped for the stack
IMAGE_INPUT = ("Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm2d")
SEQUENCE_INPUT = ("Conv1d", "MaxPool1d", "AvgPool1d")
SHAPE_AGNOSTIC = ("ReLU", "GELU", "Tanh", "SiLU", "Sigmoid", "Identity", "LeakyReLU", "ELU")
SHAPE_AGNOSTIC += ("Dropout",)


def check_layer_args(type_name: str, raw: dict[str, Any], path: str) -> dict[str, Any]:
    """Validate one layer table's arguments (not its shapes); returns them checked."""
    if type_name not in LAYER_TYPES:
        raise SpecError(
            f"{path}.type: unknown layer type {type_name!r}; allowed: {', '.join(LAYER_TYPES)}"
        )
    spec = LAYER_TYPES[type_name].args
    checked = {}
    for key, value in raw.items():
        if key not in spec:
            allowed = ", ".join(spec) or "none"
            raise SpecError(
                f"{path}.{key} is not an allowed argument of {type_name} (allowed: {allowed})"
            )
        checked[key] = spec[key].check(value, f"{path}.{key}")
    for key, arg in spec.items():
        if arg.default is _REQUIRED and key not in checked:
            raise SpecError(f"{path}.{key} is required for {type_name}")
    return checked


def propagate(type_name: str, given: dict[str, Any], shape: Shape, path: str) -> LayerOut:
    """Apply one checked layer to a per-sample `shape`."""
    layer = LAYER_TYPES[type_name]
    args = {key: arg.default for key, arg in layer.args.items() if arg.default is not _REQUIRED}
    args.update(given)
    if not shape:
        raise SpecError(f"{path} ({type_name}) got a sample with no dimensions")
    return layer.propagate(shape, args, path)
