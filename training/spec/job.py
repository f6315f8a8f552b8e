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
    parse_source,
)
from training.errors import SpecError
from training.spec.data import DataSpec, data_plain, parse_data
from training.spec.fields import Section
from training.spec.model import ModelSpec, model_plain, parse_model
from training.spec.optim import OptimSpec, check_inner_optim, optim_plain, parse_optim
from training.spec.program import ProgramSpec
from training.spec.start import StartSpec, start_plain
from training.spec.sweep import SweepSpec, parse_sweep

MODES = ("single", "elastic", "sweep")
MAX_SPEC_BYTES = 1024 * 1024
# a relay's circuit carries a limited number of bytes (ours: 64 MiB), and a relayed
# transfer shares the circuit with the job's messages: docs/nat.md
RELAY_BLOB_MB = 16


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
    # the share of a round's steps a worker trains from a guess of the round's weights
    # (training.elastic.starts; docs/design/elastic.md#rounds-that-overlap)
    overlap: float = 0.25

    @property
    def takes_weights_at(self) -> int:
        """See `overlap_step`."""
        return overlap_step(self.overlap, self.inner_steps)

    @property
    def eager(self) -> bool:
        """Whether a slot's share starts before the round before closed."""
        return self.takes_weights_at > 0

    @property
    def takes_weights(self) -> bool:
        """Whether an eager share takes its round's weights on its way."""
        return 0 < self.takes_weights_at < self.inner_steps


def overlap_step(overlap: float, inner_steps: int) -> int:
    """After how many of its steps an eager share takes its round's global weights:
    0 when shares do not start eagerly (`overlap` 0), `inner_steps` when they never
    take them (`overlap` 1; the guess stays in the share's delta)."""
    if overlap <= 0:
        return 0
    return min(inner_steps, max(1, int(overlap * inner_steps + 0.5)))


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
    model, start = parse_model(top.table("model"), base_dir, allowed_root)
    data = parse_data(top.table("data"), base_dir, allowed_root)
    optim_section = top.table("optim")
    elastic = None
    if mode == "elastic":
        elastic = _parse_elastic(top.table("elastic"))
        check_inner_optim(optim_section)
    elif top.has("elastic"):
        raise SpecError(f'elastic: this table is for mode = "elastic" (mode is {mode!r})')
    sweep = None
    if mode == "sweep":
        sweep = parse_sweep(top.table("sweep"))
    elif top.has("sweep"):
        raise SpecError(f'sweep: this table is for mode = "sweep" (mode is {mode!r})')
    optim = parse_optim(optim_section, steps_required=elastic is None)
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
    model = {**model_plain(spec.model), **start_plain(spec.start)}
    plain = {
        "name": spec.name,
        "mode": spec.mode,
        "seed": spec.seed,
        "placement": spec.placement,
        "model": model,
        "data": data_plain(spec.data),
        "optim": optim_plain(spec.optim),
        "requirements": _requirements_plain(spec.requirements),
    }
    if spec.elastic is not None:
        plain["elastic"] = dataclasses.asdict(spec.elastic)
        if spec.elastic.overlap == ElasticSpec.overlap:  # left out at its default
            del plain["elastic"]["overlap"]
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


def elastic_of_plain(plain: dict[str, Any]) -> ElasticSpec:
    """The `[elastic]` table of a plain spec already checked (`spec_to_plain`), for a
    node that holds the spec as data and builds no model."""
    return _parse_elastic(Section(plain.get("elastic", {}), "elastic"))


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
        overlap=section.number("overlap", ElasticSpec.overlap, lo=0, hi=1),
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


def _parse_requirements(section: Section) -> Requirements:
    requirements = Requirements(
        gpu=section.string("gpu", "preferred", choices=("required", "preferred", "none")),
        min_gpu_memory_gb=section.number("min_gpu_memory_gb", 0.0, lo=0, hi=1e6),
        max_hours=section.number("max_hours", 1.0, lo=0, hi=24 * 365, lo_open=True),
        relay_blob_mb=section.integer("relay_blob_mb", RELAY_BLOB_MB, lo=0, hi=1 << 16),
    )
    section.finish()
    return requirements
