"""The train loop: digits MLP learns, the char transformer's loss falls, regression
fits, schedules follow their formulas, and the weights file is reproducible safetensors."""

from __future__ import annotations

import hashlib
import math
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from training.errors import TrainingError
from training.model.weights import file_sha256, weights_bytes, write_weights
from training.run.local import train_local
from training.run.optim import lr_factor
from training.spec.job import parse_spec
from training.spec.optim import OptimSpec


def make_spec(text: str) -> object:
    return parse_spec(tomllib.loads(text))


DIGITS_MLP = """
name = "digits"
seed = 3
[model]
arch = "mlp"
hidden = [64]
[data]
source = "builtin:digits"
batch_size = 64
validation = 0.2
[optim]
lr = 3e-3
steps = 150
"""


def test_digits_mlp_beats_chance_by_far(tmp_path: Path) -> None:
    events: list[dict] = []
    out = tmp_path / "w.safetensors"
    result = train_local(make_spec(DIGITS_MLP), out, emit=events.append)
    assert result["metrics"]["val_accuracy"] > 0.8, result
    assert result["steps"] == 150 and result["samples"] == 150 * 64
    assert result["weights_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    kinds = [event["event"] for event in events]
    assert kinds[0] == "started" and kinds[-1] == "result" and kinds[-2] == "progress"
    assert events[0]["total_steps"] == 150 and events[-2]["step"] == 150
    tensors = load_file(out)
    assert tensors["body.0.weight"].shape == (64, 64)
    with safe_open(out, "pt") as handle:
        assert handle.metadata() == {
            "format": "meshminer.weights/1",
            "name": "digits",
            "arch": "mlp",
            "seed": "3",
            "task": "classification",
        }


def test_char_transformer_loss_goes_down(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    spec = make_spec(
        f"""
name = "lm"
[model]
arch = "char_transformer"
layers = 1
heads = 2
width = 32
context = 16
[data]
source = "builtin:text:{corpus}"
batch_size = 16
validation = 0.1
[optim]
lr = 1e-2
steps = 40
schedule = "cosine"
warmup_steps = 5
"""
    )
    events: list[dict] = []
    result = train_local(spec, tmp_path / "lm.safetensors", emit=events.append)
    vocab = len(set(corpus.read_text()))
    assert result["metrics"]["train_loss"] < 0.6 * math.log(vocab), result
    assert "val_accuracy" not in result["metrics"] and result["metrics"]["val_loss"] > 0
    with safe_open(tmp_path / "lm.safetensors", "pt") as handle:
        assert len(eval(handle.metadata()["vocab"])) == vocab  # noqa: S307 - a JSON string


def test_regression_with_sgd_and_epochs(tmp_path: Path) -> None:
    spec = make_spec(
        """
name = "reg"
[model]
arch = "mlp"
hidden = []
[data]
source = "builtin:synthetic-regression"
batch_size = 128
[optim]
name = "sgd"
momentum = 0.9
lr = 0.05
epochs = 20
grad_clip = 10.0
"""
    )
    result = train_local(spec, tmp_path / "r.safetensors")
    assert result["steps"] == 20 * (922 // 128)
    assert result["metrics"]["val_loss"] < 0.05, result


def test_a_diverging_run_is_an_error_not_nan_weights(tmp_path: Path) -> None:
    spec = make_spec(
        """
name = "boom"
[model]
arch = "mlp"
[data]
source = "builtin:synthetic-regression"
[optim]
name = "sgd"
lr = 1e10
steps = 30
"""
    )
    with pytest.raises(TrainingError, match="the loss became"):
        train_local(spec, tmp_path / "nan.safetensors")
    assert not (tmp_path / "nan.safetensors").exists()
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the run


def test_schedules() -> None:
    constant = OptimSpec(steps=10)
    assert [lr_factor(constant, s, 10) for s in (0, 9)] == [1.0, 1.0]
    warmup = OptimSpec(steps=10, schedule="warmup", warmup_steps=4)
    assert [lr_factor(warmup, s, 10) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = OptimSpec(steps=10, schedule="cosine", warmup_steps=2)
    assert lr_factor(cosine, 0, 10) == 0.5 and lr_factor(cosine, 2, 10) == 1.0
    assert lr_factor(cosine, 6, 10) == pytest.approx(0.5)
    assert 0 < lr_factor(cosine, 9, 10) < 0.05


def test_weights_bytes_do_not_depend_on_insertion_order() -> None:
    a = {"b": torch.arange(3.0), "a": torch.ones(2, 2), "n": torch.tensor(7)}
    b = dict(reversed(list(a.items())))
    meta = {"name": "x", "arch": "mlp", "seed": "0", "task": "regression"}
    assert weights_bytes(a, meta) == weights_bytes(b, dict(reversed(list(meta.items()))))


def test_weights_written_without_sync_are_the_same_file(tmp_path: Path) -> None:
    tensors = {"w": torch.randn(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
    synced = write_weights(tmp_path / "a.safetensors", tensors, {"k": "v"})
    cached = write_weights(tmp_path / "b.safetensors", tensors, {"k": "v"}, sync=False)
    assert synced == cached == file_sha256(tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == weights_bytes(tensors, {"k": "v"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors"]


@pytest.mark.process
def test_deterministic_demands_deterministic_kernels_without_importing_inductor() -> None:
    """`deterministic()` sets torch's flag itself: the public call would import
    torch._inductor (1.5-2.5 s of CPU in every runner) to set a flag nothing here reads."""
    import subprocess
    import sys

    probe = (
        "import sys, torch\n"
        "from training.run.execute import deterministic\n"
        "with deterministic(0):\n"
        "    inside = torch.are_deterministic_algorithms_enabled()\n"
        "print(inside, torch.are_deterministic_algorithms_enabled(),"
        " 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "False", "False"], out.stderr
