"""Data sets as tensors: loaded, converted, split by seed, and cut into batches.

The split and everything after it depend only on the bytes of the data and the seed,
so a worker reading a blob and an owner reading the original file get identical
batches. Features are float32 (int64 token ids for the LM and for layer stacks that
start with Embedding); class labels are int64, regression targets float32.

Built-in data sets:
- `builtin:digits`: scikit-learn's bundled 8x8 digits, 1797 samples, 64 features
  (pixel intensities 0..16 scaled to 0..1), 10 classes.
- `builtin:synthetic-regression`: 1024 samples of 8 standard-normal features;
  y = x @ w + 0.1 x noise, with w and the noise drawn from numpy's PCG64 seeded with
  the job's seed.
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from training.data import formats
from training.data.info import (
    SYNTHETIC_FEATURES,
    SYNTHETIC_SAMPLES,
    DataRef,
    DatasetInfo,
    describe,
    describe_shards,
    describe_text,
    describe_tokens,
    read_arrays,
    text_split,
)
from training.data.sources import TOKEN_FORMATS
from training.errors import SpecError
from training.spec.job import JobSpec


class Split:
    """One side of the split: a number of samples and a way to gather a batch of them."""

    def __len__(self) -> int:
        raise NotImplementedError

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def eval_index(self) -> torch.Tensor:
        """The samples an evaluation pass visits: all of them."""
        return torch.arange(len(self))


@dataclass
class TensorSplit(Split):
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


@dataclass
class WindowSplit(Split):
    """Character windows over one stretch of token ids: x = ids[i:i+C], y = ids[i+1:i+C+1]."""

    ids: torch.Tensor
    context: int

    def __len__(self) -> int:
        return max(self.ids.shape[0] - self.context, 0)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = index[:, None] + torch.arange(self.context)
        return self.ids[positions], self.ids[positions + 1]

    def eval_index(self) -> torch.Tensor:
        """Non-overlapping windows, so each character is scored once, not `context` times."""
        return torch.arange(0, len(self), self.context)


@dataclass
class StretchesSplit(Split):
    """Windows over several stretches of token ids (one per shard), none crossing from
    one stretch into the next: window i of the whole is window i - first[k] of
    stretch k, where `first[k]` counts the windows of the stretches before it."""

    ids: torch.Tensor  # the stretches, one after another
    starts: torch.Tensor  # where each stretch begins in `ids`
    counts: torch.Tensor  # windows per stretch
    context: int

    @classmethod
    def of(cls, stretches: list[torch.Tensor], context: int) -> StretchesSplit:
        lengths = torch.tensor([len(t) for t in stretches])
        starts = torch.cumsum(lengths, 0) - lengths
        counts = (lengths - context).clamp_min(0)
        return cls(torch.cat(stretches), starts, counts, context)

    def __len__(self) -> int:
        return int(self.counts.sum())

    def _window_starts(self, index: torch.Tensor) -> torch.Tensor:
        ends = torch.cumsum(self.counts, 0)
        k = torch.searchsorted(ends, index, right=True)
        return self.starts[k] + index - (ends[k] - self.counts[k])

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = self._window_starts(index)[:, None] + torch.arange(self.context)
        return self.ids[positions], self.ids[positions + 1]

    def eval_index(self) -> torch.Tensor:
        """Non-overlapping windows within each stretch, as `WindowSplit` takes them."""
        first = torch.cumsum(self.counts, 0) - self.counts
        return torch.cat(
            [
                f + torch.arange(0, int(n), self.context)
                for f, n in zip(first, self.counts, strict=True)
            ]
        )


@dataclass
class Dataset:
    info: DatasetInfo
    train: Split
    val: Split | None
    vocab: str = ""  # text lm: the characters, in id order (token data has none here)


def load_dataset(spec: JobSpec, ref: DataRef, token_input: bool = False) -> Dataset:
    """Load the data `ref` points at and split it by `spec.seed`."""
    if ref.shards:
        return _shards(spec, ref)
    if ref.kind == "text":
        assert ref.path is not None
        return _text(spec, formats.read_text(ref.path))
    if ref.kind in TOKEN_FORMATS:
        assert ref.path is not None
        return _tokens(spec, formats.read_tokens(ref.path, ref.kind), ref.path.name)
    if ref.kind == "digits":
        x, y = _digits()
    elif ref.kind == "synthetic-regression":
        x, y = synthetic_regression(spec.seed)
    else:
        arrays = read_arrays(ref, spec.data.label, load_x=True)
        assert arrays.x is not None
        x, y = arrays.x, arrays.y
    info = describe(spec.data, x.shape, y)
    if x.ndim == 1:
        x = x[:, None]
    x_tensor = _features(x, token_input)
    if info.task == "classification":
        y_tensor = torch.from_numpy(np.ascontiguousarray(y.astype(np.int64)))
    else:
        y_tensor = torch.from_numpy(np.ascontiguousarray(y.astype(np.float32)))
    order = torch.randperm(info.num_samples, generator=torch.Generator().manual_seed(spec.seed))
    val_index, train_index = order[: info.num_val], order[info.num_val :]
    train = TensorSplit(x_tensor[train_index], y_tensor[train_index])
    val = TensorSplit(x_tensor[val_index], y_tensor[val_index]) if info.num_val else None
    return Dataset(info, train, val)


def _features(x: np.ndarray, token_input: bool) -> torch.Tensor:
    if token_input:
        if x.dtype.kind == "f" and not (np.isfinite(x).all() and (x == np.round(x)).all()):
            raise SpecError("data.source: x must hold whole numbers (token ids) for Embedding")
        if x.size and x.min() < 0:
            raise SpecError("data.source: token ids in x must be >= 0 for Embedding")
        return torch.from_numpy(np.ascontiguousarray(x.astype(np.int64)))
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise SpecError("data.source: x holds NaN or infinite values")
    return torch.from_numpy(np.ascontiguousarray(x.astype(np.float32)))


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, read from its bundled file without importing scikit-learn.

    Importing scikit-learn costs over a second per runner process; the data is one
    small gzipped CSV (64 pixel columns, then the label), parsed the way
    `sklearn.datasets.load_digits` parses it. If the file is not where it is
    expected, `load_digits` itself is used.
    """
    found = importlib.util.find_spec("sklearn")
    locations = list(found.submodule_search_locations or []) if found else []
    bundled = [Path(p) / "datasets" / "data" / "digits.csv.gz" for p in locations]
    if bundled and bundled[0].is_file():
        with gzip.open(bundled[0], "rt", encoding="utf-8") as handle:
            table = np.loadtxt(handle, delimiter=",")
        data, target = table[:, :-1], table[:, -1]
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        data, target = digits.data, digits.target
    return (data / 16.0).astype(np.float32), target.astype(np.int64)


