"""Checkpoints as evidence: the runner writes them without changing the training, and
the replay task reproduces every segment bit for bit from the worker's files."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from training.errors import SpecError, TrainingError
from training.evidence.bounds import STEP_RATIO
from training.evidence.steps import checkpoint_steps
from training.model.weights import file_sha256
from training.run.runner import run_request
from training.spec.job import parse_spec, spec_to_plain

OPTIMS = {
    "adam, cosine, dropout": {"name": "adam", "lr": 0.01, "schedule": "cosine", "warmup_steps": 3},
    "sgd with momentum": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
}


def _spec(optim: dict[str, Any], steps: int = 30, checkpoints: int = 7) -> dict[str, Any]:
    return spec_to_plain(
        parse_spec(
            {
                "name": "ck",
                "seed": 5,
                "model": {"arch": "mlp", "hidden": [16], "dropout": 0.1},
                "data": {"source": "builtin:digits"},
                "optim": {**optim, "steps": steps},
                "trust": {"checkpoints": checkpoints},
            }
        )
    )


def _train(
    spec: dict, folder: Path, checkpoints: bool, blobs: dict | None = None, **request: Any
) -> dict[str, Any]:
    """The runner's train task on `spec` into `folder` (`request`: its other keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "weights.safetensors"
    base = {"spec": spec, "blobs": blobs or {}, "out": str(out), "device": "cpu"}
    return run_request(base | {"checkpoints": checkpoints} | request, lambda event: None)


def _replay(spec: dict, folder: Path, blobs: dict[str, str], table: dict) -> dict[str, Any]:
    folder.mkdir()
    request = {
        "spec": spec,
        "blobs": blobs,
        "out": str(folder / "weights.safetensors"),
        "device": "cpu",
        "task": "replay",
        "replay": table,
    }
    return run_request(request, lambda event: None)


def test_checkpoint_steps_cut_a_unit_into_at_most_n_segments() -> None:
    assert checkpoint_steps(30, 7) == [0, 5, 10, 15, 20, 25, 30]
    assert checkpoint_steps(200, 100) == list(range(0, 201, 2))
    assert checkpoint_steps(10, 100) == list(range(11))  # one step a segment
    assert checkpoint_steps(7, 3) == [0, 3, 6, 7]  # the last one shorter
    assert checkpoint_steps(30, 0) == []


@pytest.mark.parametrize("optim", list(OPTIMS.values()), ids=list(OPTIMS))
def test_every_segment_replays_to_the_workers_next_checkpoint(tmp_path: Path, optim) -> None:
    spec = _spec(optim)
    plain = _train(spec, tmp_path / "plain", checkpoints=False)
    worker = _train(spec, tmp_path / "worker", checkpoints=True)
    assert worker["weights_sha256"] == plain["weights_sha256"]  # evidence changes nothing
    files = sorted((tmp_path / "worker" / "checkpoints").iterdir())
    cps = worker["checkpoints"]
    assert [file_sha256(f) for f in files] == cps and len(cps) == 7
    steps = checkpoint_steps(30, 7)
    table = {
        "init": True,
        "segments": [
            {"start": steps[i], "end": steps[i + 1], "from": cps[i]} for i in range(len(steps) - 1)
        ],
        "final": cps[-1],
    }
    blobs = {sha: str(path) for sha, path in zip(cps, files, strict=True)}
    replay = _replay(spec, tmp_path / "owner", blobs, table)
    assert replay["init_sha256"] == cps[0]
    assert replay["ends"] == cps[1:]
    assert replay["weights_sha256"] == worker["weights_sha256"]
    assert replay["metrics"]["val_loss"] == worker["metrics"]["val_loss"]
    assert replay["replayed_steps"] == 30


def test_a_replay_measures_a_claim_in_its_own_last_steps(tmp_path: Path) -> None:
    """`step_ratios`: how many of the replay's own last steps the claimed state is
    away: none for the honest state, one for a worker that stopped a step short."""
    spec = _spec(OPTIMS["adam, cosine, dropout"], steps=20, checkpoints=20)
    worker = _train(spec, tmp_path / "worker", checkpoints=True)
    cps = worker["checkpoints"]  # one a step
    files = sorted((tmp_path / "worker" / "checkpoints").iterdir())
    blobs = {sha: str(path) for sha, path in zip(cps, files, strict=True)}
    segments = [
        {"start": 10, "end": 15, "from": cps[10], "claimed": cps[15]},  # honest
        {"start": 10, "end": 15, "from": cps[10], "claimed": cps[14]},  # a step short
        {"start": 10, "end": 15, "from": cps[10], "claimed": cps[10]},  # nothing trained
    ]
    replay = _replay(spec, tmp_path / "owner", blobs, {"segments": segments})
    honest, short, idle = replay["step_ratios"]
    assert replay["ends"] == [cps[15]] * 3  # splitting the last step off changes nothing
    assert honest == 0.0 and replay["distances"][0] == 0.0
    assert short == pytest.approx(1.0)
    assert idle > 2.0  # five steps' movement, in units of the last one
    assert short > STEP_RATIO


