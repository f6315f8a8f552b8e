"""A user's own PyTorch module through real nodes: exported, submitted with the CLI,
trained by peers that run only our interpreter, and bitwise equal to train-local; in
single, elastic and sweep mode, and as a fine-tune of a first job's weights."""

from __future__ import annotations

import sqlite3
import urllib.request
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from node.demo.localnet import LocalNetwork, LocalNode
from tests.e2e.test_jobs_e2e import _cli, _job
from tests.programs.export import export_pair, program_toml
from tests.programs.models import GPT, ResNet
from training.model.weights import file_sha256
from training.spec.shards import shards_of_slot

pytestmark = pytest.mark.slow


def _completed(owner: LocalNode, spec: Path) -> dict:
    """`meshminer submit SPEC --wait` on the owner; the job, which must have completed."""
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job = _job(owner, out.stdout.split("job ", 1)[1].split(" ", 1)[0])
    assert job["state"] == "completed", job["timeline"][-5:]
    return job


def _weights(owner: LocalNode, job: dict, path: Path) -> Path:
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job['id']}/weights", path)
    return path


def _as_train_local(owner: LocalNode, job: dict, spec: Path) -> Path:
    """The job's weights, asserted byte-equal to `meshminer train-local` of its spec."""
    weights = _weights(owner, job, spec.with_suffix(".network.safetensors"))
    local = spec.with_suffix(".local.safetensors")
    out = _cli("train-local", str(spec), "--out", str(local))
    assert out.returncode == 0, out.stderr
    assert local.read_bytes() == weights.read_bytes()
    return weights


def _resnet(folder: Path) -> None:
    torch.manual_seed(0)
    export_pair(ResNet(width=4), (torch.randn(4, 1, 8, 8),), folder)


# the ResNet's BatchNorm buffers make the network's bitwise case; the UNet block's
# operators are held to eager in one process (tests/training/test_programs.py)
@pytest.mark.parametrize("make", [ResNet], ids=["resnet"])
def test_a_peer_trains_a_program_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path, make: type[torch.nn.Module]
) -> None:
    owner, worker = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    torch.manual_seed(0)
    export_pair(make(width=4), (torch.randn(4, 1, 8, 8),), tmp_path)
    spec = tmp_path / "job.toml"
    spec.write_text(program_toml("program", steps=40, top='placement = "auto"'))
    job = _completed(owner, spec)
    assert job["worker"] == worker.peer_id
    model = job["spec"]["model"]
    assert model["program"].startswith("blob:") and model["parameters"] > 0
    assert "eval_program" not in model  # folded into the program blob
    weights = _as_train_local(owner, job, spec)
    make(width=4).load_state_dict(load_file(weights))  # the user's own module takes them


def test_an_elastic_program_job_on_shards_is_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    """Each worker fetches only its slot's shards of the data (`data.shards`)."""
    owner = localnet.add(["--not-accepting"])
    workers = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)
    rng = np.random.default_rng(0)
    files = [tmp_path / f"part-{k}.bin" for k in range(4)]
    for file in files:
        rng.integers(0, 64, 1500).astype(np.uint16).tofile(file)
    torch.manual_seed(0)
    export_pair(GPT(), (torch.randint(0, 64, (4, 16)),), tmp_path)
    spec = tmp_path / "job.toml"
    spec.write_text(
        program_toml(
            "gpt-elastic",
            steps=None,
            shards=[f.name for f in files],
            data='format = "tokens16"\nvocab_size = 64',
            top='mode = "elastic"',
            tail="[elastic]\nworkers = 2\nmin_workers = 2\ninner_steps = 5\nrounds = 2\n",
        )
    )
    job = _completed(owner, spec)
    assert [r["round"] for r in job["rounds"]] == [0, 1]
    assert all(set(r["workers"]) == {w.peer_id for w in workers} for r in job["rounds"])
    shards = [s.removeprefix("blob:") for s in job["spec"]["data"]["shards"]]
    assert shards == [file_sha256(f) for f in files]
    with closing(sqlite3.connect(owner.data_dir / "node.db")) as db:
        slots = dict(db.execute("SELECT worker, slot FROM units WHERE job_id = ?", [job["id"]]))
    assert sorted(slots.values()) == [0, 1]  # fixed membership: each kept its slot
    for worker in workers:  # its blob store: of the data, its slot's shards and no more
        blobs = worker.data_dir / "blobs"
        held = {k for k, sha in enumerate(shards) if (blobs / sha[:2] / sha).exists()}
        assert held == set(shards_of_slot(4, 2, slots[worker.peer_id])), held
    _as_train_local(owner, job, spec)


def test_a_fine_tune_of_the_head_from_a_first_jobs_weights(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner, worker = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    _resnet(tmp_path)
    first = tmp_path / "first.toml"
    first.write_text(program_toml("first", steps=20, top='placement = "auto"'))
    start = _weights(owner, _completed(owner, first), tmp_path / "first.safetensors")

    tune = tmp_path / "tune.toml"
    tune.write_text(
        program_toml("tune", steps=20, top='placement = "auto"').replace(
            'eval_program = "model.eval.pt2"',
            'eval_program = "model.eval.pt2"\ninit = "first.safetensors"\ntrainable = ["fc.*"]',
        )
    )
    job = _completed(owner, tune)
    assert job["worker"] == worker.peer_id
    model = job["spec"]["model"]
    assert model["init"].startswith("blob:") and model["trainable_parameters"] == 8 * 10 + 10
    weights = _as_train_local(owner, job, tune)
    before, after = load_file(start), load_file(weights)
    frozen = [n for n, _ in ResNet(width=4).named_parameters() if not n.startswith("fc.")]
    assert all(torch.equal(before[k], after[k]) for k in frozen)  # BatchNorm's statistics move
    assert not torch.equal(before["fc.weight"], after["fc.weight"])


def test_a_sweep_of_a_program_runs_its_trials_on_peers(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)
    _resnet(tmp_path)
    spec = tmp_path / "sweep.toml"
    spec.write_text(
        program_toml(
            "sweep",
            steps=20,
            top='mode = "sweep"',
            tail=(
                '[sweep]\ntrials = 2\nparallel = 2\nsampler = "grid"\nreport_every = 10\n'
                '[sweep.space]\n"optim.lr" = { choices = [0.003, 0.03] }\n'
            ),
        )
    )
    job = _completed(owner, spec)
    assert sorted(t["params"]["optim.lr"] for t in job["trials"]) == [0.003, 0.03]
    assert all(t["state"] == "complete" for t in job["trials"])
    best = _weights(owner, job, tmp_path / "best.safetensors")
    ResNet(width=4).load_state_dict(load_file(best))
