"""The runner subprocess: JSON-line events, a weights file whose sha256 is reported,
bad requests failing with an error event and nothing written, and bitwise-equal
weights against train_local for the same spec and data bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import msgpack
import pytest

from training.run.local import train_local
from training.run.runner import RequestError, run_request
from training.spec.job import SpecError, load_spec, parse_spec, spec_to_plain, with_blob_source

pytestmark = pytest.mark.process  # each test runs the runner in a subprocess

ROOT = Path(__file__).resolve().parents[2]

CSV_JOB = """
name = "csv-job"
seed = 7
[model]
arch = "mlp"
hidden = [16]
dropout = 0.1
[data]
source = "train.csv"
label = "target"
batch_size = 16
validation = 0.25
[optim]
name = "adam"
lr = 1e-2
steps = 30
schedule = "warmup"
warmup_steps = 5
"""

DIGITS_JOB = """
name = "digits-cnn"
seed = 1
[model]
arch = "cnn"
channels = [4, 8]
[data]
source = "builtin:digits"
batch_size = 32
[optim]
steps = 20
"""


def runner(stdin: bytes) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "training.run.runner"],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    events = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    return proc.returncode, events, proc.stderr.decode()


def write_csv(path: Path) -> None:
    rows = [f"{i % 7},{(i * 3) % 5},{i % 2},{i % 3}" for i in range(80)]
    path.write_text("a,b,c,target\n" + "\n".join(rows) + "\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_runner_on_a_csv_blob_matches_train_local_bitwise(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(CSV_JOB)
    write_csv(tmp_path / "train.csv")
    spec = load_spec(tmp_path / "job.toml")
    local = train_local(spec, tmp_path / "local.safetensors")

    digest = sha256(tmp_path / "train.csv")
    blob = tmp_path / "blobs" / digest
    blob.parent.mkdir()
    blob.write_bytes((tmp_path / "train.csv").read_bytes())
    request = {
        "spec": spec_to_plain(with_blob_source(spec, digest, "csv")),
        "blobs": {digest: str(blob)},
        "out": str(tmp_path / "remote.safetensors"),
        "device": "cpu",
        "gpu_memory_fraction": 0.5,
        "memory_limit_mb": 2048,
    }
    code, events, stderr = runner(msgpack.packb(request))
    assert code == 0, stderr
    assert [e["event"] for e in events][0] == "started" and events[-1]["event"] == "result"
    assert events[0] == {"event": "started", "device": "cpu", "total_steps": 30, "parameters": 115}
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[-1]["step"] == 30 and progress[-1]["samples"] == 30 * 16
    assert set(progress[-1]) == {"event", "step", "total_steps", "loss", "samples_per_s", "samples"}
    result = events[-1]
    assert set(result["metrics"]) == {"train_loss", "val_loss", "val_accuracy"}
    assert result["weights_sha256"] == sha256(tmp_path / "remote.safetensors")
    assert (tmp_path / "remote.safetensors").read_bytes() == (
        tmp_path / "local.safetensors"
    ).read_bytes()
    assert result["weights_sha256"] == local["weights_sha256"]
    assert result["metrics"] == local["metrics"]


def test_runner_on_builtin_digits_matches_train_local_bitwise(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(DIGITS_JOB)
    spec = load_spec(tmp_path / "job.toml")
    local = train_local(spec, tmp_path / "local.safetensors")
    request = {"spec": spec_to_plain(spec), "blobs": {}, "out": str(tmp_path / "w.safetensors")}
    code, events, stderr = runner(msgpack.packb(request))
    assert code == 0, stderr
    assert events[-1]["weights_sha256"] == local["weights_sha256"]
    assert (tmp_path / "w.safetensors").read_bytes() == (
        tmp_path / "local.safetensors"
    ).read_bytes()


def _request(tmp_path: Path, **changes: object) -> dict:
    spec = tomllib.loads(DIGITS_JOB)
    request = {"spec": spec, "blobs": {}, "out": str(tmp_path / "w.safetensors")}
    request.update(changes)
    return request


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [
        (b"\x93garbage", "request: not valid msgpack"),
        (b"\xc1", "request: not valid msgpack"),
        (b"", "request: not valid msgpack"),
        (b"\x00" * (1024 * 1024 + 1), "the request is over 1048576 bytes"),
        (msgpack.packb([1, 2]), "the request must be a msgpack map"),
    ],
)
def test_garbage_and_oversized_stdin_fail_cleanly(
    tmp_path: Path, stdin: bytes, expected: str
) -> None:
    code, events, _ = runner(stdin)
    assert code == 1
    assert events == [{"event": "error", "message": events[0]["message"]}]
    assert expected in events[0]["message"]


def test_invalid_requests_fail_with_an_error_event_and_write_nothing(tmp_path: Path) -> None:
    bad_spec = tomllib.loads(DIGITS_JOB)
    bad_spec["model"]["layers"] = [{"type": "Lambda"}]
    bad_spec["model"]["arch"] = "layers"
    huge = tomllib.loads(DIGITS_JOB)
    huge["model"] = {"arch": "mlp", "hidden": [10**6, 10**6]}
    csv_file = tomllib.loads(CSV_JOB)
    csv_file["data"]["source"] = "/etc/passwd.csv"
    digest = "0" * 64
    (tmp_path / "wrong").write_bytes(b"not the blob")
    blob_spec = tomllib.loads(CSV_JOB)
    blob_spec["data"].update(source=f"blob:{digest}", format="csv")
    cases = [
        (_request(tmp_path, spec=bad_spec), "unknown layer type 'Lambda'"),
        (_request(tmp_path, spec=huge), "parameters is over the limit"),
        (_request(tmp_path, spec=csv_file), "a runner reads data only from blobs"),
        (_request(tmp_path, spec=blob_spec), "which request.blobs lacks"),
        (
            _request(tmp_path, spec=blob_spec, blobs={digest: str(tmp_path / "wrong")}),
            "the file's sha256 does not match",
        ),
        (_request(tmp_path, out="relative.safetensors"), "request.out must be an absolute"),
        (_request(tmp_path, device="tpu"), "request.device must be one of auto, cpu, cuda"),
        (_request(tmp_path, extra=1), "request.extra is not a known key"),
        (_request(tmp_path, gpus=[64]), "request.gpus[0] must be <= 63"),
        (_request(tmp_path, gpus="0,1"), "request.gpus must be a list"),
        (_request(tmp_path, hold={"states": -1}), "request.hold.states must be >= 0"),
        (_request(tmp_path, hold={"bogus": 1}), "request.hold.bogus is not a known key"),
        (_request(tmp_path, resume={"state": digest, "step": 0}), "request.resume.step must be"),
        (_request(tmp_path, resume={"state": digest, "step": 5}), "which request.blobs lacks"),
        (
            _request(tmp_path, task="replay", replay={}, resume={"state": digest, "step": 5}),
            "request.resume is only for the train task",
        ),
        (_request(tmp_path, final_validation="no"), "request.final_validation must be"),
        (
            _request(tmp_path, task="replay", replay={"final_replayed": True}),
            "request.replay.final_replayed: only for a share",
        ),
        (
            _request(tmp_path, task="replay", replay={"final_replayed": "yes"}),
            "request.replay.final_replayed must be",
        ),
    ]
    for request, expected in cases[:4]:
        code, events, _ = runner(msgpack.packb(request))
        assert code == 1 and events[-1]["event"] == "error", events
        assert expected in events[-1]["message"]
    for request, expected in cases:  # in-process: the same checks, as exceptions
        with pytest.raises((RequestError, SpecError), match=None) as info:
            run_request(request, lambda event: None)
        assert expected in str(info.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "wrong"]  # no weights, no temp files


def test_the_memory_limit_binds_and_fails_cleanly(tmp_path: Path) -> None:
    spec = tomllib.loads(DIGITS_JOB)
    spec["model"] = {"arch": "mlp", "hidden": [4096, 4096]}  # 67 MB for one weight matrix
    request = _request(tmp_path, spec=spec, memory_limit_mb=16, device="cpu")
    code, events, _ = runner(msgpack.packb(request))
    assert code == 1 and events[-1]["event"] == "error"
    assert "ran out of memory" in events[-1]["message"]
    assert not (tmp_path / "w.safetensors").exists()


def test_the_model_shapes_task_counts_what_the_owner_checks_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """`model_shapes` answers the owner's `expected_tensors` and `delta_numel` of the
    spec, for a job of any mode, so that the owner's daemon never builds the model."""
    from training.evidence.result_check import delta_numel, expected_tensors

    request = _request(tmp_path, task="model_shapes")
    code, events, err = runner(msgpack.packb(request))
    assert code == 0, err
    result = events[-1]
    assert result["event"] == "result"
    spec = spec_to_plain(parse_spec(tomllib.loads(DIGITS_JOB)))
    expected = expected_tensors(spec)
    assert {n: (tuple(s), d) for n, (s, d) in result["tensors"].items()} == expected
    assert result["delta_numel"] == delta_numel(spec) > 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RequestError, match="request.elastic is only for the elastic tasks"):
        run_request(_request(tmp_path, task="model_shapes", elastic={"round": 0}), print)
