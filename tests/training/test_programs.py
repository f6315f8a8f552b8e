"""Programs in one process: the interpreter against the eager modules it came from,
train-local of a program spec against the same loop over the eager module, a graph
that returns its own loss, and the rules that tie a spec's figures to its program."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from tests.programs.eager import portable_draws, train_eager
from tests.programs.export import export_pair
from tests.programs.models import GPT, GPTWithLoss, ResNet, UNetBlock
from training.program import (
    ProgramError,
    ProgramModule,
    convert_pt2,
    decode_program,
    encode_program,
    figures,
)
from training.program.job import bind_local, program_of, spec_figures, state_shapes
from training.run.local import train_local
from training.spec.job import SpecError, parse_spec, spec_to_plain


def _ids(g: torch.Generator | None = None, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, 64, (batch, 16), generator=g)


def _images(g: torch.Generator | None = None, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 1, 8, 8, generator=g)


def _labels(g: torch.Generator | None = None, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, 10, (batch,), generator=g)


def _lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


CASES: dict[str, tuple[Callable[[], nn.Module], Callable, Callable, Callable]] = {
    "gpt: sdpa, dropout, tied embeddings": (GPT, _ids, _ids, _lm_loss),
    "resnet: batchnorm, in-place relu, +=": (ResNet, _images, _labels, F.cross_entropy),
    "unet block: conv_transpose, upsample, group norm": (
        UNetBlock,
        _images,
        _labels,
        F.cross_entropy,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_interpreter_trains_bitwise_equal_to_eager(case: str, tmp_path: Path) -> None:
    make, x_of, y_of, loss_fn = CASES[case]
    torch.manual_seed(0)
    eager = make()
    export_pair(eager, (x_of(),), tmp_path)
    program = convert_pt2(tmp_path / "model.pt2", tmp_path / "model.eval.pt2")
    (tmp_path / "p").write_bytes(encode_program(program))
    received = decode_program(tmp_path / "p")  # what a volunteer reads
    assert encode_program(received) == encode_program(program)
    ours = ProgramModule(received)
    assert ours.state_dict().keys() == eager.state_dict().keys()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, ours)]
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        x, y = x_of(g), y_of(g)
        for module, optimizer in zip((eager, ours), optimizers, strict=True):
            torch.manual_seed(100 + step)  # dropout draws the same numbers in both
            with portable_draws():
                loss = loss_fn(module(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    for name, value in eager.state_dict().items():
        assert torch.equal(value, ours.state_dict()[name]), name
    eager.eval()
    ours.eval()
    odd = x_of(g, batch=3)  # the dynamic batch: any size the export allowed
    assert torch.equal(eager(odd), ours(odd))
    make().load_state_dict(ours.state_dict())  # the user's module takes the weights


def _token_spec(folder: Path, optim: dict, **model: str) -> dict:
    """A program spec for the exported pair and the token file `train.bin` in `folder`."""
    return {
        "name": "program",
        "model": {
            "arch": "program",
            "program": str(folder / "model.pt2"),
            "eval_program": str(folder / "model.eval.pt2"),
            **model,
        },
        "data": {"source": str(folder / "train.bin"), "format": "tokens16", "batch_size": 8},
        "optim": optim,
    }


def test_train_local_of_a_program_is_the_eager_module_on_the_same_batches(
    tmp_path: Path,
) -> None:
    ids = np.random.default_rng(0).integers(0, 60, 4000).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    torch.manual_seed(0)
    gpt = GPT()
    export_pair(gpt, (_ids(),), tmp_path)
    spec = _token_spec(tmp_path, {"steps": 12, "lr": 3e-3})
    result = train_local(parse_spec(spec), tmp_path / "w.safetensors")
    assert "val_loss" in result["metrics"]
    ours = load_file(tmp_path / "w.safetensors")
    eager = train_eager(bind_local(parse_spec(spec)), gpt)
    assert ours.keys() == eager.keys()
    assert all(torch.equal(ours[k], eager[k]) for k in ours)
    # twice the same bytes (and a second process would read the same program blob)
    train_local(parse_spec(spec), tmp_path / "again.safetensors")
    again = (tmp_path / "again.safetensors").read_bytes()
    assert again == (tmp_path / "w.safetensors").read_bytes()


def test_a_graph_that_returns_its_loss(tmp_path: Path) -> None:
    ids = np.random.default_rng(1).integers(0, 64, 3000).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    torch.manual_seed(0)
    model = GPTWithLoss()
    export_pair(model, (_ids(), _ids()), tmp_path)
    spec = _token_spec(tmp_path, {"steps": 6}, output="loss")
    result = train_local(parse_spec(spec), tmp_path / "w.safetensors")
    assert result["metrics"]["val_loss"] > 0
    GPTWithLoss().load_state_dict(load_file(tmp_path / "w.safetensors"))
    wrong = {**spec, "model": {**spec["model"], "output": "logits"}}
    with pytest.raises(SpecError, match='needs output = "loss"'):
        train_local(parse_spec(wrong), tmp_path / "x.safetensors")


def test_a_specs_figures_must_be_its_programs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    export_pair(ResNet(width=4), (_images(),), tmp_path)
    spec = parse_spec(
        {
            "name": "r",
            "model": {
                "arch": "program",
                "program": str(tmp_path / "model.pt2"),
                "eval_program": str(tmp_path / "model.eval.pt2"),
            },
            "data": {"source": "builtin:digits"},
            "optim": {"steps": 1},
        }
    )
    bound = bind_local(spec)
    program, found = program_of(bound)
    assert (
        found.parameters
        == sum(p.numel() for p in ResNet(width=4).parameters())
        == bound.model.parameters
    )
    assert found.flops_per_sample > 0 and found.batch is None
    (tmp_path / "program").write_bytes(encode_program(program))
    plain = spec_to_plain(bound)
    lying = {**plain, "model": {**plain["model"], "flops_per_sample": 10 * found.flops_per_sample}}
    lying["model"]["program"] = "blob:" + "ab" * 32  # not cached: read from the file
    with pytest.raises(ProgramError, match="model.flops_per_sample: the spec says"):
        program_of(parse_spec(lying), lambda sha: tmp_path / "program")
    shapes = state_shapes(program)
    assert shapes == {
        k: (tuple(v.shape), "F32" if v.is_floating_point() else "I64")
        for k, v in ResNet(width=4).state_dict().items()
    }
    assert spec_figures(figures(program))["input_shape"] == [1, 8, 8]


def test_a_static_export_fixes_the_batch(tmp_path: Path) -> None:
    ids = np.random.default_rng(2).integers(0, 64, 3000).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    torch.manual_seed(0)
    model = GPT(dropout=0.0)
    for train_mode, name in ((True, "model.pt2"), (False, "model.eval.pt2")):
        model.train(train_mode)
        torch.export.save(torch.export.export(model, (_ids(batch=8),)), tmp_path / name)
    spec = _token_spec(tmp_path, {"steps": 3})  # batch_size 8: the export's
    result = train_local(parse_spec(spec), tmp_path / "w.safetensors")
    assert result["metrics"]["val_loss"] > 0  # evaluated on full batches of 8
    spec["data"]["batch_size"] = 4
    with pytest.raises(SpecError, match="data.batch_size: the program was exported for"):
        train_local(parse_spec(spec), tmp_path / "x.safetensors")


def test_user_figures_and_foreign_files_are_refused() -> None:
    base = {"name": "x", "data": {"source": "builtin:digits"}, "optim": {"steps": 1}}
    with pytest.raises(SpecError, match="computed from the graph"):
        parse_spec({**base, "model": {"arch": "program", "program": "m.pt2", "parameters": 5}})
    with pytest.raises(SpecError, match="not a .pt2 file"):
        parse_spec({**base, "model": {"arch": "program", "program": "model.pt"}})
    with pytest.raises(SpecError, match="blob:<64 lowercase hex"):
        parse_spec({**base, "model": {"arch": "program", "program": "blob:xyz"}})


def test_a_program_file_that_is_not_one_is_refused_by_name(tmp_path: Path) -> None:
    """The volunteer's decoder: every malformed container is a ProgramError that says
    what is wrong (the graphs inside are the hostile-program tests' business)."""
    import json

    from training.model.weights import weights_bytes
    from training.program.program import PROGRAM_FORMAT

    torch.manual_seed(0)
    export_pair(ResNet(width=4), (_images(),), tmp_path)
    program = convert_pt2(tmp_path / "model.pt2", tmp_path / "model.eval.pt2")
    layout = {
        "graphs": program.graphs_json,
        "aliases": program.aliases,
        "persistent": sorted(program.persistent),
    }

    def written(tensors: dict, metadata: dict) -> Path:
        path = tmp_path / f"program-{len(list(tmp_path.glob('program-*')))}"
        path.write_bytes(weights_bytes(tensors, metadata))
        return path

    good = {"format": PROGRAM_FORMAT, "program": json.dumps(layout)}
    extra = {**program.tensors, "stowaway": torch.zeros(1)}
    cases = {
        "not a meshminer.program/1 file": written(program.tensors, {"format": "other"}),
        "graphs are not JSON": written(program.tensors, {**good, "program": "{nope"}),
        "has no graphs": written(program.tensors, {**good, "program": "{}"}),
        "has no state table": written(
            program.tensors, {**good, "program": json.dumps({**layout, "aliases": 3})}
        ),
        "a state name points at a tensor the file lacks": written(
            dict(list(program.tensors.items())[1:]), good
        ),
        "the file holds tensors no state name uses": written(extra, good),
    }
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00" * 7)
    cases["cannot read the program file"] = garbage
    for message, path in cases.items():
        with pytest.raises(ProgramError, match=message):
            decode_program(path)
    decode_program(written(program.tensors, good))  # control: the same file, unbroken
