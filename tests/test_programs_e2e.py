"""A user's own PyTorch module through real nodes: exported, submitted with the CLI,
trained by a peer that runs only our interpreter, and bitwise equal to train-local."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from node.localnet import LocalNetwork
from tests.programs.export import export_pair, program_toml
from tests.programs.models import GPT, ResNet
from tests.test_jobs_e2e import _cli, _job

pytestmark = pytest.mark.slow


def test_a_peer_trains_a_program_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner, worker = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    torch.manual_seed(0)
    export_pair(ResNet(width=4), (torch.randn(4, 1, 8, 8),), tmp_path)
    spec = tmp_path / "job.toml"
    spec.write_text(program_toml("resnet", steps=40, top='placement = "auto"'))
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = _job(owner, job_id)
    assert job["state"] == "completed", job["timeline"]
    assert job["worker"] == worker.peer_id
    model = job["spec"]["model"]
    assert model["program"].startswith("blob:") and model["parameters"] > 0
    assert "eval_program" not in model  # folded into the program blob

    weights = tmp_path / "w.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    local = tmp_path / "local.safetensors"
    out = _cli("train-local", str(spec), "--out", str(local))
    assert out.returncode == 0, out.stderr
    assert local.read_bytes() == weights.read_bytes()

    # the weights load into the user's own module
    from safetensors.torch import load_file

    ResNet(width=4).load_state_dict(load_file(weights))


def test_an_elastic_program_job_is_bitwise_equal_to_train_local(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    workers = localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)
    np.random.default_rng(0).integers(0, 64, 6000).astype(np.uint16).tofile(tmp_path / "t.bin")
    torch.manual_seed(0)
    export_pair(GPT(), (torch.randint(0, 64, (4, 16)),), tmp_path)
    spec = tmp_path / "job.toml"
    spec.write_text(
        program_toml(
            "gpt-elastic",
            steps=None,
            source="t.bin",
            data='format = "tokens16"',
            top='mode = "elastic"',
            tail="[elastic]\nworkers = 2\nmin_workers = 2\ninner_steps = 5\nrounds = 2\n",
        )
    )
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = _job(owner, job_id)
    assert job["state"] == "completed", job["timeline"][-5:]
    assert [r["round"] for r in job["rounds"]] == [0, 1]
    assert all(set(r["workers"]) == {w.peer_id for w in workers} for r in job["rounds"])

    weights = tmp_path / "w.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    local = tmp_path / "local.safetensors"
    out = _cli("train-local", str(spec), "--out", str(local))
    assert out.returncode == 0, out.stderr
    assert local.read_bytes() == weights.read_bytes()


def test_a_fine_tune_of_the_head_from_a_first_jobs_weights(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner, worker = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=20)
    torch.manual_seed(0)
    export_pair(ResNet(width=4), (torch.randn(4, 1, 8, 8),), tmp_path)
    first = tmp_path / "first.toml"
    first.write_text(program_toml("first", steps=20, top='placement = "auto"'))
    out = _cli("submit", str(first), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    first_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    urllib.request.urlretrieve(
        f"{owner.api}/api/v1/jobs/{first_id}/weights", tmp_path / "first.safetensors"
    )

    tune = tmp_path / "tune.toml"
    tune.write_text(
        program_toml("tune", steps=20, top='placement = "auto"').replace(
            'eval_program = "model.eval.pt2"',
            'eval_program = "model.eval.pt2"\ninit = "first.safetensors"\ntrainable = ["fc.*"]',
        )
    )
    out = _cli("submit", str(tune), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = _job(owner, job_id)
    assert job["state"] == "completed" and job["worker"] == worker.peer_id
    model = job["spec"]["model"]
    assert model["init"].startswith("blob:") and model["trainable_parameters"] == 8 * 10 + 10

    weights = tmp_path / "w.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    local = tmp_path / "local.safetensors"
    out = _cli("train-local", str(tune), "--out", str(local))
    assert out.returncode == 0, out.stderr
    assert local.read_bytes() == weights.read_bytes()

    from safetensors.torch import load_file

    before, after = load_file(tmp_path / "first.safetensors"), load_file(weights)
    frozen = [n for n, _ in ResNet(width=4).named_parameters() if not n.startswith("fc.")]
    assert all(torch.equal(before[k], after[k]) for k in frozen)  # BatchNorm's statistics move
    assert not torch.equal(before["fc.weight"], after["fc.weight"])


def test_a_sweep_of_a_program_runs_its_trials_on_peers(
    localnet: LocalNetwork, tmp_path: Path
) -> None:
    owner = localnet.add(["--not-accepting"])
    localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)
    torch.manual_seed(0)
    export_pair(ResNet(width=4), (torch.randn(4, 1, 8, 8),), tmp_path)
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
    out = _cli("submit", str(spec), "--wait", "--api", owner.api)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = out.stdout.split("job ", 1)[1].split(" ", 1)[0]
    job = _job(owner, job_id)
    assert job["state"] == "completed", job["timeline"][-5:]
    assert sorted(t["params"]["optim.lr"] for t in job["trials"]) == [0.003, 0.03]
    assert all(t["state"] == "complete" for t in job["trials"])
    weights = tmp_path / "best.safetensors"
    urllib.request.urlretrieve(f"{owner.api}/api/v1/jobs/{job_id}/weights", weights)
    from safetensors.torch import load_file

    ResNet(width=4).load_state_dict(load_file(weights))
