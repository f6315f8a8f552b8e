"""The job spec: what to train, on which data, how, and what it needs.

A spec is a TOML file (see docs/jobspec.md). `parse_spec` turns its plain data into
frozen dataclasses, checking every key, type and range and naming the key path in any
error; `spec_to_plain` turns it back into deterministic plain data, which is what is
signed and sent to a worker. Models are declarative (`training.model.layers`), so a spec
from a peer is data only.

Nothing here imports torch: the owner validates at submit time, and the runner checks
a request before it pays for importing torch.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.rounds import COMPRESSIONS
from training.data.sources import (
    BLOB_FORMATS,
    LM_KINDS,
    TOKEN_FORMATS,
    Source,
    parse_source,
    resolve_path,
)
from training.errors import SpecError
from training.model.layers import MAX_LAYERS, SIZE_MAX, check_layer_args
from training.spec.fields import Section
from training.spec.program import ProgramSpec, parse_program, program_plain
from training.spec.shards import MAX_SHARDS, parse_shards
from training.spec.start import StartSpec, parse_start, start_plain
from training.spec.sweep import SweepSpec, parse_sweep

MODES = ("single", "elastic", "sweep")
ACTIVATIONS = ("relu", "gelu", "tanh", "silu")
TASKS = ("classification", "regression", "lm")
OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "warmup")
LOSSES = ("cross_entropy", "mse", "l1")
PRECISIONS = ("fp32", "bf16")
MAX_SPEC_BYTES = 1024 * 1024
MAX_STEPS = 10**9
# a relay's circuit carries a limited number of bytes (ours: 64 MiB), and a relayed
# transfer shares the circuit with the job's messages: docs/nat.md
RELAY_BLOB_MB = 16


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


@dataclass(frozen=True)
class DataSpec:
    source: str = ""  # empty exactly when `shards` is set
    format: str | None = None
    label: str | None = None
    batch_size: int = 32
    validation: float = 0.1
    task: str | None = None
    vocab_size: int | None = None  # token data: ids are < this (default: max id + 1)
    shards: tuple[str, ...] = ()  # token files, each a blob (training.spec.shards)

    @property
    def parsed(self) -> Source:
        if self.shards:
            raise SpecError("data.shards: a sharded data set has no single source")
        return parse_source(self.source, self.format)

    @property
    def kind(self) -> str:
        """The data set or file format (a sharded set's: its `format`)."""
        return str(self.format) if self.shards else self.parsed.kind


@dataclass(frozen=True)
class OptimSpec:
    name: str = "adamw"
    lr: float = 1e-3
    steps: int | None = None
    epochs: int | None = None
    weight_decay: float = 0.0
    momentum: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    loss: str | None = None
    grad_clip: float | None = None
    validate_every: int = 0  # steps between validations during training (0: at the end only)
    precision: str = "fp32"  # bf16: autocast around the forward and the loss


@dataclass(frozen=True)
class Requirements:
    gpu: str = "preferred"
    min_gpu_memory_gb: float = 0.0
    max_hours: float = 1.0
    relay_blob_mb: int = RELAY_BLOB_MB  # the largest blob of the job a relay may carry


@dataclass(frozen=True)
class ElasticSpec:
    """DiLoCo rounds (`mode = "elastic"`): see docs/jobspec.md#elastic."""

    workers: int = 4  # target workers (data slots) per round
    min_workers: int = 1  # a round closes at its deadline with at least this many deltas
    inner_steps: int = 50  # H: the inner optimizer's steps per round and worker
    rounds: int = 20
    # plain averaging: DiLoCo's Nesterov 0.7 / 0.9 lost 3-6% of val loss at 8, 20 and
    # 100 rounds in benchmarks.outer_step (docs/performance.md#the-outer-step)
    outer_lr: float = 1.0
    outer_momentum: float = 0.0  # Nesterov
    compression: str = "int4"  # both ways on the wire: blockwise int8 or int4, or float32
    round_timeout_s: float = 0.0  # 0: adaptive (see node/work/owner/modes/elastic.py)
    delta_clip: float = 2.0  # a delta's norm is capped at this x the round's median (0: off)


@dataclass(frozen=True)
class TrustSpec:
    """How the owner checks a worker's result: see docs/jobspec.md#trust."""

    checkpoints: int = 100  # segments per unit; the worker commits to a state hash at each end
    spot_check_budget: float = 0.1  # the most of a unit's segments the owner replays
    replicas: int = 1  # workers of one determinism class that train each unit
    resume_minutes: float = 10.0  # a lost unit goes on from a state at most this old


@dataclass(frozen=True)
class JobSpec:
    name: str
    model: ModelSpec
    data: DataSpec
    optim: OptimSpec
    mode: str = "single"
    seed: int = 0
    placement: str = "auto"
    requirements: Requirements = Requirements()
    elastic: ElasticSpec | None = None  # set exactly when mode = "elastic"
    sweep: SweepSpec | None = None  # set exactly when mode = "sweep"
    trust: TrustSpec = TrustSpec()
    start: StartSpec = StartSpec()  # model.init and model.trainable (training.spec.start)


def parse_spec(
    raw: dict, base_dir: Path | None = None, *, allowed_root: Path | None = None
) -> JobSpec:
    """Check plain spec data and build a `JobSpec`, or raise `SpecError` naming the key.

    Relative file sources are resolved against `base_dir` (when given); with
    `allowed_root`, a source that resolves outside that folder is refused. Files are
    not opened here.
    """
    top = Section(raw, "")
    name = top.string("name", max_len=100)
    if not name.isprintable():
        raise SpecError("name must be printable text (no newlines or control characters)")
    mode = top.string("mode", "single", choices=MODES)
    seed = top.integer("seed", 0, lo=0, hi=2**63 - 1)
    placement = top.string("placement", "auto", choices=("auto", "local"))
    model, start = _parse_model(top.table("model"), base_dir, allowed_root)
    data = _parse_data(top.table("data"), base_dir, allowed_root)
    optim_section = top.table("optim")
    elastic = None
    if mode == "elastic":
        elastic = _parse_elastic(top.table("elastic"))
        _check_inner_optim(optim_section)
    elif top.has("elastic"):
        raise SpecError(f'elastic: this table is for mode = "elastic" (mode is {mode!r})')
    sweep = None
    if mode == "sweep":
        sweep = parse_sweep(top.table("sweep"))
    elif top.has("sweep"):
        raise SpecError(f'sweep: this table is for mode = "sweep" (mode is {mode!r})')
    optim = _parse_optim(optim_section, steps_required=elastic is None)
    requirements = _parse_requirements(top.table("requirements"))
    trust = _parse_trust(top.table("trust"), mode)
    top.finish()
    kind = data.kind
    if data.shards and mode != "elastic":
        raise SpecError(
            'data.shards is for mode = "elastic" (each data slot reads its own shards); '
            "for one worker, give one file as data.source"
        )
    if (model.arch == "char_transformer" and kind not in LM_KINDS) or (
        kind == "text" and model.arch != "char_transformer"
    ):
        raise SpecError(
            "model.arch: char_transformer trains on text or token ids (data.source = "
            'builtin:text:<path>, a .bin file with data.format = "tokens16" or "tokens32", '
            "or a text or tokens blob), and text data needs arch = char_transformer"
        )
    return JobSpec(
        name,
        model,
        data,
        optim,
        mode,
        seed,
        placement,
        requirements,
        elastic,
        sweep,
        trust,
        start,
    )


def load_spec(path: Path, allowed_root: Path | None = None) -> JobSpec:
    """Read a TOML spec file; file sources are resolved against its folder and must exist."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            blob = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror or exc}") from exc
    if len(blob) > MAX_SPEC_BYTES:
        raise SpecError(f"spec {path} is over {MAX_SPEC_BYTES} bytes")
    try:
        raw = tomllib.loads(blob.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SpecError(f"spec {path} is not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"spec {path} is not valid TOML: {exc}") from exc
    spec = parse_spec(raw, path.resolve().parent, allowed_root=allowed_root)
    for file in local_files(spec):
        if not file.is_file():
            raise SpecError(f"data.source: file not found: {file}")
    for key, file in model_files(spec).items():
        if not file.is_file():
            raise SpecError(f"model.{key}: file not found: {file}")
    return spec


def spec_to_plain(spec: JobSpec) -> dict[str, Any]:
    """The spec as plain data (str/int/float/bool/list/dict) in a fixed key order.

    Every default is written out, and keys that do not apply are left out, so
    `parse_spec(spec_to_plain(s)) == s` and equal specs give equal bytes when encoded.
    """
    if isinstance(spec.model, ProgramSpec):
        model = program_plain(spec.model)
    else:
        model = dataclasses.asdict(spec.model)
    if isinstance(spec.model, LayerStackSpec):
        model["layers"] = [{"type": layer.type, **dict(layer.args)} for layer in spec.model.layers]
    model = {"arch": model.pop("arch"), **{k: _plain(v) for k, v in model.items()}}
    model.update(start_plain(spec.start))
    optim = dataclasses.asdict(spec.optim)
    if spec.optim.name != "sgd":
        del optim["momentum"]
    if spec.optim.schedule == "constant":
        del optim["warmup_steps"]
    if not spec.optim.validate_every:
        del optim["validate_every"]
    if spec.optim.precision == "fp32":  # left out at its default: older specs stay equal
        del optim["precision"]
    plain = {
        "name": spec.name,
        "mode": spec.mode,
        "seed": spec.seed,
        "placement": spec.placement,
        "model": model,
        "data": _data_plain(spec.data),
        "optim": _drop_none(optim),
        "requirements": _requirements_plain(spec.requirements),
    }
    if spec.elastic is not None:
        plain["elastic"] = dataclasses.asdict(spec.elastic)
    if spec.sweep is not None:
        plain["sweep"] = spec.sweep.to_plain()
    if spec.trust != TrustSpec():  # left out at its defaults: specs from before it stay equal
        trust = dataclasses.asdict(spec.trust)
        if spec.trust.resume_minutes == TrustSpec.resume_minutes:  # the same, for this key
            del trust["resume_minutes"]
        plain["trust"] = trust
    return plain


def _requirements_plain(requirements: Requirements) -> dict[str, Any]:
    plain = dataclasses.asdict(requirements)
    if plain["relay_blob_mb"] == RELAY_BLOB_MB:  # left out at its default, like [trust]
        del plain["relay_blob_mb"]
    return plain


def relay_blob_bytes(plain_spec: dict[str, Any]) -> int:
    """The most bytes one blob of this job (plain spec) may take through a relay."""
    return int(plain_spec.get("requirements", {}).get("relay_blob_mb", RELAY_BLOB_MB)) << 20


def model_files(spec: JobSpec) -> dict[str, Path]:
    """The user's files `[model]` names, by key: a program's `.pt2` archives (until it is
    converted) and the `init` weights (until they are a blob). The upload's form fields
    carry the same names."""
    files = {}
    model = spec.model
    if isinstance(model, ProgramSpec) and not model.converted:
        files["program"] = Path(model.program)
        if model.eval_program is not None:
            files["eval_program"] = Path(model.eval_program)
    if spec.start.init is not None and spec.start.init_blob is None:
        files["init"] = Path(spec.start.init)
    return files


def with_program_blob(spec: JobSpec, sha256: str, figures: dict[str, Any]) -> JobSpec:
    """The spec reading its model from the converted program `sha256`, with its figures."""
    assert isinstance(spec.model, ProgramSpec)
    plain = spec_to_plain(spec)
    model = {"arch": "program", "program": f"blob:{sha256}", "output": spec.model.output}
    plain["model"] = {**model, **figures, **start_plain(spec.start)}
    return parse_spec(plain)


def local_files(spec: JobSpec) -> list[Path]:
    """Files on this machine the spec reads: the ones the CLI must upload."""
    if spec.data.shards:
        return [Path(s) for s in spec.data.shards if not s.startswith("blob:")]
    source = spec.data.parsed
    return [Path(source.path)] if source.path is not None else []


def with_blob_source(spec: JobSpec, sha256: str, fmt: str) -> JobSpec:
    """The same spec reading its data from the uploaded blob `sha256` in format `fmt`."""
    if spec.data.parsed.origin not in ("file", "text"):
        raise SpecError(f"data.source {spec.data.source!r} is not a local file; nothing to upload")
    if fmt not in BLOB_FORMATS:
        raise SpecError(f"data.format must be one of {', '.join(BLOB_FORMATS)}; got {fmt!r}")
    if fmt != spec.data.parsed.kind:
        raise SpecError(f"data.format {fmt!r} does not match the source's {spec.data.parsed.kind}")
    data = dataclasses.replace(spec.data, source=f"blob:{sha256}", format=fmt)
    parse_source(data.source, data.format)
    return dataclasses.replace(spec, data=data)


def with_blob_shards(spec: JobSpec, shas: list[str]) -> JobSpec:
    """The same spec reading each local shard from its uploaded blob, in order."""
    if len(shas) != len(spec.data.shards) or any(s.startswith("blob:") for s in spec.data.shards):
        raise SpecError(f"data.shards: {len(spec.data.shards)} local files, {len(shas)} uploads")
    shards = tuple(f"blob:{sha}" for sha in shas)
    for i, shard in enumerate(shards):
        parse_source(shard, spec.data.format, f"data.shards[{i}]")
    return dataclasses.replace(spec, data=dataclasses.replace(spec.data, shards=shards))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _data_plain(data: DataSpec) -> dict[str, Any]:
    plain = _drop_none(dataclasses.asdict(data))
    if data.shards:
        del plain["source"]
        plain["shards"] = list(data.shards)
    else:
        del plain["shards"]  # left out: specs from before shards stay equal
    return plain


def _drop_none(table: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value is not None}


def _parse_model(
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


def _parse_data(section: Section, base_dir: Path | None, allowed_root: Path | None) -> DataSpec:
    if section.has("shards"):
        return _parse_sharded(section, base_dir, allowed_root)
    source = section.string("source")
    fmt = section.string("format", None, choices=BLOB_FORMATS)
    parsed = parse_source(source, fmt)
    if parsed.origin == "file":
        source = resolve_path(source, base_dir, allowed_root, "data.source")
    elif parsed.origin == "text":
        source = "builtin:text:" + resolve_path(
            parsed.path or "", base_dir, allowed_root, "data.source"
        )
    elif parsed.origin == "blob":
        source = f"blob:{parsed.sha256}"
    label = section.string("label", None, max_len=256)
    if parsed.kind == "csv" and label is None:
        raise SpecError("data.label is required for a csv source: name the label column")
    task = section.string("task", None, choices=TASKS)
    if task is not None and (task == "lm") != (parsed.kind in LM_KINDS):
        raise SpecError(
            f"data.task {task!r} does not fit this source: task lm is for text and token data"
        )
    vocab_size = section.integer("vocab_size", None, lo=1, hi=2**32)
    if vocab_size is not None and parsed.kind not in TOKEN_FORMATS:
        raise SpecError(
            "data.vocab_size is for token data (data.format tokens16 or tokens32); "
            f"this source is {parsed.kind}"
        )
    data = DataSpec(
        source=source,
        format=fmt,
        label=label,
        batch_size=section.integer("batch_size", 32, lo=1, hi=65536),
        validation=section.number("validation", 0.1, lo=0, hi=0.9),
        task=task,
        vocab_size=vocab_size,
    )
    section.finish()
    return data


def _parse_sharded(section: Section, base_dir: Path | None, allowed_root: Path | None) -> DataSpec:
    if section.has("source"):
        raise SpecError("data: give data.source or data.shards, not both")
    fmt = section.string("format", None, choices=TOKEN_FORMATS)
    shards = parse_shards(section.string_list("shards", max_len=MAX_SHARDS), fmt, base_dir,
                          allowed_root)  # fmt: skip
    vocab_size = section.integer("vocab_size", None, lo=1, hi=2**32)
    if vocab_size is None:
        raise SpecError(
            "data.vocab_size is required with data.shards: each worker reads only some "
            "shards, so the vocabulary cannot come from the data"
        )
    data = DataSpec(
        format=fmt,
        batch_size=section.integer("batch_size", 32, lo=1, hi=65536),
        validation=section.number("validation", 0.1, lo=0, hi=0.9),
        task=section.string("task", None, choices=("lm",)),
        vocab_size=vocab_size,
        shards=shards,
    )
    section.finish()
    return data


def _parse_elastic(section: Section) -> ElasticSpec:
    elastic = ElasticSpec(
        workers=section.integer("workers", 4, lo=1, hi=1024),
        min_workers=section.integer("min_workers", 1, lo=1, hi=1024),
        inner_steps=section.integer("inner_steps", 50, lo=1, hi=10**6),
        rounds=section.integer("rounds", 20, lo=1, hi=10**5),
        outer_lr=section.number("outer_lr", 1.0, lo=0, hi=10, lo_open=True),
        outer_momentum=section.number("outer_momentum", 0.0, lo=0, hi=1, hi_open=True),
        compression=section.string("compression", "int4", choices=COMPRESSIONS),
        round_timeout_s=section.number("round_timeout_s", 0.0, lo=0, hi=7 * 24 * 3600),
        delta_clip=section.number("delta_clip", ElasticSpec.delta_clip, lo=0, hi=1e6),
    )
    section.finish()
    if elastic.min_workers > elastic.workers:
        raise SpecError(
            f"elastic.min_workers ({elastic.min_workers}) must be at most elastic.workers "
            f"({elastic.workers})"
        )
    if 0 < elastic.round_timeout_s < 10:
        raise SpecError(
            "elastic.round_timeout_s must be 0 (adaptive) or at least 10 seconds; got "
            f"{elastic.round_timeout_s:g}"
        )
    return elastic


def _parse_trust(section: Section, mode: str) -> TrustSpec:
    trust = TrustSpec(
        checkpoints=section.integer("checkpoints", TrustSpec.checkpoints, lo=0, hi=1000),
        spot_check_budget=section.number(
            "spot_check_budget", TrustSpec.spot_check_budget, lo=0, hi=1
        ),
        replicas=section.integer("replicas", TrustSpec.replicas, lo=1, hi=2),
        resume_minutes=section.number("resume_minutes", TrustSpec.resume_minutes, lo=0, hi=24 * 60),
    )
    section.finish()
    if trust.replicas > 1 and mode != "single":
        raise SpecError(
            f'trust.replicas: replicas are for mode = "single" jobs (mode is {mode!r}); '
            "elastic shares and sweep trials are spot-checked"
        )
    if trust.replicas > 1 and trust.checkpoints == 0:
        raise SpecError(
            "trust.replicas: replicas are compared by their checkpoints; set trust.checkpoints"
        )
    if trust.spot_check_budget > 0 and trust.checkpoints == 0:
        raise SpecError(
            "trust.spot_check_budget: spot checks replay the segments between checkpoints; "
            "set trust.checkpoints (e.g. 100) or spot_check_budget = 0"
        )
    return trust


def _check_inner_optim(section: Section) -> None:
    """An elastic job's length is its rounds x inner steps; a schedule would restart
    every round, so the inner optimizer runs at a constant rate."""
    for key in ("steps", "epochs"):
        if section.has(key):
            raise SpecError(
                f"optim.{key}: an elastic job trains elastic.rounds x elastic.inner_steps "
                f"steps per worker; leave optim.{key} out"
            )
    if section.get("schedule", "constant") != "constant":
        raise SpecError(
            "optim.schedule: an elastic job's inner optimizer runs at a constant rate; "
            'leave the schedule out (or "constant")'
        )


def _parse_optim(section: Section, steps_required: bool = True) -> OptimSpec:
    name = section.string("name", "adamw", choices=OPTIMIZERS)
    if name != "sgd" and section.has("momentum"):
        raise SpecError(f"optim.momentum applies only to sgd (optim.name is {name!r})")
    schedule = section.string("schedule", "constant", choices=SCHEDULES)
    if schedule == "constant" and section.has("warmup_steps"):
        raise SpecError('optim.warmup_steps needs schedule = "warmup" or "cosine"')
    steps = section.integer("steps", None, lo=1, hi=MAX_STEPS)
    epochs = section.integer("epochs", None, lo=1, hi=10**6)
    if steps_required and (steps is None) == (epochs is None):
        raise SpecError("optim needs exactly one of `steps` or `epochs` (integers > 0)")
    optim = OptimSpec(
        steps=steps,
        epochs=epochs,
        name=name,
        lr=section.number("lr", 1e-3, lo=0, lo_open=True),
        weight_decay=section.number("weight_decay", 0.0, lo=0, hi=100),
        momentum=section.number("momentum", 0.0, lo=0, hi=1, hi_open=True),
        schedule=schedule,
        warmup_steps=section.integer("warmup_steps", 0, lo=0, hi=MAX_STEPS),
        loss=section.string("loss", None, choices=LOSSES),
        grad_clip=section.number("grad_clip", None, lo=0, hi=1e9, lo_open=True),
        validate_every=section.integer("validate_every", 0, lo=0, hi=MAX_STEPS),
        precision=section.string("precision", "fp32", choices=PRECISIONS),
    )
    section.finish()
    return optim


def _parse_requirements(section: Section) -> Requirements:
    requirements = Requirements(
        gpu=section.string("gpu", "preferred", choices=("required", "preferred", "none")),
        min_gpu_memory_gb=section.number("min_gpu_memory_gb", 0.0, lo=0, hi=1e6),
        max_hours=section.number("max_hours", 1.0, lo=0, hi=24 * 365, lo_open=True),
        relay_blob_mb=section.integer("relay_blob_mb", RELAY_BLOB_MB, lo=0, hi=1 << 16),
    )
    section.finish()
    return requirements
