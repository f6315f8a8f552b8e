"""`RunnerRequest`: the map each task's request gives the runner, key by key."""

from __future__ import annotations

from pathlib import Path

from node.work.run import RunnerRequest, share_request
from protocol.rounds import RoundShare

SPEC = {"name": "j", "requirements": {"gpu": "optional"}}
BLOBS = {"a" * 64: "/data/a"}


def _base(out: Path, **kw) -> RunnerRequest:
    return RunnerRequest.for_spec(
        SPEC, BLOBS, out, gpu_memory_fraction=0.5, memory_limit_mb=1024, **kw
    )


def _plain(out: Path, **extra) -> dict:
    return {
        "spec": SPEC,
        "blobs": BLOBS,
        "out": str(out),
        "device": "auto",
        "gpu_memory_fraction": 0.5,
        "memory_limit_mb": 1024,
        **extra,
    }


def test_a_jobs_training_names_no_task(tmp_path: Path) -> None:
    out = tmp_path / "weights.safetensors"
    assert _base(out).as_plain() == _plain(out)
    assert _base(out, gpus=[1, 3]).as_plain() == _plain(out, gpus=[1, 3])
    assert _base(out).with_checkpoints().as_plain() == _plain(out, checkpoints=True)


def test_a_spec_that_needs_no_gpu_runs_on_the_cpu(tmp_path: Path) -> None:
    spec = {"requirements": {"gpu": "none"}}
    request = RunnerRequest.for_spec(spec, {}, tmp_path, gpu_memory_fraction=1, memory_limit_mb=0)
    assert request.as_plain()["device"] == "cpu"


def test_the_other_tasks_add_their_tables(tmp_path: Path) -> None:
    out = tmp_path / "out.safetensors"
    table = {"segments": [[0, 10]]}
    assert list(_base(out).replaying(table).as_plain()) == [*_plain(out), "task", "replay"]
    assert _base(out).replaying(table).as_plain() == _plain(out, task="replay", replay=table)
    init = _base(out).elastic_task("elastic_init", {})
    assert init.as_plain() == _plain(out, task="elastic_init")  # no files: no table
    outer = _base(out).elastic_task("elastic_outer", {"round": 2})
    assert outer.as_plain() == _plain(out, task="elastic_outer", elastic={"round": 2})


def test_a_rounds_share_keeps_its_evidence(tmp_path: Path) -> None:
    out = tmp_path / "unit" / "weights.safetensors"
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"state")
    share = RoundShare(3, 1, "b" * 64)
    request = share_request(_base(out), "c" * 16, share, kept, out).with_checkpoints()
    elastic = {
        "job_id": "c" * 16,
        "round": 3,
        "slot": 1,
        "weights": "b" * 64,
        "state_out": str(out.parent / "state_out.safetensors"),
        "state_in": str(out.parent / "state_in.safetensors"),
    }
    plain = request.as_plain()
    assert plain == _plain(out, task="elastic_inner", elastic=elastic, checkpoints=True)
    assert list(plain)[-3:] == ["task", "elastic", "checkpoints"]
    assert (out.parent / "state_in.safetensors").read_bytes() == b"state"