def synthetic_regression(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The built-in regression set for `seed` (see the module docstring)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    x = rng.standard_normal((SYNTHETIC_SAMPLES, SYNTHETIC_FEATURES))
    w = rng.standard_normal(SYNTHETIC_FEATURES)
    y = x @ w + 0.1 * rng.standard_normal(SYNTHETIC_SAMPLES)
    return x.astype(np.float32), y.astype(np.float32)


def encode_text(text: str) -> tuple[torch.Tensor, str]:
    """Character ids (int64) and the vocabulary: the distinct characters, sorted."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    unique, ids = np.unique(codes, return_inverse=True)
    vocab = "".join(chr(int(c)) for c in unique)
    return torch.from_numpy(ids.astype(np.int64).reshape(-1)), vocab


def _text(spec: JobSpec, text: str) -> Dataset:
    info = describe_text(spec, text)
    context = info.sample_shape[0]
    ids, vocab = encode_text(text)
    cut, val_len = text_split(len(text), spec.data.validation, context)
    train = WindowSplit(ids[:cut], context)
    val = WindowSplit(ids[cut:], context) if val_len else None
    return Dataset(info, train, val, vocab)


def _tokens(spec: JobSpec, ids: np.ndarray, name: str) -> Dataset:
    info = describe_tokens(spec, ids, name)
    context = info.sample_shape[0]
    cut, val_len = text_split(len(ids), spec.data.validation, context, unit="token ids")
    tensor = torch.from_numpy(ids.astype(np.int64))
    train = WindowSplit(tensor[:cut], context)
    val = WindowSplit(tensor[cut:], context) if val_len else None
    return Dataset(info, train, val)


def _shards(spec: JobSpec, ref: DataRef) -> Dataset:
    """Each shard split as one token file: heads train, tails validate."""
    shards = [formats.read_tokens(path, ref.kind) for path in ref.shards]
    info = describe_shards(spec, shards, ref)
    context = info.sample_shape[0]
    heads, tails = [], []
    for ids in shards:
        cut, val_len = text_split(len(ids), spec.data.validation, context, unit="token ids")
        tensor = torch.from_numpy(ids.astype(np.int64))
        heads.append(tensor[:cut])
        if val_len:
            tails.append(tensor[cut:])
    train = StretchesSplit.of(heads, context)
    val = StretchesSplit.of(tails, context) if tails else None
    return Dataset(info, train, val)
