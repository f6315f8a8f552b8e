"""The `[model]` table: a declarative architecture from the allow-list, or a
program (`program.py`); where its weights start is `start.py`'s part of the table."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import SpecError
from training.model.layers import MAX_LAYERS, SIZE_MAX, check_layer_args
from training.spec.fields import Section
from training.spec.program import ProgramSpec, parse_program, program_plain
from training.spec.start import StartSpec, parse_start

ACTIVATIONS = ("relu", "gelu", "tanh", "silu")


@dataclass(frozen=True)
class MlpSpec:
    hidden: tuple[int, ...] = (64,)
    activation: str = "relu"
    dropout: float = 0.0
    arch: str = "mlp"


@dataclass(frozen=True)
class CnnSpec:
    channels: tuple[int, ...] = (16, 32)
    kernel_sizes: tuple[int, ...] = (3, 3)
    activation: str = "relu"
    dropout: float = 0.0
    arch: str = "cnn"


@dataclass(frozen=True)
class CharTransformerSpec:
    layers: int = 2
    heads: int = 2
    width: int = 64
    context: int = 64
    dropout: float = 0.0
    arch: str = "char_transformer"


@dataclass(frozen=True)
class LayerSpec:
    """One entry of `model.layers`: a type from the allow-list and its arguments."""

    type: str
    args: tuple[tuple[str, int | float | bool], ...] = ()  # sorted by name


@dataclass(frozen=True)
class LayerStackSpec:
    layers: tuple[LayerSpec, ...]
    arch: str = "layers"


ModelSpec = MlpSpec | CnnSpec | CharTransformerSpec | LayerStackSpec | ProgramSpec
ARCHS = ("mlp", "cnn", "char_transformer", "layers", "program")


def parse_model(
    section: Section, base_dir: Path | None = None, allowed_root: Path | None = None
) -> tuple[ModelSpec, StartSpec]:
    arch = section.string("arch", choices=ARCHS)
    start = parse_start(section, base_dir, allowed_root)
    model: ModelSpec
    if arch == "program":
        model = parse_program(section, base_dir, allowed_root)
    elif arch == "mlp":
        model = MlpSpec(
            hidden=section.int_list("hidden", MlpSpec.hidden, lo=1, hi=SIZE_MAX, min_len=0),
            activation=section.string("activation", "relu", choices=ACTIVATIONS),
            dropout=section.number("dropout", 0.0, lo=0, hi=1, hi_open=True),
        )
    elif arch == "cnn":
        channels = section.int_list("channels", CnnSpec.channels, lo=1, hi=SIZE_MAX, max_len=32)
        kernels = section.int_list("kernel_sizes", None, lo=1, hi=2**16, max_len=32)
        if kernels is None:
            kernels = (3,) * len(channels)
        if len(kernels) != len(channels):
            raise SpecError(
                f"model.kernel_sizes has {len(kernels)} entries; it needs one per channel "
                f"entry ({len(channels)})"
            )
        model = CnnSpec(
            channels=channels,
            kernel_sizes=kernels,
            activation=section.string("activation", "relu", choices=ACTIVATIONS),
            dropout=section.number("dropout", 0.0, lo=0, hi=1, hi_open=True),
        )
    elif arch == "char_transformer":
        model = CharTransformerSpec(
            layers=section.integer("layers", 2, lo=1, hi=256),
            heads=section.integer("heads", 2, lo=1, hi=1024),
            width=section.integer("width", 64, lo=1, hi=2**16),
            context=section.integer("context", 64, lo=1, hi=2**16),
            dropout=section.number("dropout", 0.0, lo=0, hi=1, hi_open=True),
        )
        if model.width % model.heads:
            raise SpecError(
                f"model.width ({model.width}) must be divisible by model.heads ({model.heads})"
            )
    else:
        model = LayerStackSpec(_parse_layers(section.get("layers")))
    section.finish()
    return model, start


def _parse_layers(raw: Any) -> tuple[LayerSpec, ...]:
    if not isinstance(raw, list | tuple) or not raw:
        raise SpecError('model.layers must be a non-empty list of tables like {type = "Linear"}')
    if len(raw) > MAX_LAYERS:
        raise SpecError(f"model.layers has {len(raw)} entries; at most {MAX_LAYERS}")
    layers = []
    for i, item in enumerate(raw):
        path = f"model.layers[{i}]"
        table = Section(item, path)
        type_name = table.string("type", max_len=64)
        args = {key: value for key, value in table.raw.items() if key != "type"}
        checked = check_layer_args(type_name, args, path)
        layers.append(LayerSpec(type_name, tuple(sorted(checked.items()))))
    return tuple(layers)


def model_plain(model: ModelSpec) -> dict[str, Any]:
    """The table as plain data, `arch` first (`start.py` adds its own keys)."""
    plain = program_plain(model) if isinstance(model, ProgramSpec) else dataclasses.asdict(model)
    if isinstance(model, LayerStackSpec):
        plain["layers"] = [{"type": layer.type, **dict(layer.args)} for layer in model.layers]
    return {"arch": plain.pop("arch"), **{k: _plain(v) for k, v in plain.items()}}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
