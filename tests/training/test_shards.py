"""Sharded data (`data.shards`), the training side: the spec's rules, which shards a
slot reads, windows that never cross from one shard into the next, and a worker's
runner that holds only its slot's shards training the share bitwise as train-local's
simulation does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol.rounds import encode_round_delta
from training.data.batches import StretchesSplit, WindowSplit
from training.elastic.rounds import SIMULATED_JOB_ID, init_weights
from training.elastic.simulate import train_share
from training.errors import SpecError
from training.model.weights import file_sha256
from training.run.execute import prepare
from training.run.local import train_local
from training.run.runner import RequestError, run_request
from training.spec.job import parse_spec, spec_to_plain, with_blob_shards
from training.spec.shards import shards_of_slot

BAND = 16  # shard k holds only ids k*BAND .. k*BAND+BAND-1, so an id names its shard


def _shards(folder: Path, n: int, length: int = 400) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(n):
        path = folder / f"part-{k:03d}.bin"
        (k * BAND + rng.integers(0, BAND, size=length)).astype(np.uint16).tofile(path)
        paths.append(path)
    return paths


def _raw(shards: list[Path], workers: int = 2, **data: object) -> dict:
    return {
        "name": "sharded",
        "mode": "elastic",
        "seed": 3,
        "model": {"arch": "char_transformer", "layers": 1, "heads": 1, "width": 16, "context": 8},
        "data": {
            "shards": [str(p) for p in shards],
            "format": "tokens16",
            "vocab_size": BAND * len(shards),
            "batch_size": 4,
            **data,
        },
        "optim": {"lr": 0.01},
        "elastic": {"workers": workers, "rounds": 2, "inner_steps": 3},
    }


def _bands(ids: torch.Tensor) -> set[int]:
    return set((ids // BAND).unique().tolist())


def test_a_sharded_spec_round_trips(tmp_path: Path) -> None:
    spec = parse_spec(_raw(_shards(tmp_path, 3)))
    assert len(spec.data.shards) == 3 and spec.data.source == ""
    plain = spec_to_plain(spec)
    assert "source" not in plain["data"] and plain["data"]["shards"][0].endswith("part-000.bin")
    assert parse_spec(plain) == spec
    unsharded = _raw([tmp_path / "part-000.bin"])
    unsharded["data"] = {"source": str(tmp_path / "part-000.bin"), "format": "tokens16"}
    assert "shards" not in spec_to_plain(parse_spec(unsharded))["data"]  # as before shards


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"source": "x.bin"}, "give data.source or data.shards, not both"),
        ({"vocab_size": None}, "data.vocab_size is required with data.shards"),
        ({"shards": ["a.csv"]}, r"data.shards\[0\]: a shard is a .bin file"),
        ({"shards": []}, "data.shards must have 1..64 entries"),
        ({"shards": ["a.bin", "a.bin"]}, "a shard is named twice"),
        ({"format": "csv"}, "data.format must be one of tokens16, tokens32"),
        ({"mode": "single"}, 'data.shards is for mode = "elastic"'),
    ],
)
def test_a_bad_sharded_spec_is_refused_by_name(tmp_path: Path, change: dict, message: str) -> None:
    raw = _raw(_shards(tmp_path, 2))
    if change.get("mode"):
        raw = {**raw, "mode": "single", "optim": {"steps": 3}}
        del raw["elastic"]
    else:
        raw["data"].update(change)
        raw["data"] = {k: v for k, v in raw["data"].items() if v is not None}
    with pytest.raises(SpecError, match=message):
        parse_spec(raw, tmp_path)


def test_slots_read_every_wth_shard_or_share_one_round_robin() -> None:
    assert [shards_of_slot(5, 2, s) for s in range(2)] == [[0, 2, 4], [1, 3]]
    assert [shards_of_slot(2, 4, s) for s in range(4)] == [[0], [1], [0], [1]]
    for n, w in [(7, 3), (64, 5), (3, 3)]:
        picked = [k for s in range(w) for k in shards_of_slot(n, w, s)]
        assert sorted(picked) == list(range(n))  # every shard read, by one slot each


def test_windows_never_cross_from_one_shard_into_the_next() -> None:
    stretches = [k * BAND + torch.randint(0, BAND, (n,)) for k, n in enumerate([30, 9, 51])]
    split = StretchesSplit.of(stretches, context=8)
    assert len(split) == 22 + 1 + 43
    x, y = split.batch(torch.arange(len(split)))
    for row_x, row_y in zip(x, y, strict=True):
        assert len(_bands(torch.cat([row_x, row_y]))) == 1
    assert split.eval_index().tolist() == [0, 8, 16, 22, 23, 31, 39, 47, 55, 63]
    one, plain = StretchesSplit.of(stretches[:1], 8), WindowSplit(stretches[0], 8)
    index = torch.randint(0, len(plain), (40,))
    assert all(torch.equal(a, b) for a, b in zip(one.batch(index), plain.batch(index), strict=True))
    assert torch.equal(one.eval_index(), plain.eval_index())


def test_a_slot_trains_on_its_shards_and_the_owner_validates_on_every_tail(
    tmp_path: Path,
) -> None:
    files = _shards(tmp_path, 4)
    spec = parse_spec(_raw(files))
    owner = prepare(spec, tuple(files))
    slot_1 = prepare(spec, (files[1], files[3]))
    x, _ = slot_1.data.train.batch(torch.arange(len(slot_1.data.train)))
    assert _bands(x) == {1, 3}
    assert len(slot_1.data.train) == 2 * (360 - 8) and len(owner.data.train) == 4 * (360 - 8)
    assert owner.data.val is not None
    x, _ = owner.data.val.batch(owner.data.val.eval_index())
    assert _bands(x) == {0, 1, 2, 3}
    assert slot_1.summary.batch_size == owner.summary.batch_size
    assert slot_1.summary.training_flops == owner.summary.training_flops  # one credit


def test_a_shard_too_short_for_a_batch_is_refused_by_name(tmp_path: Path) -> None:
    files = _shards(tmp_path, 2)
    (np.arange(110) % BAND + BAND).astype(np.uint16).tofile(files[1])
    with pytest.raises(SpecError, match="part-001.bin has 91 training windows; each shard"):
        prepare(parse_spec(_raw(files, batch_size=100)), tuple(files))


def test_a_workers_runner_with_only_its_slots_shards_trains_the_simulations_share(
    tmp_path: Path,
) -> None:
    files = _shards(tmp_path / "data", 4)
    local = parse_spec(_raw(files))
    spec = spec_to_plain(with_blob_shards(local, [file_sha256(f) for f in files]))
    weights = tmp_path / "global-0.safetensors"
    init_weights(prepare(local, tuple(files)), weights)
    simulated = train_share(prepare(local, (files[1], files[3])), tmp_path, weights, 0, 1)
    blobs = {file_sha256(weights): str(weights)}
    blobs |= {file_sha256(f): str(f) for f in (files[1], files[3])}  # what its package named
    (tmp_path / "w").mkdir()
    request = {
        "spec": spec,
        "blobs": blobs,
        "out": str(tmp_path / "w" / "delta.bin"),
        "device": "cpu",
        "task": "elastic_inner",
        "elastic": {
            "job_id": SIMULATED_JOB_ID,
            "round": 0,
            "slot": 1,
            "weights": file_sha256(weights),
            "state_out": str(tmp_path / "w" / "state.safetensors"),
        },
    }
    result = run_request(request, lambda event: None)
    assert (
        result["weights_sha256"] == hashlib.sha256(encode_round_delta(simulated.delta)).hexdigest()
    )
    (tmp_path / "w" / "delta.bin").unlink()
    other_slot = {**request, "elastic": {**request["elastic"], "slot": 0}}
    with pytest.raises(RequestError, match="which request.blobs lacks"):
        run_request(other_slot, lambda event: None)  # slot 0 reads shards 0 and 2
    for bad in ("1", -1, True, None):
        no_slot = {**request, "elastic": {**request["elastic"], "slot": bad}}
        with pytest.raises(RequestError, match="a share's slot must be 0..4095"):
            run_request(no_slot, lambda event: None)
    assert not (tmp_path / "w" / "delta.bin").exists()  # nothing written


def test_train_local_of_a_sharded_job_is_deterministic(tmp_path: Path) -> None:
    spec = parse_spec(_raw(_shards(tmp_path, 3), workers=2))
    first = train_local(spec, tmp_path / "a.safetensors")
    assert (
        train_local(spec, tmp_path / "b.safetensors")["weights_sha256"] == first["weights_sha256"]
    )
    assert len(first["rounds"]) == 2 and "val_loss" in first["metrics"]
