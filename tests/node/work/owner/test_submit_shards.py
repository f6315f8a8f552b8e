"""Submitting a sharded data set (`data.shards`): each shard is uploaded as form field
`shard<k>` and stored as its own blob, named in the spec in shard order; a bad upload
(a count that differs from the spec, a gap, `data` beside shards, a shard that is not
token ids of the declared width) is refused naming the problem and stores nothing."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from node.client import ApiError, submit_job
from node.demo.localnet import LocalNetwork, LocalNode
from node.work.owner.submission import SubmitError, with_uploaded_model, with_uploaded_shards
from node.work.service import validate_wire_spec
from training.budget import validate_for_submit
from training.errors import SpecError
from training.spec.job import JobSpec, parse_spec, spec_to_plain

SPEC = """
name = "sharded"
mode = "elastic"
[model]
arch = "char_transformer"
layers = 1
heads = 1
width = 16
context = 8
[data]
shards = [{shards}]
format = "tokens16"
vocab_size = 64
batch_size = 4
[elastic]
workers = 2
rounds = 2
inner_steps = 3
"""


def _spec(n: int) -> str:
    return SPEC.format(shards=", ".join(f'"part-{k:03d}.bin"' for k in range(n)))


def _parse(text: str) -> JobSpec:
    return parse_spec(tomllib.loads(text))


def _shards(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """`n` shards of 200 uint16 ids each (180 train: 172 windows of 8; 20 validate)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        path = folder / f"part-{k:03d}.bin"
        rng.integers(0, 64, size=200).astype("<u2").tofile(path)
        paths.append(path)
    return paths


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the owner's checks, called as the work service calls them --------------------------


def _uploads(tmp_path: Path, files: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    """The files as the API hands them over: saved under another name, with the client's."""
    saved = {}
    for field, path in files.items():
        copy = tmp_path / f"upload-0123-{field}"
        copy.write_bytes(path.read_bytes())
        saved[field] = (copy, path.name)
    return saved


def test_each_uploaded_shard_becomes_a_blob_in_shard_order(tmp_path: Path) -> None:
    parts = _shards(tmp_path / "mine", 3)
    uploads = _uploads(tmp_path, {f"shard{k}": p for k, p in enumerate(parts)})
    spec, files = with_uploaded_shards(_parse(_spec(3)), uploads)
    assert files == tuple(uploads[f"shard{k}"][0] for k in range(3))
    assert spec.data.shards == tuple(f"blob:{_sha(p)}" for p in parts)
    spec, stored = with_uploaded_model(spec, uploads, files, tmp_path)
    assert stored == []  # no program, no init: only the shards are stored
    summary = validate_for_submit(spec, files)
    assert summary.task == "lm"
    plain = spec_to_plain(spec)
    assert validate_wire_spec(plain) == plain  # what a worker accepts
    local = {
        **plain,
        "data": {**plain["data"], "shards": ["part-000.bin", *plain["data"]["shards"][1:]]},
    }
    with pytest.raises(SpecError, match=r"data.shards\[0\]: a worker reads shards only from blobs"):
        validate_wire_spec(local)


def test_a_spec_without_shards_takes_no_shard_upload(tmp_path: Path) -> None:
    (part,) = _shards(tmp_path / "mine", 1)
    text = _spec(1).replace('shards = ["part-000.bin"]', 'source = "blob:' + "0" * 64 + '"')
    spec = _parse(text)
    assert with_uploaded_shards(spec, {}) == (spec, None)
    with pytest.raises(
        SubmitError, match="form field 'shard0' came, but the spec has no data.shards"
    ):
        with_uploaded_shards(spec, _uploads(tmp_path, {"shard0": part}))


def _bad_uploads(tmp_path: Path) -> dict[str, tuple[int, dict[str, Path], str]]:
    """Refused uploads: (shards the spec names, files by form field, the refusal)."""
    a, b, c = _shards(tmp_path / "mine", 3)
    odd = tmp_path / "odd" / "part-001.bin"
    odd.parent.mkdir()
    odd.write_bytes(b.read_bytes() + b"\x01")  # 401 bytes: not uint16 ids
    empty = tmp_path / "empty" / "part-001.bin"
    empty.parent.mkdir()
    empty.write_bytes(b"")
    return {
        "too few": (3, {"shard0": a, "shard1": b}, "form field 'shard2' is missing: "
                    "data.shards names 3 files, 2 came"),
        "too many": (2, {"shard0": a, "shard1": b, "shard2": c}, "form field 'shard2' came, "
                     "but data.shards names 2 files"),
        "a gap": (2, {"shard0": a, "shard2": b}, "'shard2'"),
        "data beside shards": (2, {"data": a, "shard0": a, "shard1": b}, "'data'"),
        "odd width": (2, {"shard0": a, "shard1": odd}, r"data.shards[1] (form field 'shard1'): "
                      "part-001.bin is 401 bytes, not a multiple of 2"),
        "empty": (2, {"shard0": a, "shard1": empty}, "part-001.bin is empty"),
        "the same bytes twice": (2, {"shard0": a, "shard1": a}, "form fields 'shard0' and "
                                 "'shard1' hold the same bytes"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "too few",
        "too many",
        "a gap",
        "data beside shards",
        "odd width",
        "empty",
        "the same bytes twice",
    ],
)
def test_bad_shard_uploads_are_refused_by_the_owner(tmp_path: Path, case: str) -> None:
    n, files, message = _bad_uploads(tmp_path)[case]
    with pytest.raises(SubmitError) as refused:
        with_uploaded_shards(_parse(_spec(n)), _uploads(tmp_path, files))
    assert message in str(refused.value)
    assert "upload-0123" not in str(refused.value)  # the user's file names, not ours


def test_a_blob_shard_is_not_a_submission(tmp_path: Path) -> None:
    text = _spec(2).replace('"part-001.bin"', '"blob:' + "a" * 64 + '"')
    (part,) = _shards(tmp_path / "mine", 1)
    with pytest.raises(SubmitError, match=r"data.shards\[1\] names a blob"):
        with_uploaded_shards(_parse(text), _uploads(tmp_path, {"shard0": part}))


# --- through a node's HTTP API and `meshminer submit` ------------------------------------


def _stored_blobs(node: LocalNode) -> list[Path]:
    return sorted(p for p in (node.data_dir / "blobs").rglob("*") if p.is_file())


def _left_uploads(node: LocalNode) -> list[Path]:
    return sorted((node.data_dir / "uploads").glob("*"))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    """One paused node: its jobs stay queued, nothing trains."""
    net = LocalNetwork(tmp_path_factory.mktemp("shards"), ["--not-accepting", "--cold-runners"])
    try:
        yield net.add()
    finally:
        net.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "fields", "message"),
    [
        (3, {"shard0": 0, "shard1": 1}, "form field 'shard2' is missing"),
        (2, {"shard0": 0, "shard1": 1, "shard2": 2}, "form field 'shard2' came, but data.shards"),
        (2, {"shard0": 0, "shard2": 1}, "form field 'shard2' came without 'shard1'"),
        (2, {"shard1": 0, "shard2": 1}, "form field 'shard1' came without 'shard0'"),
        (2, {"data": 0, "shard0": 0, "shard1": 1}, "form field 'data' came with shard fields"),
        (2, {"shard0": 0, "shard1": "odd"}, "part-001.bin is 401 bytes, not a multiple of 2"),
        (1, {"shard0": 0, "shard64": 1}, "unexpected form field 'shard64'"),
        (1, {"shard0": 0, "shard01": 1}, "unexpected form field 'shard01'"),
    ],
)
def test_bad_shard_uploads_get_a_400_and_store_nothing(
    node: LocalNode, tmp_path: Path, n: int, fields: dict[str, int | str], message: str
) -> None:
    parts = _shards(tmp_path, 3)
    odd = tmp_path / "odd" / "part-001.bin"
    odd.parent.mkdir()
    odd.write_bytes(parts[1].read_bytes() + b"\x01")
    files = {f: odd if k == "odd" else parts[int(k)] for f, k in fields.items()}
    jobs, blobs = node.get("/api/v1/jobs"), _stored_blobs(node)
    with pytest.raises(ApiError, match=re.escape(message)) as refused:
        submit_job(node.api, _spec(n), None, files=files)
    assert "400" in str(refused.value)
    assert node.get("/api/v1/jobs") == jobs
    assert _stored_blobs(node) == blobs
    assert _left_uploads(node) == []


