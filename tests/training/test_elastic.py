"""Elastic (DiLoCo) rounds, the training side: the spec, the data slots, the delta file,
and the runner's elastic tasks giving bitwise the weights of train-local's simulation."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from protocol.errors import DecodeError, TooLarge
from protocol.rounds import RoundDelta, decode_round_delta, encode_round_delta
from tests.elastic_tasks import run_task
from training.elastic.rounds import slot_seed
from training.errors import SpecError, TrainingError
from training.evidence.result_check import delta_numel, expected_tensors
from training.model.weights import file_sha256
from training.run.local import train_local
from training.run.runner import RequestError, run_request
from training.spec.examples import elastic_toml
from training.spec.job import parse_spec, spec_to_plain


def _spec(**elastic: object) -> dict:
    raw = tomllib.loads(elastic_toml("el", workers=2, inner_steps=10, rounds=2))
    raw["elastic"].update(elastic)
    return raw


def test_an_elastic_spec_round_trips_with_every_default_written_out() -> None:
    spec = parse_spec(_spec())
    assert spec.mode == "elastic" and spec.elastic is not None
    plain = spec_to_plain(spec)
    assert plain["elastic"]["outer_lr"] == 1.0 and plain["elastic"]["compression"] == "int4"
    assert parse_spec(plain) == spec
    # eager starts are off, and left out so, as specs from before the key read
    assert spec.elastic.overlap == 0.25 and "overlap" not in plain["elastic"]
    assert spec.elastic.takes_weights_at == 3  # of 10 inner steps
    eager = parse_spec(_spec(overlap=1))
    assert spec_to_plain(eager)["elastic"]["overlap"] == 1
    assert parse_spec(spec_to_plain(eager)) == eager
    assert eager.elastic.takes_weights_at == 10  # never: the guess stays


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"elastic": {"workers": 0}}, "elastic.workers"),
        ({"elastic": {"workers": 2, "min_workers": 3}}, "elastic.min_workers"),
        ({"elastic": {"compression": "fp8"}}, "elastic.compression"),
        ({"elastic": {"overlap": 1.5}}, "elastic.overlap"),
        ({"elastic": {"outer_momentum": 1.0}}, "elastic.outer_momentum"),
        ({"elastic": {"round_timeout_s": 3}}, "elastic.round_timeout_s"),
        ({"elastic": {"inner_step": 5}}, "elastic.inner_step is not a known key"),
        ({"optim": {"steps": 100}}, "optim.steps: an elastic job trains"),
        ({"optim": {"epochs": 2}}, "optim.epochs"),
        ({"optim": {"schedule": "cosine"}}, "optim.schedule"),
    ],
)
def test_bad_elastic_values_name_the_key(change: dict, message: str) -> None:
    raw = _spec()
    for table, values in change.items():
        raw[table].update(values)
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        parse_spec(raw)


def test_an_elastic_table_needs_mode_elastic() -> None:
    raw = _spec()
    raw["mode"] = "single"
    raw["optim"]["steps"] = 10
    with pytest.raises(SpecError, match='elastic: this table is for mode = "elastic"'):
        parse_spec(raw)


def test_slots_draw_different_data_and_peers_do_not_matter() -> None:
    seeds = {slot_seed(0, s, r) for s in range(8) for r in range(8)}
    assert len(seeds) == 64 and all(0 <= x < 2**63 for x in seeds)
    assert slot_seed(5, 1, 2) == slot_seed(5, 1, 2) != slot_seed(6, 1, 2)


def test_train_local_simulates_the_rounds_deterministically(tmp_path: Path) -> None:
    spec = parse_spec(_spec())
    first = train_local(spec, tmp_path / "a.safetensors")
    second = train_local(spec, tmp_path / "b.safetensors")
    assert first["weights_sha256"] == second["weights_sha256"]
    rounds = first["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[-1]["val_loss"] < rounds[0]["val_loss"]
    assert all(r["bytes_in"] > 0 for r in rounds)


@pytest.mark.parametrize(
    ("compression", "fraction", "overlap"),
    [("int8", 1 / 3, 0.25), ("int4", 1 / 6, 0.25), ("int4", 1 / 6, 1.0), ("int4", 1 / 6, 0.0)],
)
def test_the_runners_elastic_tasks_give_the_simulations_weights_bitwise(
    tmp_path: Path, compression: str, fraction: float, overlap: float
) -> None:
    """The network path's arithmetic, step by step through runner requests (as on the
    owner and on each worker), against train-local's simulation. With `overlap` 0
    each share starts from its round's weights; else from round 1 on eagerly, from
    the round before's weights and its slot's delta of that round, and (below 1)
    takes its round's weights after a quarter of its steps: slot 0 rebuilds them
    from the ones before and the owner's quantized update, slot 1 is handed them
    whole. Without overlap slot 0 rebuilds the weights it starts from, slot 1 (a
    newcomer) fetches them whole."""
    spec = spec_to_plain(parse_spec(_spec(compression=compression, rounds=3, overlap=overlap)))
    eager, takes = overlap > 0, 0 < overlap < 1
    expected = train_local(parse_spec(spec), tmp_path / "sim.safetensors")["weights_sha256"]
    job = "ab" * 8
    init = run_task(tmp_path, spec, "init", "elastic_init", {})
    # what the owner checks deltas and spot checks against, without building the model:
    # read from the weights just written, they are what a build on the meta device
    # counts (`__wrapped__`: past the memo, which the init's own answer fills)
    assert init["delta_numel"] == delta_numel(spec)
    meta_built = expected_tensors.__wrapped__(spec)  # type: ignore[attr-defined]
    assert {n: (tuple(s), d) for n, (s, d) in init["tensors"].items()} == meta_built
    weights = [init["folder"] / "out.bin"]  # each round's global weights
    blobs = {init["weights_sha256"]: weights[0]}
    states: dict[int, Path] = {}
    momentum, deltas = "", []
    way_down: dict[int, dict] = {}  # round q -> how its weights come from round q - 1's
    for r in range(3):
        previous, deltas = deltas, []
        for slot in range(2):
            start = {"weights": file_sha256(weights[r])}
            if eager and r >= 1:  # from the weights before the outer step, and its own delta
                start = {"weights": file_sha256(weights[r - 1]), "start_delta": previous[slot]}
            rebuilds = slot == 0 and not takes and r >= (2 if eager else 1)
            held = r - 1 if eager else r  # the round whose weights the share starts from
            if takes and r >= 1:  # told where the round's weights are, as the worker is
                notice = tmp_path / f"r{r}s{slot}" / "takes.json"
                notice.parent.mkdir()
                whole = {"weights": str(weights[r])}
                rebuilt = {"update": str(blobs[way_down[r]["update"]])}
                told = {"weights_sha256": file_sha256(weights[r]), **(whole if slot else rebuilt)}
                notice.write_text(json.dumps(told))
                start |= {"takes": str(notice), "takes_out": "taken.safetensors"}
            share = run_task(
                tmp_path,
                spec,
                f"r{r}s{slot}",
                "elastic_inner",
                blobs,
                job_id=job,
                round=r,
                slot=slot,
                kept=states.get(slot),
                state_out="state.safetensors",
                **start,
                **(way_down[held] if rebuilds else {}),
            )
            if rebuilds:
                rebuilt = share["folder"] / "weights.safetensors"
                assert file_sha256(rebuilt) == file_sha256(weights[held])
            if takes and r >= 1:
                taken = share["folder"] / "taken.safetensors"
                assert file_sha256(taken) == file_sha256(weights[r])
            states[slot] = share["folder"] / "state.safetensors"
            blobs[share["weights_sha256"]] = share["folder"] / "out.bin"
            deltas.append(share["weights_sha256"])
        bases = [file_sha256(weights[max(0, r - 1) if eager and not takes else r])] * 2
        previous_momentum = momentum
        outer = run_task(
            tmp_path,
            spec,
            f"outer{r}",
            "elastic_outer",
            blobs,
            job_id=job,
            round=r,
            weights=file_sha256(weights[r]),
            momentum=momentum,
            deltas=deltas,
            bases=bases,
            momentum_out="momentum.safetensors",
            update_out="update.bin",
        )
        base = file_sha256(weights[r])
        weights.append(outer["folder"] / "out.bin")
        blobs[outer["weights_sha256"]] = weights[-1]
        momentum = outer["momentum_sha256"]
        blobs[momentum] = outer["folder"] / "momentum.safetensors"
        update = outer["folder"] / "update.bin"
        blobs[outer["update_sha256"]] = update
        assert update.stat().st_size < weights[-1].stat().st_size * fraction  # codes, scales
        way_down[r + 1] = {
            "base": base,
            "update": outer["update_sha256"],
            "weights_out": "weights.safetensors",
        }
        assert "val_loss" in outer["metrics"]
        # the owner's way: the outer step without its validation, then the validation
        # on its own while the next round trains: the same weights, the same figures
        quick = run_task(tmp_path, spec, f"quick{r}", "elastic_outer", blobs, job_id=job, round=r,
                        weights=base, momentum=previous_momentum, deltas=deltas, bases=bases,
                        momentum_out="momentum.safetensors", update_out="update.bin",
                        validate=False)  # fmt: skip
        assert quick["metrics"] == {} and quick["weights_sha256"] == outer["weights_sha256"]
        checked = run_task(tmp_path, spec, f"validate{r}", "elastic_validate", blobs, job_id=job,
                          round=r, weights=outer["weights_sha256"])  # fmt: skip
        assert checked["metrics"] == outer["metrics"]
    assert file_sha256(weights[-1]) == expected
    # an update that does not give the round's weights, or applied to other weights,
    # is refused by name, and nothing is rebuilt
    wrong = [
        ({**way_down[3], "base": init["weights_sha256"]}, "RoundUpdate.base_sha256"),
        (way_down[3], "RoundUpdate.weights_sha256"),
    ]
    blobs[init["weights_sha256"]] = init["folder"] / "out.bin"
    for n, (given, message) in enumerate(wrong):
        with pytest.raises(SpecError, match=f"request.elastic.update: {message}"):
            run_task(tmp_path, spec, f"bad{n}", "elastic_inner", blobs, job_id=job, round=3,
                    slot=0, weights="f" * 64, state_out="state.safetensors", **given)  # fmt: skip
        assert not (tmp_path / f"bad{n}" / "weights.safetensors").exists()
    # an eager start from a delta of another slot, or of a round other than the one
    # before, is refused by name
    told = {"takes": str(tmp_path / "eager{n}" / "takes.json"), "takes_out": "t"} if takes else {}
    for n, (slot, round_) in enumerate([(1, 3), (0, 2)]):
        with pytest.raises(TrainingError, match="the share's start delta: RoundDelta"):
            run_task(tmp_path, spec, f"eager{n}", "elastic_inner", blobs, job_id=job,
                    round=round_, slot=slot, weights=file_sha256(weights[2]),
                    start_delta=deltas[0], state_out="state.safetensors",
                    **{k: v.format(n=n) for k, v in told.items()})  # fmt: skip
    # and a share that takes the round's weights exactly when the job says so
    wrong = {} if takes else {"takes": str(tmp_path / "eager9" / "takes.json"), "takes_out": "t"}
    with pytest.raises(SpecError, match="request.elastic.takes: exactly an eager share"):
        run_task(tmp_path, spec, "eager9", "elastic_inner", blobs, job_id=job, round=3, slot=0,
                weights=file_sha256(weights[2]), start_delta=deltas[0],
                state_out="state.safetensors", **wrong)  # fmt: skip


@pytest.mark.parametrize(
    ("task", "fields", "message"),
    [
        ("elastic_outer", {"validate": "no"}, "request.elastic.validate must be"),
        ("elastic_outer", {"bases": ["a" * 64] * 2}, "request.elastic.bases must name one"),
        ("elastic_outer", {"bases": ["not a sha"]}, "request.elastic.bases must name one"),
        ("elastic_validate", {"slot": 0}, "request.elastic.slot is not a known key"),
        ("elastic_validate", {"weights": "f" * 64}, "which request.blobs lacks"),
    ],
)
def test_a_bad_outer_or_validation_request_is_refused_by_name(
    tmp_path: Path, task: str, fields: dict, message: str
) -> None:
    """The owner's `validate` switch and `bases`, and its `elastic_validate` task: a
    wrong type, a base for each delta missing, an unknown key or weights it was not
    given are refused, and nothing is written."""
    spec = spec_to_plain(parse_spec(_spec()))
    init = run_task(tmp_path, spec, "init", "elastic_init", {})
    blobs = {init["weights_sha256"]: init["folder"] / "out.bin"}
    elastic = {"job_id": "ab" * 8, "round": 0, "weights": init["weights_sha256"]}
    if task == "elastic_outer":
        elastic.update(deltas=["e" * 64], momentum_out="momentum.safetensors")
    with pytest.raises((RequestError, SpecError), match=message):
        run_task(tmp_path, spec, "bad", task, blobs, **{**elastic, **fields})
    assert not (tmp_path / "bad" / "out.bin").exists()
    assert not (tmp_path / "bad" / "momentum.safetensors").exists()


def _share(tmp_path: Path, spec: dict, name: str, blobs: dict, **kwargs: object) -> dict:
    return run_task(
        tmp_path,
        spec,
        name,
        "elastic_inner",
        blobs,
        job_id="ab" * 8,
        state_out="state.safetensors",
        **kwargs,
    )


@pytest.mark.parametrize("overlap", [0.25, 1.0])
def test_a_share_replays_bitwise_from_the_rounds_weights_and_its_kept_state(
    tmp_path: Path, overlap: float
) -> None:
    """A share's checkpoints (its H steps in one segment, from the global weights and
    the inner state the worker kept) replay to the worker's chain, and its last one
    rebuilds the delta: fetched, or as the replay ends on it. An eager share's replay
    starts where it did, and takes the round's weights where it did (`overlap` below
    1: after 3 of its 12 steps)."""
    raw = _spec(inner_steps=12, overlap=overlap) | {"trust": {"checkpoints": 4}}
    spec = spec_to_plain(parse_spec(raw))
    init = run_task(tmp_path, spec, "init", "elastic_init", {})
    weights = init["folder"] / "out.bin"
    sha = file_sha256(weights)
    blobs = {sha: weights}
    first = _share(tmp_path, spec, "r0", blobs, round=0, slot=1, weights=sha, checkpoints=True)
    kept = first["folder"] / "state.safetensors"
    plain = _share(tmp_path, spec, "r1", blobs, round=1, slot=1, weights=sha, kept=kept)
    share = _share(
        tmp_path, spec, "r1c", blobs, round=1, slot=1, weights=sha, kept=kept, checkpoints=True
    )
    assert share["weights_sha256"] == plain["weights_sha256"]  # evidence changes nothing
    cps = share["checkpoints"]
    assert len(cps) == 2 and "checkpoints" not in plain  # SHARE_SEGMENTS, not 4
    for path in (share["folder"] / "checkpoints").iterdir():
        blobs[file_sha256(path)] = path

    def replay(name: str, slot: int, final: dict, given: dict = blobs) -> dict:
        table = {
            "init": True,
            "init_claimed": cps[0],
            "segments": [{"start": 0, "end": 12, "from": cps[0]}],
            "share": {"job_id": "ab" * 8, "round": 1, "slot": slot, "weights": sha},
            **final,
        }
        return _replay_share(tmp_path / name, spec, given, table)

    honest = replay("check", 1, {"final": cps[-1]})
    assert honest["init_sha256"] == cps[0]
    assert honest["ends"] == cps[1:]
    assert honest["weights_sha256"] == share["weights_sha256"]
    other = replay("other-slot", 0, {"final": cps[-1]})  # another seed: start, batches
    assert other["init_sha256"] != cps[0] and other["ends"] != cps[1:]
    without_last = {k: v for k, v in blobs.items() if k != cps[-1]}
    alone = replay("alone", 1, {"final_replayed": True}, without_last)  # nor fetched
    assert alone["ends"] == cps[1:] and alone["weights_sha256"] == share["weights_sha256"]
    # an eager share: its start is built from the weights and its slot's delta before;
    # the round's weights it takes on its way: others of the same model (another seed)
    blobs[first["weights_sha256"]] = first["folder"] / "out.bin"
    eager = {"weights": sha, "start_delta": first["weights_sha256"]}
    takes = {}
    if overlap < 1:
        other = run_task(tmp_path, spec | {"seed": 7}, "round-weights", "elastic_init", {})
        taken = other["folder"] / "out.bin"
        blobs[other["weights_sha256"]] = taken
        (tmp_path / "r1e").mkdir()
        notice = tmp_path / "r1e" / "takes.json"
        notice.write_text(json.dumps({"weights_sha256": file_sha256(taken), "weights": str(taken)}))
        takes = {"takes": str(notice), "takes_out": "taken.safetensors"}
    ahead = _share(
        tmp_path, spec, "r1e", blobs, round=1, slot=1, kept=kept, checkpoints=True, **eager, **takes
    )
    for path in (ahead["folder"] / "checkpoints").iterdir():
        blobs[file_sha256(path)] = path
    table = {
        "init": True,
        "init_claimed": ahead["checkpoints"][0],
        "segments": [{"start": 0, "end": 12, "from": ahead["checkpoints"][0]}],
        "final_replayed": True,
    }
    took = {"takes": other["weights_sha256"]} if takes else {}
    table["share"] = {
        "job_id": "ab" * 8,
        "round": 1,
        "slot": 1,
        **eager,
        **({} if took else {"takes": sha}),  # the other way round
    }
    with pytest.raises(SpecError, match="request.replay.share.takes: exactly an eager share"):
        _replay_share(tmp_path / "taken-or-not", spec, blobs, table)  # as the job says
    for name, start in (("eager", {**eager, **took}), ("not-eager", {"weights": sha})):
        table["share"] = {"job_id": "ab" * 8, "round": 1, "slot": 1, **start}
        replayed = _replay_share(tmp_path / name, spec, blobs, table)
        same_start = replayed["init_sha256"] == ahead["checkpoints"][0]
        assert same_start == (name != "not-eager"), name  # another start: checkpoint 0 too
        # the segment goes on from the worker's checkpoint 0, not from the weights, and
        # takes the round's weights where the share did
        ends = name == "eager" or not takes
        assert (replayed["ends"] == ahead["checkpoints"][1:]) == ends, name
        assert (replayed["weights_sha256"] == ahead["weights_sha256"]) == (name == "eager"), name


def _replay_share(folder: Path, spec: dict, blobs: dict, table: dict) -> dict:
    folder.mkdir()
    request = {
        "spec": spec,
        "blobs": {sha: str(path) for sha, path in blobs.items()},
        "out": str(folder / "out.bin"),
        "device": "cpu",
        "task": "replay",
        "replay": table,
    }
    return run_request(request, lambda event: None)


def _delta(**changes: object) -> RoundDelta:
    values = np.linspace(-1, 1, 100, dtype="<f4")
    base = RoundDelta("ab" * 8, 3, 1, "c" * 64, 100, "none", values.tobytes(), 10)
    return dataclasses.replace(base, **changes)


def _decode(data: bytes, **expect: object) -> RoundDelta:
    args = {
        "numel": 100,
        "job_id": "ab" * 8,
        "round": 3,
        "base_sha256": "c" * 64,
        "compression": "none",
    } | expect
    return decode_round_delta(data, **args)  # type: ignore[arg-type]


def test_a_delta_file_round_trips() -> None:
    delta = _delta()
    assert _decode(encode_round_delta(delta)) == delta


@pytest.mark.parametrize(
    ("expect", "message"),
    [
        ({"round": 4}, "RoundDelta.round is 3, expected 4"),
        ({"job_id": "cd" * 8}, "RoundDelta.job_id"),
        ({"base_sha256": "d" * 64}, "RoundDelta.base_sha256"),
        ({"compression": "int8"}, "RoundDelta.compression is 'none', expected 'int8'"),
        ({"numel": 99}, "RoundDelta.numel is 100; this model has 99|too large|exceeds"),
    ],
)
def test_a_delta_for_another_round_job_start_or_model_is_refused(
    expect: dict, message: str
) -> None:
    with pytest.raises((DecodeError, TooLarge), match=message):
        _decode(encode_round_delta(_delta()), **expect)


def test_a_delta_holding_nan_or_the_wrong_size_is_refused() -> None:
    bad = np.full(100, np.nan, dtype="<f4").tobytes()
    with pytest.raises(DecodeError, match="NaN or Inf"):
        _decode(encode_round_delta(_delta(tensor=bad)))
    with pytest.raises(DecodeError, match="must hold 100 float32 values"):
        encode_round_delta(_delta(tensor=b"\0" * 396))
    with pytest.raises(DecodeError, match="not a round delta"):
        _decode(b"\x80")
    from protocol import encode
    from protocol.schema import to_plain

    with pytest.raises(DecodeError, match="only version 1"):  # True == 1, yet not a version
        _decode(encode({"t": RoundDelta.TYPE, "v": True, **to_plain(_delta())}))


def test_the_adaptive_deadline_follows_applied_shares_not_dropped_stragglers() -> None:
    import time
    from types import SimpleNamespace

    import sqlite_utils

    from node.work.jobs import JobStore
    from node.work.owner.modes import (
        ADAPTIVE_FACTOR,
        FIRST_ROUND_TIMEOUT_S,
        ElasticRounds,
        OwnerParts,
    )

    jobs = JobStore(sqlite_utils.Database(memory=True))
    ctx = SimpleNamespace(jobs=jobs)
    rounds = ElasticRounds(OwnerParts(ctx, None, None, lambda **kw: {}, None, lambda: None))  # type: ignore[arg-type]
    job = jobs.create("el", {"elastic": {"round_timeout_s": 0.0}}, "auto", {}, [])

    def ends_in(seconds: float) -> float:
        return rounds._deadline(job) - time.time() - seconds

    assert abs(ends_in(FIRST_ROUND_TIMEOUT_S)) < 5  # no round closed yet
    rounds.store.open(job.id, 0, "a" * 64, "", time.time() + 600)
    rounds.store.update(job.id, 0, "open", state="closed")
    for peer, state, took in (("fast", "done", 30.0), ("slow", "done", 40.0),
                              ("straggler", "expired", 600.0)):  # fmt: skip
        unit = jobs.add_unit(job.id, peer, 10, round_=0, slot=0)
        jobs.unit_transition(unit.unit_id, ("offered",), state="running")
        jobs.unit_transition(unit.unit_id, ("running",), state=state,
                             ended_at=unit.started_at + took)  # fmt: skip
    assert abs(ends_in(ADAPTIVE_FACTOR * 40.0)) < 5


def test_a_share_still_live_at_its_rounds_close_is_told_it_came_late() -> None:
    from types import SimpleNamespace

    import sqlite_utils

    from node.work.jobs import JobStore
    from node.work.owner import Leases, round_closed_reason

    jobs = JobStore(sqlite_utils.Database(memory=True))
    leases = Leases(SimpleNamespace(jobs=jobs), None, None)  # type: ignore[arg-type]
    job = jobs.create("el", {}, "auto", {}, [])
    late, vanished = (jobs.add_unit(job.id, "peer", 10, round_=3, slot=s) for s in (0, 1))
    jobs.unit_transition(late.unit_id, ("offered",), state="expired", reason=round_closed_reason(3))
    jobs.unit_transition(vanished.unit_id, ("offered",), state="expired", reason="worker vanished")
    assert leases.active_unit("peer", job.id, late.unit_id) == (
        None,
        "round 3 closed before its delta came",
    )
    assert leases.active_unit("peer", job.id, vanished.unit_id)[1] == (
        "its lease expired and it was re-offered"
    )
