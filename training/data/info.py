"""What a job's data looks like, found cheaply: sample shape, task, classes, split sizes.

Model input and output sizes come from the data, so validating a spec needs this
before anything is trained. Built-in data sets answer from constants; files are probed
by reading labels and the shape of `x` only (`training.data.formats`). The same rules,
applied again when the data is fully loaded, give the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data import formats
from training.data.sources import TOKEN_FORMATS
from training.errors import SpecError
from training.spec.data import DataSpec
from training.spec.job import JobSpec, local_files
from training.spec.model import CharTransformerSpec
from training.spec.program import ProgramSpec

DIGITS_SAMPLES, DIGITS_FEATURES, DIGITS_CLASSES = 1797, 64, 10
SYNTHETIC_SAMPLES, SYNTHETIC_FEATURES = 1024, 8
MAX_SAMPLE_DIMS = 3  # (features,), (height, width) or (channels, height, width)


@dataclass(frozen=True)
class DatasetInfo:
    """The facts about a data set that the model, budget and loop need."""

    task: str  # classification | regression | lm
    sample_shape: tuple[int, ...]  # one x sample; for lm (context,) token ids
    num_train: int  # samples (lm: windows) in the training split
    num_val: int  # samples in the validation split
    num_classes: int = 0  # classification
    target_shape: tuple[int, ...] = ()  # regression: () for one target, (k,) for k
    vocab_size: int = 0  # lm

    @property
    def num_samples(self) -> int:
        return self.num_train + self.num_val


#: the data files a process reads: one file, the shards of a sharded set it reads (in
#: shard order), or None (a built-in set, or the spec's own local files)
DataFiles = Path | tuple[Path, ...] | None


@dataclass(frozen=True)
class DataRef:
    """The data set to read: a built-in name or a file format, and the file if any."""

    kind: str  # digits | synthetic-regression | csv | npz | safetensors | text | tokens16/32
    path: Path | None
    shards: tuple[Path, ...] = ()  # a sharded set: the shards this process reads


def data_ref(spec: JobSpec, data_file: DataFiles) -> DataRef:
    """Which data to read: `data_file` when given (a blob's file, or the shards this
    process reads), else the spec's own local files (every shard)."""
    if spec.data.shards:
        return _shards_ref(spec, data_file)
    if isinstance(data_file, tuple):
        raise SpecError("data.source names one file, but shards were given")
    source = spec.data.parsed
    if source.origin == "builtin":
        return DataRef(source.kind, None)
    if data_file is not None:
        return DataRef(source.kind, Path(data_file))
    if source.path is None:
        raise SpecError(
            f"data.source {spec.data.source} is a blob; its file must be given to read it"
        )
    path = Path(source.path)
    if not path.is_absolute():
        path = path.resolve()
    return DataRef(source.kind, path)


def _shards_ref(spec: JobSpec, data_file: DataFiles) -> DataRef:
    if data_file is None:
        local = local_files(spec)
        if len(local) != len(spec.data.shards):
            raise SpecError("data.shards are blobs; their files must be given to read them")
        data_file = tuple(path.resolve() for path in local)
    if not isinstance(data_file, tuple) or not data_file:
        raise SpecError("data.shards: the shards to read must be given as files")
    return DataRef(str(spec.data.format), None, data_file)


def probe(spec: JobSpec, data_file: DataFiles = None) -> DatasetInfo:
    """Describe the spec's data without loading features where that can be avoided."""
    ref = data_ref(spec, data_file)
    data = spec.data
    if ref.shards:
        return describe_shards(spec, [formats.read_tokens(p, ref.kind) for p in ref.shards], ref)
    if ref.kind == "digits":
        shape = (DIGITS_SAMPLES, DIGITS_FEATURES)
        return _classes(shape, DIGITS_CLASSES, data)
    if ref.kind == "synthetic-regression":
        train, val = split_sizes(SYNTHETIC_SAMPLES, data.validation)
        return DatasetInfo("regression", (SYNTHETIC_FEATURES,), train, val)
    assert ref.path is not None
    if ref.kind == "text":
        return describe_text(spec, formats.read_text(ref.path))
    if ref.kind in TOKEN_FORMATS:
        return describe_tokens(spec, formats.read_tokens(ref.path, ref.kind), ref.path.name)
    arrays = read_arrays(ref, data.label, load_x=False)
    return describe(data, arrays.x_shape, arrays.y)


def read_arrays(ref: DataRef, label: str | None, load_x: bool) -> formats.Arrays:
    """Read a csv, npz or safetensors data file (features only if `load_x`)."""
    assert ref.path is not None
    if ref.kind == "csv":
        if label is None:
            raise SpecError("data.label is required for a csv source: name the label column")
        return formats.read_csv(ref.path, label, load_x)
    if ref.kind == "npz":
        return formats.read_npz(ref.path, load_x)
    if ref.kind == "safetensors":
        return formats.read_safetensors(ref.path, load_x)
    raise SpecError(f"data.source: {ref.kind} data has no x/y arrays")


