"""Data: built-ins, csv, npz, safetensors and text load to the shapes the probe
predicts; pickles are refused unopened; missing and escaping files are clear errors."""

from __future__ import annotations

import io
import pickle
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from training.data.batches import load_dataset, synthetic_regression
from training.data.info import data_ref, probe
from training.spec.job import SpecError, load_spec, parse_spec


def spec_for(source: str, **data: object) -> object:
    raw = tomllib.loads('name = "d"\n[model]\narch = "mlp"\n[optim]\nsteps = 5\n')
    raw["data"] = {"source": source, **data}
    if source.startswith("builtin:text:") or data.get("format") == "text":
        raw["model"] = {"arch": "char_transformer", "context": 8, "width": 8}
    return parse_spec(raw)


def load(spec: object, data_file: Path | None = None) -> object:
    info = probe(spec, data_file)
    data = load_dataset(spec, data_ref(spec, data_file))
    assert data.info == info  # the cheap probe predicts the full load
    return data


def test_digits_are_1797_by_64_with_ten_classes() -> None:
    data = load(spec_for("builtin:digits", validation=0.2))
    assert data.info.sample_shape == (64,) and data.info.num_classes == 10
    assert (data.info.num_train, data.info.num_val) == (1438, 359)
    x, y = data.train.batch(torch.arange(4))
    assert x.shape == (4, 64) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert float(data.train.x.min()) >= 0.0 and float(data.train.x.max()) <= 1.0


def test_digits_equal_scikit_learns() -> None:
    from sklearn.datasets import load_digits

    from training.data.batches import _digits

    x, y = _digits()
    reference = load_digits()
    assert np.array_equal(x, (reference.data / 16.0).astype(np.float32))
    assert np.array_equal(y, reference.target)


def test_the_split_depends_on_the_seed_only() -> None:
    a = load(spec_for("builtin:synthetic-regression"))
    b = load(spec_for("builtin:synthetic-regression"))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.val.y, b.val.y)
    assert a.info.task == "regression" and a.info.sample_shape == (8,)
    assert a.info.num_samples == 1024 and a.info.target_shape == ()
    x, y = synthetic_regression(0)
    assert x.shape == (1024, 8) and y.shape == (1024,)
    assert not np.array_equal(synthetic_regression(1)[1], y)


def test_csv_with_a_label_column(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("f1,target,f2\n" + "".join(f"{i},{i % 3},{-i}\n" for i in range(30)))
    data = load(spec_for(str(path), label="target", validation=0.1))
    assert data.info.task == "classification" and data.info.num_classes == 3
    assert data.info.sample_shape == (2,) and (data.info.num_train, data.info.num_val) == (27, 3)
    row = data.train.x[0]
    assert float(row[1]) == -float(row[0])  # label column removed, feature order kept
    path.write_text("f1,y\n1,0.5\n2,1.5\n3,2.25\n")
    assert load(spec_for(str(path), label="y", validation=0)).info.task == "regression"


@pytest.mark.parametrize(
    ("text", "label", "expected"),
    [
        ("a,b\n1,2\n", "target", "data.label: no column 'target'"),
        ("a,target\n1,2\nx,3\n", "target", "line 3: 'x' is not a number"),
        ("a,target\n1,2\n3\n", "target", "line 3 has 1 fields; the header has 2"),
        ("a,target\n", "target", "has a header but no rows"),
        ("", "target", "is empty; it needs a header row"),
        ("a,target\n1,-1\n2,0\n", "target", "labels must be >= 0"),
    ],
)
def test_csv_errors_are_clear(tmp_path: Path, text: str, label: str, expected: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        probe(spec_for(str(path), label=label, validation=0))
    assert expected in str(info.value)


def test_npz_with_images(tmp_path: Path) -> None:
    path = tmp_path / "images.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((40, 2, 6, 6), dtype=np.float32), y=np.arange(40) % 4, extra=[1])
    data = load(spec_for(str(path), validation=0.25))
    assert data.info.sample_shape == (2, 6, 6) and data.info.num_classes == 4
    assert data.train.x.shape == (30, 2, 6, 6)


def test_an_npz_that_declares_more_than_it_holds_is_refused(tmp_path: Path) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 10)}
    )
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 64)
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(3, dtype=np.int64))
        archive.writestr("y.npy", buffer.getvalue())
    with pytest.raises(SpecError, match=r"declares shape \(1000000000, 10\) but holds only"):
        probe(spec_for(str(path)))


def test_safetensors_regression_with_two_targets(tmp_path: Path) -> None:
    path = tmp_path / "table.safetensors"
    rng = np.random.default_rng(0)
    save_file({"x": rng.random((20, 5)).astype(np.float32), "y": rng.random((20, 2))}, str(path))
    data = load(spec_for(str(path)))
    assert data.info.task == "regression" and data.info.target_shape == (2,)
    assert data.train.y.dtype == torch.float32


def test_blob_files_read_like_the_original(tmp_path: Path) -> None:
    original = tmp_path / "table.npz"
    np.savez(original, x=np.arange(60.0).reshape(20, 3), y=np.arange(20) % 2)
    blob = tmp_path / ("ab" * 32)
    blob.write_bytes(original.read_bytes())
    a = load(spec_for(str(original)))
    b = load(spec_for("blob:" + "ab" * 32, format="npz"), blob)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.val.y, b.val.y)


