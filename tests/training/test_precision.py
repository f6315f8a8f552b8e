"""`optim.precision = "bf16"`: autocast around the forward and the loss, for built-in
archs and programs alike; reproducible bit for bit, and a program still equal to its
eager module trained through the same loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from node.work.trust import TOLERANCE, tolerance_of
from tests.programs.eager import train_eager
from tests.programs.export import export_pair
from tests.programs.models import GPT
from training.evidence.bounds import BF16_ACROSS_KINDS, BF16_TOLERANCE
from training.program.job import bind_local
from training.run.local import train_local
from training.spec.job import SpecError, parse_spec, spec_to_plain

MLP = {
    "name": "mlp",
    "model": {"arch": "mlp", "hidden": [32]},
    "data": {"source": "builtin:digits"},
    "optim": {"steps": 15},
}


def test_bf16_trains_a_builtin_arch_reproducibly_and_differently(tmp_path: Path) -> None:
    bf16 = {**MLP, "optim": {**MLP["optim"], "precision": "bf16"}}
    one = train_local(parse_spec(bf16), tmp_path / "a.safetensors")
    two = train_local(parse_spec(bf16), tmp_path / "b.safetensors")
    fp32 = train_local(parse_spec(MLP), tmp_path / "c.safetensors")
    assert one["weights_sha256"] == two["weights_sha256"] != fp32["weights_sha256"]
    assert load_file(tmp_path / "a.safetensors")["body.0.weight"].dtype == torch.float32
    assert abs(one["metrics"]["val_loss"] - fp32["metrics"]["val_loss"]) < 0.1


def test_a_bf16_program_is_its_eager_module_under_the_same_autocast(tmp_path: Path) -> None:
    np.random.default_rng(0).integers(0, 60, 3000).astype(np.uint16).tofile(tmp_path / "t.bin")
    torch.manual_seed(0)
    gpt = GPT()
    export_pair(gpt, (torch.randint(0, 64, (4, 16)),), tmp_path)
    spec = {
        "name": "gpt-bf16",
        "model": {
            "arch": "program",
            "program": str(tmp_path / "model.pt2"),
            "eval_program": str(tmp_path / "model.eval.pt2"),
        },
        "data": {"source": str(tmp_path / "t.bin"), "format": "tokens16", "batch_size": 8},
        "optim": {"steps": 6, "precision": "bf16"},
    }
    train_local(parse_spec(spec), tmp_path / "w.safetensors")
    ours = load_file(tmp_path / "w.safetensors")
    eager = train_eager(bind_local(parse_spec(spec)), gpt)
    assert all(torch.equal(ours[k], v) for k, v in eager.items())


def test_precision_is_checked_kept_and_sets_the_cross_class_tolerance() -> None:
    with pytest.raises(SpecError, match="optim.precision"):
        parse_spec({**MLP, "optim": {**MLP["optim"], "precision": "fp8"}})
    assert "precision" not in spec_to_plain(parse_spec(MLP))["optim"]  # old specs stay equal
    bf16 = spec_to_plain(parse_spec({**MLP, "optim": {**MLP["optim"], "precision": "bf16"}}))
    assert bf16["optim"]["precision"] == "bf16"
    assert tolerance_of(bf16) == BF16_TOLERANCE
    assert tolerance_of(spec_to_plain(parse_spec(MLP))) == TOLERANCE
    # a CPU replaying a GPU's segment: bf16 needs its own bound (honest 0.008-0.032
    # on an H200), fp32 keeps the strict one (honest <= 2e-4 there)
    assert tolerance_of(bf16, kinds=True) == BF16_ACROSS_KINDS > 0.032 * 3
    assert tolerance_of(spec_to_plain(parse_spec(MLP)), kinds=True) == TOLERANCE