def describe(data: DataSpec, x_shape: tuple[int, ...], y: np.ndarray) -> DatasetInfo:
    """Task, sample shape, classes and split of x/y data, checking that they agree."""
    if not x_shape or x_shape[0] == 0:
        raise SpecError("data.source: x has no samples")
    if len(x_shape) - 1 > MAX_SAMPLE_DIMS:
        raise SpecError(
            f"data.source: x has shape {x_shape}; samples can have at most "
            f"{MAX_SAMPLE_DIMS} dimensions (features, or channels x height x width)"
        )
    if y.ndim == 0 or y.shape[0] != x_shape[0]:
        raise SpecError(f"data.source: x has {x_shape[0]} samples but y has shape {y.shape}")
    task = data.task
    if task is None:
        task = "classification" if y.dtype.kind in "biu" else "regression"
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise SpecError("data.source: y holds NaN or infinite values")
    if task == "regression":
        if y.ndim > 2:
            raise SpecError(f"data.source: regression targets y must be (N,) or (N, k); {y.shape}")
        train, val = split_sizes(x_shape[0], data.validation)
        sample = tuple(x_shape[1:]) or (1,)
        return DatasetInfo("regression", sample, train, val, target_shape=tuple(y.shape[1:]))
    if task != "classification":
        raise SpecError(f"data.task {task!r} needs text data")
    if y.ndim != 1:
        raise SpecError(f"data.source: classification labels y must be (N,); got {y.shape}")
    if y.dtype.kind == "f" and not (y == np.round(y)).all():
        raise SpecError(
            "data.source: classification labels must be whole numbers 0..K-1; "
            'y holds fractions (set data.task = "regression" for continuous targets)'
        )
    if y.min() < 0:
        raise SpecError(f"data.source: classification labels must be >= 0; found {y.min()}")
    return _classes(x_shape, int(y.max()) + 1, data)


def _classes(x_shape: tuple[int, ...], num_classes: int, data: DataSpec) -> DatasetInfo:
    train, val = split_sizes(x_shape[0], data.validation)
    sample = tuple(x_shape[1:]) or (1,)
    return DatasetInfo("classification", sample, train, val, num_classes=num_classes)


def describe_text(spec: JobSpec, text: str) -> DatasetInfo:
    """A character LM's windows: `context` characters in, the next ones as targets."""
    if not isinstance(spec.model, CharTransformerSpec):
        raise SpecError("model.arch: text data needs arch = char_transformer")
    context = spec.model.context
    cut, val_len = text_split(len(text), spec.data.validation, context)
    return DatasetInfo(
        "lm",
        (context,),
        num_train=cut - context,
        num_val=max(val_len - context, 0),
        vocab_size=len(set(text)),
    )


def model_context(spec: JobSpec) -> int:
    """The window length of an LM on token data, which only the model knows."""
    if isinstance(spec.model, CharTransformerSpec):
        return spec.model.context
    if isinstance(spec.model, ProgramSpec) and spec.model.input_shape:
        return spec.model.input_shape[0]
    raise SpecError(
        f"model: arch {spec.model.arch!r} needs a context length to train on token data; "
        "use arch = char_transformer, or a program taking token ids"
    )


def describe_tokens(spec: JobSpec, ids: np.ndarray, name: str) -> DatasetInfo:
    """An LM's windows over token ids, split like text; `name` is the file, for errors."""
    context = model_context(spec)
    cut, val_len = text_split(len(ids), spec.data.validation, context, unit="token ids")
    return DatasetInfo(
        "lm",
        (context,),
        num_train=cut - context,
        num_val=max(val_len - context, 0),
        vocab_size=formats.token_vocab(ids, spec.data.vocab_size, name),
    )


def describe_shards(spec: JobSpec, shards: list[np.ndarray], ref: DataRef) -> DatasetInfo:
    """The windows of every shard read, each shard split as one token file would be."""
    context = model_context(spec)
    train = val = 0
    for ids, path in zip(shards, ref.shards, strict=True):
        try:
            cut, val_len = text_split(len(ids), spec.data.validation, context, unit="token ids")
        except SpecError as exc:
            raise SpecError(f"data.shards: {path.name}: {exc}") from None
        if cut - context < spec.data.batch_size:  # else a slot's batch could be smaller
            raise SpecError(
                f"data.shards: {path.name} has {cut - context} training windows; each shard "
                f"needs at least data.batch_size = {spec.data.batch_size}"
            )
        formats.token_vocab(ids, spec.data.vocab_size, path.name)
        train += cut - context
        val += max(val_len - context, 0)
    assert spec.data.vocab_size is not None
    return DatasetInfo("lm", (context,), train, val, vocab_size=spec.data.vocab_size)


def text_split(
    length: int, validation: float, context: int, unit: str = "characters"
) -> tuple[int, int]:
    """Where the text splits: the first `cut` characters train, the last `val_len` validate.

    The split is contiguous (no window straddles it), so validation text is unseen.
    Token ids split the same way; `unit` names what is counted, for the errors.
    """
    val_len = int(length * validation)
    cut = length - val_len
    if cut < context + 1:
        raise SpecError(
            f"data.source: the training part of the data has {cut} {unit}; it needs "
            f"at least model.context + 1 = {context + 1}"
        )
    if validation > 0 and val_len < context + 1:
        raise SpecError(
            f"data.validation: the validation part of the data has {val_len} {unit}; "
            f"it needs at least model.context + 1 = {context + 1} (use more data, a "
            "larger validation fraction, a shorter context, or validation = 0)"
        )
    return cut, val_len


def split_sizes(n: int, validation: float) -> tuple[int, int]:
    """Train/validation sizes: floor(n x validation) validate, at least 1 when asked."""
    val = int(n * validation)
    if validation > 0 and val == 0:
        val = 1
    if n - val < 1:
        raise SpecError(
            f"data.validation: {n} samples leave none for training with validation {validation:g}"
        )
    return n - val, val
