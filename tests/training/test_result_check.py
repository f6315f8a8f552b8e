"""A worker's weights are checked against the job's model plan before the owner
accepts them: header in the daemon (bounded), values in a subprocess."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import trio
from factories import DIGITS_PLAIN
from safetensors.numpy import save

from training.evidence.result_check import (
    MAX_HEADER_BYTES,
    WeightsRejected,
    check_weights_header,
    check_weights_values,
    delta_numel,
    expected_tensors,
    max_weights_bytes,
    remember_shapes,
)

EXPECTED = expected_tensors(DIGITS_PLAIN)


def _honest(scale: float = 0.01) -> dict[str, np.ndarray]:
    return {n: np.full(shape, scale, np.float32) for n, (shape, _) in EXPECTED.items()}


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "w.safetensors"
    path.write_bytes(data)
    return path


def test_the_plan_names_the_models_tensors() -> None:
    assert EXPECTED == {
        "body.0.weight": ((32, 64), "F32"),
        "body.0.bias": ((32,), "F32"),
        "body.2.weight": ((10, 32), "F32"),
        "body.2.bias": ((10,), "F32"),
    }
    data = sum(4 * int(np.prod(shape)) for shape, _ in EXPECTED.values())
    assert max_weights_bytes(EXPECTED) == 8 + MAX_HEADER_BYTES + data


@pytest.mark.process
def test_the_shapes_a_runner_counted_are_taken_without_building_the_model() -> None:
    """The owner's round-0 runner reports the model's shapes; the daemon keeps them
    (building on the meta device would import torch._dynamo in the daemon)."""
    spec = {**DIGITS_PLAIN, "name": "counted-elsewhere"}
    tensors = {"w": [[3, 2], "F32"], "steps": [[], "I64"]}
    remember_shapes(spec, None, {"tensors": tensors, "delta_numel": 6})
    assert expected_tensors(spec) == {"w": ((3, 2), "F32"), "steps": ((), "I64")}
    assert delta_numel(spec) == 6
    assert delta_numel(spec, "/other/data") == delta_numel(DIGITS_PLAIN)  # built: its own


@pytest.mark.parametrize(
    "counted",
    [
        {"tensors": {"w": [[3, 2], "F32"]}},
        {"tensors": {"w": [[3, 2], "F32"]}, "delta_numel": 7},
        {"tensors": {"w": [[3, -2], "F32"]}, "delta_numel": 0},
        {"tensors": {"w": [[3, 2], "complex"]}, "delta_numel": 6},
        {"tensors": {"w": [3, 2]}, "delta_numel": 6},
        {"tensors": [["w", [3, 2], "F32"]], "delta_numel": 6},
        {"tensors": {"w": [[3, 2], "F32"]}, "delta_numel": True},
    ],
)
def test_malformed_shapes_from_a_runner_are_refused_and_nothing_kept(counted: dict) -> None:
    spec = {**DIGITS_PLAIN, "name": "counted-badly"}
    with pytest.raises(ValueError, match="the model's shapes"):
        remember_shapes(spec, None, counted)
    assert expected_tensors(spec) == EXPECTED  # built, as without the runner's answer


def test_real_trained_weights_pass(tmp_path: Path) -> None:
    from training.run.local import train_local
    from training.spec.job import parse_spec

    out = tmp_path / "trained.safetensors"
    train_local(parse_spec({**DIGITS_PLAIN, "optim": {**DIGITS_PLAIN["optim"], "steps": 3}}), out)
    check_weights_header(out, EXPECTED)
    trio.run(check_weights_values, out)


def _changed(**changes) -> dict[str, np.ndarray]:
    tensors = _honest()
    for name, value in changes.items():
        if value is None:
            tensors.pop(name.replace("__", "."))
        else:
            tensors[name.replace("__", ".")] = value
    return tensors


@pytest.mark.parametrize(
    "tensors,message",
    [
        ({"w": np.arange(8, dtype=np.float32)}, "tensor names differ"),
        (_changed(body__0__bias=None), "missing ['body.0.bias']"),
        (_changed(extra=np.zeros(1, np.float32)), "unexpected ['extra']"),
        (_changed(body__0__bias=np.zeros(33, np.float32)), "expected F32 [32], found F32 [33]"),
        (_changed(body__0__bias=np.zeros(32, np.float64)), "expected F32 [32], found F64 [32]"),
    ],
    ids=["another model", "missing", "extra", "shape", "dtype"],
)
def test_weights_of_another_shape_are_rejected(tmp_path: Path, tensors, message: str) -> None:
    with pytest.raises(WeightsRejected) as err:
        check_weights_header(_file(tmp_path, save(tensors)), EXPECTED)
    assert message in str(err.value)


def _header(length: int, body: bytes = b"") -> bytes:
    return struct.pack("<Q", length) + body


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "shorter than 8 bytes"),
        (pickle.dumps({"w": [0.0]}), "header length"),
        (_header(100 << 20), "header length"),
        (_header(4, b"{]]]"), "header:"),
        (_header(2, b"[]"), "not a map"),
        (save(_honest())[:-4], "do not exactly fill"),
        (save(_honest()) + b"\0" * 4, "do not exactly fill"),
    ],
    ids=["empty", "pickle", "100 MB header", "not json", "not a map", "truncated", "padded"],
)
def test_files_that_are_not_consistent_safetensors_are_rejected(
    tmp_path: Path, data: bytes, message: str
) -> None:
    with pytest.raises(WeightsRejected) as err:
        check_weights_header(_file(tmp_path, data), EXPECTED)
    assert message in str(err.value)


def test_lying_offsets_are_rejected(tmp_path: Path) -> None:
    good = save(_honest())
    (length,) = struct.unpack("<Q", good[:8])
    header = json.loads(good[8 : 8 + length])
    header["body.0.bias"]["data_offsets"][1] += 4
    text = json.dumps(header).encode()
    with pytest.raises(WeightsRejected, match="inconsistent|offsets"):
        check_weights_header(
            _file(tmp_path, _header(len(text), text) + good[8 + length :]), EXPECTED
        )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.process
def test_non_finite_values_are_rejected_outside_the_daemon(tmp_path: Path, bad: float) -> None:
    tensors = _honest()
    tensors["body.2.weight"][3, 4] = bad
    path = _file(tmp_path, save(tensors))
    check_weights_header(path, EXPECTED)  # the header is fine
    with pytest.raises(WeightsRejected, match="'body.2.weight' holds NaN or Inf"):
        trio.run(check_weights_values, path)