@pytest.mark.slow
def test_a_sharded_spec_over_http_stores_each_shard_as_a_blob(
    node: LocalNode, tmp_path: Path
) -> None:
    parts = _shards(tmp_path, 3, seed=1)
    job = submit_job(node.api, _spec(3), None, shards=parts)
    shas = [_sha(p) for p in parts]
    assert job["state"] == "queued"
    assert job["spec"]["data"]["shards"] == [f"blob:{sha}" for sha in shas]
    assert "source" not in job["spec"]["data"]
    assert job["data_blobs"] == shas
    assert job["summary"]["task"] == "lm"
    for sha in shas:
        assert (node.data_dir / "blobs" / sha[:2] / sha).read_bytes() == parts[
            shas.index(sha)
        ].read_bytes()
    assert _left_uploads(node) == []


@pytest.mark.slow
def test_meshminer_submit_uploads_every_shard(node: LocalNode, tmp_path: Path) -> None:
    parts = _shards(tmp_path / "job", 2, seed=2)
    (tmp_path / "job" / "job.toml").write_text(_spec(2))
    run = subprocess.run(
        [sys.executable, "-m", "node", "submit", "job.toml", "--api", node.api],
        cwd=tmp_path / "job",
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MESHMINER_DATA_DIR": str(node.data_dir)},
    )
    assert run.returncode == 0, run.stderr
    found = re.search(r"job ([0-9a-f]{16})", run.stdout)
    assert found, run.stdout
    job = node.get(f"/api/v1/jobs/{found.group(1)}")
    shas = [_sha(p) for p in parts]
    assert job["spec"]["data"]["shards"] == [f"blob:{sha}" for sha in shas]
    assert job["data_blobs"] == shas
    assert all((node.data_dir / "blobs" / sha[:2] / sha).is_file() for sha in shas)