def test_a_replay_refuses_what_does_not_fit(tmp_path: Path) -> None:
    spec = _spec(OPTIMS["sgd with momentum"])
    worker = _train(spec, tmp_path / "worker", checkpoints=True)
    files = sorted((tmp_path / "worker" / "checkpoints").iterdir())
    cps = worker["checkpoints"]
    blobs = {sha: str(path) for sha, path in zip(cps, files, strict=True)}
    cases = [
        ({"segments": [{"start": 0, "end": 99, "from": cps[0]}]}, SpecError, "not within"),
        ({"segments": [{"start": 5, "end": 10, "from": cps[0]}]}, SpecError, "is of step 0"),
        ({"segments": [{"start": 0, "end": 5}]}, SpecError, "from"),
        ({"final": "ab" * 32}, Exception, "request.blobs lacks"),
        ({"segments": "all"}, SpecError, "must be a list"),
    ]
    for i, (table, error, match) in enumerate(cases):
        with pytest.raises(error, match=match):
            _replay(spec, tmp_path / f"bad{i}", blobs, table)
    other = _spec(OPTIMS["adam, cosine, dropout"] | {"name": "adam"}, checkpoints=7)
    other["model"]["hidden"] = [8]  # another model: the worker's state does not fit it
    with pytest.raises(TrainingError, match="does not fit"):
        _replay(other, tmp_path / "other", blobs, {"final": cps[-1]})


def test_the_runner_waits_for_room_past_its_hold_and_writes_the_same_chain(
    tmp_path: Path,
) -> None:
    """A worker deletes each state once it is no longer the newest two (as the owner's
    draws let it go); the runner never has more than `hold.states` on disk, waits
    while it would, and its chain and weights are those of an unbounded run."""
    spec = _spec(OPTIMS["adam, cosine, dropout"], steps=30, checkpoints=30)
    free = _train(spec, tmp_path / "free", checkpoints=True)
    folder = tmp_path / "held"
    (folder / "checkpoints").mkdir(parents=True)
    seen: list[int] = []
    done = threading.Event()

    def worker() -> None:  # keeps the newest two, deletes the rest, checks often
        while not done.is_set():
            files = sorted((folder / "checkpoints").glob("checkpoint-*.safetensors"))
            seen.append(len(files))
            for old in files[:-2]:
                old.unlink()
            time.sleep(0.002)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        held = _train(spec, folder, True, hold={"states": 3, "floor_bytes": 0})
    finally:
        done.set()
        thread.join()
    assert held["checkpoints"] == free["checkpoints"] and len(held["checkpoints"]) == 31
    assert held["weights_sha256"] == free["weights_sha256"]
    assert held["evidence_peak"]["states"] <= 3 and max(seen) <= 3
    assert free["evidence_peak"]["states"] == 31  # unbounded: every state stays


def test_under_the_floor_a_hold_does_not_bound(tmp_path: Path) -> None:
    spec = _spec(OPTIMS["sgd with momentum"], steps=10, checkpoints=10)
    result = _train(spec, tmp_path / "floor", True, hold={"states": 3, "floor_bytes": 1 << 30})
    assert result["evidence_peak"]["states"] == 11  # nobody deletes them: it never waits


def test_a_run_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """Another worker goes on from checkpoint 4 (step 20) of a unit: its chain is the
    rest of the first one's, its weights the same bits, and it trained the 10 steps
    after the state."""
    spec = _spec(OPTIMS["adam, cosine, dropout"], steps=30, checkpoints=7)
    whole = _train(spec, tmp_path / "whole", checkpoints=True)
    files = sorted((tmp_path / "whole" / "checkpoints").iterdir())
    state, sha = files[4], whole["checkpoints"][4]
    folder, blobs = tmp_path / "resumed", {sha: str(state)}
    resumed = _train(spec, folder, True, blobs, resume={"state": sha, "step": 20})
    assert resumed["checkpoints"] == whole["checkpoints"][4:]
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    assert resumed["steps"] == 10
    with pytest.raises(SpecError, match="not 25"):
        _train(spec, folder, True, blobs, resume={"state": sha, "step": 25})


def test_without_the_final_validation_the_weights_are_the_same_and_unevaluated(
    tmp_path: Path,
) -> None:
    """A spot-checked unit's worker skips its own evaluation of the final weights (the
    owner evaluates them): the same bits, no validation figures claimed."""
    spec = _spec(OPTIMS["sgd with momentum"], steps=10, checkpoints=5)
    whole = _train(spec, tmp_path / "whole", checkpoints=False)
    quiet = _train(spec, tmp_path / "quiet", False, final_validation=False)
    assert quiet["weights_sha256"] == whole["weights_sha256"]
    assert "val_loss" in whole["metrics"] and "val_loss" not in quiet["metrics"]
