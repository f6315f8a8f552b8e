"""Token-id data (nanoGPT's `.bin`): parse rules, probing, windows, training, upload,
and `meshminer tokenize` turning text into ids that decode back to it."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from training.data import formats
from training.data.batches import load_dataset
from training.data.info import data_ref, model_context, probe
from training.run.local import train_local
from training.spec.job import JobSpec, SpecError, parse_spec, spec_to_plain, with_blob_source

MESHMINER = Path(sys.executable).with_name("meshminer")
SHA = "ab" * 32
MODEL = {"arch": "char_transformer", "context": 4, "width": 8, "heads": 2, "layers": 1}


def spec_for(
    source: str, base: Path | None = None, model: dict | None = None, **data: object
) -> JobSpec:
    raw = {
        "name": "tokens",
        "model": model or MODEL,
        "data": {"source": source, **data},
        "optim": {"steps": 3},
    }
    return parse_spec(raw, base)


def write_ids(path: Path, ids: list[int] | np.ndarray, dtype: str = "<u2") -> Path:
    path.write_bytes(np.asarray(ids, dtype=dtype).tobytes())
    return path


def test_a_bin_file_needs_a_tokens_format() -> None:
    with pytest.raises(SpecError, match=r'\.bin file.*data.format = "tokens16" or "tokens32"'):
        spec_for("train.bin")
    for fmt in ("csv", "text"):  # no other format makes a .bin readable
        with pytest.raises(SpecError, match="only for blob: sources and for .bin token files"):
            spec_for("train.bin", format=fmt)
    for name in ("train.txt", "weights.pt", "builtin:text:train.bin"):  # nor tokens anything else
        with pytest.raises(SpecError, match="only for blob: sources and for .bin token files"):
            spec_for(name, format="tokens16")
    for name in ("weights.pt", "data.pkl", "x.npy"):  # the other pickle suffixes stay refused
        with pytest.raises(SpecError, match="never loads pickle"):
            spec_for(name)


def test_a_tokens_source_parses_and_rewrites_to_a_blob(tmp_path: Path) -> None:
    spec = spec_for("train.bin", tmp_path, format="tokens32", vocab_size=50_000)
    assert spec.data.parsed.kind == "tokens32" and spec.data.source == str(tmp_path / "train.bin")
    assert parse_spec(spec_to_plain(spec)) == spec
    blob = with_blob_source(spec, SHA, "tokens32")
    assert blob.data.source == f"blob:{SHA}" and blob.data.format == "tokens32"
    assert blob.data.vocab_size == 50_000 and parse_spec(spec_to_plain(blob)) == blob
    with pytest.raises(SpecError, match="data.format 'tokens16' does not match the source's"):
        with_blob_source(spec, SHA, "tokens16")
    assert spec_for(f"blob:{SHA}", format="tokens16", task="lm").data.parsed.kind == "tokens16"


TOKENS = {"source": "train.bin", "format": "tokens16"}


@pytest.mark.parametrize(
    ("data", "model", "message"),
    [
        ({**TOKENS, "vocab_size": 0}, MODEL, "data.vocab_size"),
        ({**TOKENS, "vocab_size": 2**32 + 1}, MODEL, "data.vocab_size"),
        ({**TOKENS, "task": "classification"}, MODEL, "task lm is for text and token data"),
        ({"source": "t.csv", "label": "y", "vocab_size": 9}, MODEL, "vocab_size is for token data"),
        ({"source": "train.txt"}, {"arch": "mlp"}, "text data needs arch = char_transformer"),
    ],
)
def test_bad_token_specs_are_refused_by_name(data: dict, model: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec_for(model=model, **data)


def test_char_transformer_still_needs_lm_data() -> None:
    with pytest.raises(SpecError, match="char_transformer trains on text or token ids"):
        spec_for("builtin:digits")


def test_the_probe_finds_the_vocabulary_and_checks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(formats, "TOKEN_CHUNK", 4)  # scanned in three chunks
    path = write_ids(tmp_path / "train.bin", [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])

    def tokens(fmt: str = "tokens16", **data: object) -> JobSpec:
        return spec_for("train.bin", tmp_path, format=fmt, validation=0, **data)

    info = probe(tokens())
    assert (info.task, info.vocab_size, info.sample_shape, info.num_train) == ("lm", 10, (4,), 8)
    assert probe(tokens(vocab_size=300)).vocab_size == 300
    with pytest.raises(SpecError, match=r"train\.bin holds token id 9 \(at position 5\).*is 7"):
        probe(tokens(vocab_size=7))
    path.write_bytes(path.read_bytes() + b"\x01")
    with pytest.raises(SpecError, match="25 bytes, not a multiple of 2"):
        probe(tokens())
    write_ids(path, [70_000, 1, 2, 3, 4, 5], "<u4")  # 24 bytes: also a multiple of 4
    assert probe(tokens("tokens32")).vocab_size == 70_001


def test_short_empty_and_missing_token_files_are_named(tmp_path: Path) -> None:
    write_ids(tmp_path / "short.bin", [1, 2, 3])
    with pytest.raises(SpecError, match="training part of the data has 3 token ids"):
        probe(spec_for("short.bin", tmp_path, format="tokens16", validation=0))
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(SpecError, match="empty.bin is empty"):
        probe(spec_for("empty.bin", tmp_path, format="tokens16"))
    with pytest.raises(SpecError, match="file not found"):
        probe(spec_for("gone.bin", tmp_path, format="tokens16"))


def test_token_data_needs_a_model_with_a_context(tmp_path: Path) -> None:
    write_ids(tmp_path / "train.bin", range(20))
    layers = {"arch": "layers", "layers": [{"type": "Flatten"}]}
    spec = spec_for(f"blob:{SHA}", model=layers, format="tokens16")
    with pytest.raises(SpecError, match="model: arch 'layers' needs a context length"):
        probe(spec, tmp_path / "train.bin")
    assert model_context(spec_for("train.bin", format="tokens16")) == MODEL["context"]


def test_windows_are_the_ids_shifted_by_one(tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, 1000, size=40).astype("<u2")
    write_ids(tmp_path / "train.bin", ids)
    spec = spec_for("train.bin", tmp_path, format="tokens16", validation=0.25)
    data = load_dataset(spec, data_ref(spec, None))
    assert data.info == probe(spec) and data.vocab == ""
    assert (data.info.num_train, data.info.num_val) == (30 - 4, 10 - 4)
    x, y = data.train.batch(torch.tensor([0, 7, 25]))
    assert x.dtype == y.dtype == torch.int64
    assert x.tolist() == [ids[i : i + 4].tolist() for i in (0, 7, 25)]
    assert y.tolist() == [ids[i + 1 : i + 5].tolist() for i in (0, 7, 25)]
    vx, vy = data.val.batch(torch.tensor([0, 5]))
    assert vx.tolist() == [ids[30 + i : 34 + i].tolist() for i in (0, 5)]
    assert vy.tolist() == [ids[31 + i : 35 + i].tolist() for i in (0, 5)]


def test_a_char_transformer_trains_on_tokens_reproducibly(tmp_path: Path) -> None:
    ids = np.random.default_rng(1).integers(0, 50, size=400)
    ids[0] = 49
    write_ids(tmp_path / "train.bin", ids)
    spec = spec_for("train.bin", tmp_path, format="tokens16", batch_size=8)
    digests = []
    for run in ("a", "b"):
        out = tmp_path / f"{run}.safetensors"
        result = train_local(spec, out)
        assert result["weights_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
        digests.append(result["weights_sha256"])
    assert digests[0] == digests[1]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a.safetensors"), "np") as weights:
        assert "vocab" not in weights.metadata()  # the ids' meaning is the owner's tokenizer
        assert weights.get_tensor("tokens.weight").shape == (50, MODEL["width"])


def _text(path: Path) -> str:
    rng = random.Random(3)
    words = ["mesh", "miner", "token", "größe", "naïve", "日本", "id\t", "  spaced"]
    lines = (" ".join(rng.choice(words) for _ in range(10)) for _ in range(200))
    text = "".join(line + rng.choice(["\n", "\r\n", "\n\n"]) for line in lines)
    path.write_bytes(text.encode("utf-8"))
    return text


@pytest.mark.process
def test_meshminer_tokenize_writes_ids_that_decode_to_the_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    text = _text(tmp_path / "input.txt")
    run = subprocess.run(
        [str(MESHMINER), "tokenize", "input.txt", "--out", "train.bin", "--vocab-size", "300"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert '  format = "tokens16"\n' in run.stdout and "train.tokenizer.json" in run.stdout
    ids = np.fromfile(tmp_path / "train.bin", dtype="<u2")
    tokenizer = Tokenizer.from_file(str(tmp_path / "train.tokenizer.json"))
    assert f"{ids.size:,} ids" in run.stdout and f"{ids.size * 2:,} bytes" in run.stdout
    assert tokenizer.decode(ids.tolist()) == text
    spec = spec_for("train.bin", tmp_path, format="tokens16", vocab_size=300)
    assert probe(spec).vocab_size == 300  # the file is what a tokens16 job reads

    again = subprocess.run(  # an existing tokenizer is used, not retrained
        [str(MESHMINER), "tokenize", "input.txt", "--out", "again.bin"]
        + ["--tokenizer", "train.tokenizer.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.bin").read_bytes() == (tmp_path / "train.bin").read_bytes()
    assert not (tmp_path / "again.tokenizer.json").exists()


def test_tokenize_refuses_bad_input_by_name(tmp_path: Path) -> None:
    from node.cli import tokenize_file

    (tmp_path / "bad.txt").write_bytes(b"abc \xff\xfe def\n")
    with pytest.raises(ValueError, match="bad.txt is not UTF-8 text"):
        tokenize_file(tmp_path / "bad.txt", tmp_path / "bad.bin")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        tokenize_file(tmp_path / "empty.txt", tmp_path / "empty.bin")
    _text(tmp_path / "in.txt")
    with pytest.raises(ValueError, match="--vocab-size 100: a byte-level BPE needs at least 256"):
        tokenize_file(tmp_path / "in.txt", tmp_path / "in.bin", vocab_size=100)
    with pytest.raises(ValueError, match="in.txt is not a tokenizer JSON file"):
        tokenize_file(tmp_path / "in.txt", tmp_path / "in.bin", tokenizer=tmp_path / "in.txt")
    tokenize_file(tmp_path / "in.txt", tmp_path / "in.bin", 300, tmp_path / "bpe.json")
    with pytest.raises(ValueError, match="bad.txt is not UTF-8 text"):  # fails while encoding
        tokenize_file(tmp_path / "bad.txt", tmp_path / "bad.bin", tokenizer=tmp_path / "bpe.json")
    assert sorted(p.name for p in tmp_path.glob("*.bin*")) == ["in.bin"]


def test_a_large_vocabulary_is_written_as_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from node.cli import tokenize_file

    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(70_000)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "words.json"))
    (tmp_path / "in.txt").write_text("w69999 w1 w65536\nnope w2\n")
    done = tokenize_file(tmp_path / "in.txt", tmp_path / "in.bin", 256, tmp_path / "words.json")
    assert (done.format, done.vocab_size, done.trained) == ("tokens32", 70_001, False)
    ids = np.fromfile(tmp_path / "in.bin", dtype="<u4").tolist()
    assert ids == [70_000, 2, 65_537, 0, 3]


@pytest.mark.slow
def test_meshminer_submit_uploads_a_token_file(tmp_path: Path) -> None:
    from node.demo.localnet import LocalNetwork

    write_ids(tmp_path / "train.bin", np.arange(200) % 37)
    (tmp_path / "job.toml").write_text(
        'name = "tokens"\n[model]\narch = "char_transformer"\ncontext = 4\nwidth = 8\n'
        '[data]\nsource = "train.bin"\nformat = "tokens16"\n[optim]\nsteps = 3\n'
    )
    (tmp_path / "net").mkdir()
    net = LocalNetwork(tmp_path / "net", ["--not-accepting", "--cold-runners"])
    try:
        node = net.add()
        run = subprocess.run(
            [str(MESHMINER), "submit", "job.toml", "--api", node.api],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "MESHMINER_DATA_DIR": str(node.data_dir)},
        )
        assert run.returncode == 0, run.stderr
        (job,) = node.get("/api/v1/jobs")
        digest = hashlib.sha256((tmp_path / "train.bin").read_bytes()).hexdigest()
        assert job["data_blobs"] == [digest] and job["summary"]["task"] == "lm"
        data = node.get(f"/api/v1/jobs/{job['id']}")["spec"]["data"]
        assert (data["source"], data["format"]) == (f"blob:{digest}", "tokens16")
    finally:
        net.stop()
