"""`model.init` and `model.trainable`: training starts from given weights, and only the
parameters the patterns select train, for every arch; the optimizer, checkpoints,
elastic deltas and credit cover only what trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.programs.export import export_pair
from tests.programs.models import GPT
from training.budget import validate_for_submit
from training.evidence.result_check import delta_numel
from training.model.bind import bind_trainable
from training.run.execute import run_job
from training.run.local import train_local
from training.spec.job import SpecError, parse_spec, spec_to_plain

BASE = {
    "name": "start",
    "model": {"arch": "mlp", "hidden": [16]},
    "data": {"source": "builtin:digits"},
    "optim": {"steps": 20},
}


def _spec(**model: object) -> dict:
    return {**BASE, "model": {**BASE["model"], **model}}


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A first job's weights: what a fine-tune starts from."""
    out = tmp_path_factory.mktemp("first") / "first.safetensors"
    train_local(parse_spec(BASE), out)
    return out


def test_a_fine_tune_starts_from_the_init_and_trains_only_the_head(
    first: Path, tmp_path: Path
) -> None:
    spec = bind_trainable(parse_spec(_spec(init=str(first), trainable=["body.2.*"])))
    assert spec.start.trainable_parameters == 16 * 10 + 10
    run_job(spec, None, tmp_path / "w.safetensors", checkpoint_dir=tmp_path / "cp")
    before, after = load_file(first), load_file(tmp_path / "w.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in ("body.0.weight", "body.0.bias"))
    assert not torch.equal(before["body.2.weight"], after["body.2.weight"])
    # checkpoint 0 is the init's state; checkpoints hold only what trains
    zero = load_file(tmp_path / "cp" / "checkpoint-00000000.safetensors")
    assert torch.equal(zero["model.body.2.weight"], before["body.2.weight"])
    last = load_file(sorted((tmp_path / "cp").glob("*.safetensors"))[-1])
    assert "model.body.0.weight" not in last and "model.body.2.weight" in last
    assert {k.split(".")[1] for k in last if k.startswith("optim.")} == {"0", "1"}  # 2 tensors


def test_train_local_binds_the_count_and_is_reproducible(first: Path, tmp_path: Path) -> None:
    spec = parse_spec(_spec(init=str(first), trainable=["body.2.*"]))
    one = train_local(spec, tmp_path / "a.safetensors")
    two = train_local(spec, tmp_path / "b.safetensors")
    assert one["weights_sha256"] == two["weights_sha256"]


def test_credit_and_deltas_cover_only_what_trains() -> None:
    full = validate_for_submit(parse_spec(BASE)).training_flops
    head = bind_trainable(parse_spec(_spec(trainable=["body.2.*"])))
    part = validate_for_submit(head).training_flops
    forward = full // 3
    assert part == 2 * forward + forward * 170 // (64 * 16 + 16 + 170)
    elastic = {"mode": "elastic", "elastic": {"workers": 2, "rounds": 1, "inner_steps": 2}}
    optim = {"lr": 1e-3}
    everything = spec_to_plain(parse_spec({**BASE, **elastic, "optim": optim}))
    frozen = spec_to_plain(
        bind_trainable(parse_spec({**_spec(trainable=["body.2.*"]), **elastic, "optim": optim}))
    )
    assert delta_numel(everything) == 64 * 16 + 16 + 170
    assert delta_numel(frozen) == 170


def test_a_tied_weight_trains_when_any_of_its_names_is_selected(tmp_path: Path) -> None:
    torch.manual_seed(0)
    export_pair(GPT(), (torch.randint(0, 64, (4, 16)),), tmp_path)
    ids = torch.randint(0, 64, (3000,), generator=torch.Generator().manual_seed(1))
    (tmp_path / "t.bin").write_bytes(ids.to(torch.int16).numpy().tobytes())
    spec = parse_spec(
        {
            "name": "lm-head",
            "model": {
                "arch": "program",
                "program": str(tmp_path / "model.pt2"),
                "eval_program": str(tmp_path / "model.eval.pt2"),
                "trainable": ["lm_head.*", "ln_f.*"],
            },
            "data": {"source": str(tmp_path / "t.bin"), "format": "tokens16", "batch_size": 8},
            "optim": {"steps": 3},
        }
    )
    train_local(spec, tmp_path / "w.safetensors")
    torch.manual_seed(0)
    start = GPT()  # the exported module's initial state
    after = load_file(tmp_path / "w.safetensors")
    assert not torch.equal(after["wte.weight"], start.state_dict()["wte.weight"])  # tied: trains
    assert torch.equal(after["lm_head.weight"], after["wte.weight"])
    assert torch.equal(after["wpe.weight"], start.state_dict()["wpe.weight"])  # frozen


def test_an_init_that_is_not_the_models_is_refused_naming_the_tensor(
    first: Path, tmp_path: Path
) -> None:
    tensors = load_file(first)
    cases = {
        "has no tensor 'body.2.bias'": {k: v for k, v in tensors.items() if k != "body.2.bias"},
        "tensor 'extra' is not the model's": {**tensors, "extra": torch.zeros(1)},
        "'body.0.weight' is F32 [3, 3]": {**tensors, "body.0.weight": torch.zeros(3, 3)},
        "'body.0.bias' is F64 [16]": {**tensors, "body.0.bias": torch.zeros(16).double()},
    }
    for message, content in cases.items():
        path = tmp_path / "init.safetensors"
        save_file(content, path)
        with pytest.raises(SpecError, match=re.escape(message)):
            train_local(parse_spec(_spec(init=str(path))), tmp_path / "x.safetensors")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 9)
    with pytest.raises(SpecError, match="not a readable safetensors file"):
        train_local(parse_spec(_spec(init=str(tmp_path / "garbage.safetensors"))), tmp_path / "x")


def test_bad_start_keys_are_refused_by_name(first: Path) -> None:
    cases = {
        "is not a .safetensors file": _spec(init="model.pt"),
        "blob:<64 lowercase hex": _spec(init="blob:abc"),
        "not a glob pattern": _spec(trainable=["a b"]),
        "at most 64": _spec(trainable=["x"] * 65),
        "counted for model.trainable": _spec(trainable_parameters=5),
    }
    for message, raw in cases.items():
        with pytest.raises(SpecError, match=message):
            parse_spec(raw)
    with pytest.raises(SpecError, match="'head.\\*' matches no parameter"):
        bind_trainable(parse_spec(_spec(trainable=["head.*"])))
    with pytest.raises(SpecError, match="not counted yet"):
        validate_for_submit(parse_spec(_spec(trainable=["body.2.*"])))
    lying = spec_to_plain(bind_trainable(parse_spec(_spec(trainable=["body.2.*"]))))
    lying["model"]["trainable_parameters"] = 1  # an owner's word against the model
    with pytest.raises(SpecError, match="model.trainable_parameters: the spec says 1"):
        run_job(parse_spec(lying), None, first.parent / "never.safetensors")