def test_text_windows(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("hello world, hello meshminer. " * 4)
    data = load(spec_for(f"builtin:text:{path}", validation=0.25))
    n = len(path.read_text())
    assert data.info.task == "lm" and data.info.vocab_size == len(set(path.read_text()))
    assert data.info.num_train == n - n // 4 - 8 and data.info.num_val == n // 4 - 8
    x, y = data.train.batch(torch.tensor([0, 5]))
    assert x.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert "".join(data.vocab[i] for i in x[0]) == "hello wo"
    path.write_text("tiny")
    with pytest.raises(SpecError, match="needs at least model.context"):
        probe(spec_for(f"builtin:text:{path}"))
    path.write_bytes(b"\xff\xfe bad")
    with pytest.raises(SpecError, match="is not UTF-8 text"):
        probe(spec_for(f"builtin:text:{path}"))


def test_pickles_are_refused_unopened(tmp_path: Path) -> None:
    for name in ("model.pt", "data.pkl", "weights.pth", "x.npy", "state.ckpt"):
        with pytest.raises(SpecError, match="never loads pickle"):
            spec_for(str(tmp_path / name))
    # a pickle wearing an .npz suffix is not a zip: refused before unpickling
    marker = tmp_path / "ran"
    disguised = tmp_path / "data.npz"
    disguised.write_bytes(pickle.dumps(_Boom(str(marker))))
    with pytest.raises(SpecError, match="is not an npz"):
        probe(spec_for(str(disguised)))
    # object arrays inside a real npz need pickle: refused
    with_objects = tmp_path / "objects.npz"
    np.savez(with_objects, x=np.array([{"a": 1}, {"b": 2}], dtype=object), y=np.array([0, 1]))
    with pytest.raises(SpecError, match="cannot be read without pickle|has dtype object"):
        load(spec_for(str(with_objects)))
    assert not marker.exists()


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def test_missing_files_and_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="data.source: file not found: .*nothing.npz"):
        probe(spec_for(str(tmp_path / "nothing.npz")))
    with pytest.raises(SpecError, match="data.source: file not found"):
        probe(spec_for(str(tmp_path / "nothing.csv"), label="y"))
    np.savez(tmp_path / "nox.npz", features=np.zeros((3, 2)), y=np.zeros(3))
    with pytest.raises(SpecError, match="has no array 'x' \\(found: features, y\\)"):
        probe(spec_for(str(tmp_path / "nox.npz")))
    np.savez(tmp_path / "short.npz", x=np.zeros((3, 2)), y=np.zeros(4, dtype=int))
    with pytest.raises(SpecError, match="x has 3 samples but y has shape \\(4,\\)"):
        probe(spec_for(str(tmp_path / "short.npz")))
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(SpecError, match="not a readable safetensors file"):
        probe(spec_for(str(tmp_path / "junk.safetensors")))


def test_a_path_outside_the_allowed_folder_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (tmp_path / "outside.csv").write_text("a,y\n1,0\n")
    with pytest.raises(SpecError, match="outside the allowed"):
        parse_spec(
            {
                "name": "x",
                "model": {"arch": "mlp"},
                "data": {"source": "../outside.csv", "label": "y"},
                "optim": {"steps": 1},
            },
            allowed,
            allowed_root=allowed,
        )
    spec = allowed / "job.toml"
    spec.write_text(
        'name = "x"\n[model]\narch = "mlp"\n[optim]\nsteps = 1\n'
        f'[data]\nsource = "{tmp_path / "outside.csv"}"\nlabel = "y"\n'
    )
    with pytest.raises(SpecError, match="outside the allowed"):
        load_spec(spec, allowed_root=allowed)


def _zip_bomb(path: Path, y_bytes: int) -> Path:
    """An npz whose y.npy inflates to `y_bytes` of zeros from a few MB of deflate."""
    import zipfile

    header = np.lib.format.header_data_from_array_1_0(np.zeros(0, np.int64))
    header["shape"] = (y_bytes // 8,)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros((y_bytes // 8, 1), np.float32))
        with archive.open("y.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            chunk = b"\0" * (1 << 24)
            for _ in range(y_bytes // len(chunk)):
                member.write(chunk)
    return path


@pytest.mark.process
def test_a_zip_bomb_npz_is_refused_from_its_headers(tmp_path: Path) -> None:
    """Probing (what the node daemon does for credit) never inflates the bomb: it is
    refused from the declared sizes, and the peak memory of the probe grows < 64 MiB."""
    import subprocess
    import sys

    bomb = _zip_bomb(tmp_path / "bomb.npz", 1 << 30)
    assert bomb.stat().st_size < 8 << 20
    probe_code = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from training.errors import SpecError\n"
        "from training.data.formats import read_npz\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    read_npz(Path(sys.argv[1]), load_x=False)\n"
        "except SpecError as exc:\n"
        "    print(exc)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe_code, str(bomb)], capture_output=True, text=True, timeout=60
    )
    message, grew_kib = out.stdout.strip().splitlines()
    assert "at most 128 MiB of labels" in message
    assert int(grew_kib) < 64 * 1024, f"the probe grew the peak RSS by {int(grew_kib) >> 10} MiB"
