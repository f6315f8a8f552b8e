"""Training never imports torch._dynamo (`training.run.no_dynamo`), and its bits are
those `optimizer.step()` gives: every optimizer, a schedule with warmup, gradient
clipping, bf16, and an elastic job's rounds (our custom ops, the outer step). Nor
does counting a job's tensors on the meta device, as the owner's first runner of an
elastic job does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # fresh interpreters: torch._dynamo is in this one

SCRIPT = r"""
import hashlib, json, sys, tomllib
from pathlib import Path

import training.run.loop
from node.demo.elastic import write_corpus
from training.evidence.result_check import model_shapes
from training.run.local import train_local
from training.spec.examples import char_lm_elastic_toml, digits_toml, elastic_toml
from training.spec.job import parse_spec

out, plain = Path(sys.argv[1]), sys.argv[2] == "plain"
if plain:  # the reference: torch's own step, which imports torch._dynamo
    training.run.loop.optimizer_step = lambda optimizer: optimizer.step()
optims = {
    "adamw-cosine-clip": 'schedule = "cosine"\nwarmup_steps = 3\ngrad_clip = 0.5',
    "adam-bf16": 'name = "adam"\nprecision = "bf16"',
    "sgd-momentum-warmup": 'name = "sgd"\nmomentum = 0.9\nschedule = "warmup"\nwarmup_steps = 4',
}
hashes = {}
for name, extra in optims.items():
    raw = tomllib.loads(digits_toml(steps=12, hidden=(16,), batch_size=32))
    raw["optim"].update(tomllib.loads(extra))
    train_local(parse_spec(raw), out / f"{name}.safetensors")
for compression in ("int4", "none"):
    toml = elastic_toml(workers=2, inner_steps=4, rounds=2, hidden=(16,), compression=compression)
    train_local(parse_spec(tomllib.loads(toml)), out / f"elastic-{compression}.safetensors")
# the owner's count of an elastic transformer's tensors (its init runs torch._refs)
lm = char_lm_elastic_toml(str(write_corpus(out / "corpus.txt")), rounds=1)
shapes = model_shapes(parse_spec(tomllib.loads(lm)), None, None)
assert shapes["delta_numel"] > 0 and "tokens.weight" in shapes["tensors"], shapes
for path in sorted(out.glob("*.safetensors")):
    hashes[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "hashes": hashes}))
"""


def _train(folder: Path, how: str) -> dict:
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), how],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_training_imports_no_dynamo_and_steps_as_torch_does(tmp_path: Path) -> None:
    ours, torchs = _train(tmp_path / "ours", "ours"), _train(tmp_path / "plain", "plain")
    assert not ours["dynamo"], "training imported torch._dynamo (see training/run/no_dynamo.py)"
    assert torchs["dynamo"]  # the reference did take torch's own path
    assert len(ours["hashes"]) == 5
    assert ours["hashes"] == torchs["hashes"]


def test_a_scan_for_wrappers_waits_for_a_module_of_torchs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner forked from a warm server imports a few modules of its own; only a
    module of torch's can bring new wrappers, so only one brings a new scan."""
    import gc
    import types

    from training.run import no_dynamo

    scans: list[int] = []

    def get_objects() -> list:
        scans.append(1)
        return gc.get_objects()

    monkeypatch.setattr(no_dynamo, "gc", types.SimpleNamespace(get_objects=get_objects))
    no_dynamo.skip_dynamo_wrappers()  # up to date with what this process imported
    scans.clear()
    monkeypatch.setitem(sys.modules, "meshminer_plain", types.ModuleType("meshminer_plain"))
    no_dynamo.skip_dynamo_wrappers()
    assert scans == []
    monkeypatch.setitem(sys.modules, "torch._meshminer", types.ModuleType("torch._meshminer"))
    no_dynamo.skip_dynamo_wrappers()
    no_dynamo.skip_dynamo_wrappers()
    assert scans == [1]
