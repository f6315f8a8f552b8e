"""Job spec parsing: the documented example, every error class naming its key path,
the budget refusing huge models fast, and fuzzed input raising only SpecError."""

from __future__ import annotations

import contextlib
import copy
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import encode
from training.budget import MAX_PARAMETERS, validate_for_submit
from training.spec.job import (
    JobSpec,
    SpecError,
    load_spec,
    local_files,
    parse_spec,
    relay_blob_bytes,
    spec_to_plain,
    with_blob_source,
)

EXAMPLE = """\
name = "digits-mlp"
mode = "single"
seed = 0
[model]
arch = "mlp"                  # "mlp" | "cnn" | "char_transformer" | "layers"
hidden = [128, 64]
activation = "relu"
[data]
source = "builtin:digits"     # or a file: "train.csv" (resolved relative to the spec file)
label = "target"              # label column for csv
batch_size = 64
validation = 0.2
[optim]
name = "adamw"
lr = 1e-3
steps = 500
[requirements]
gpu = "preferred"
"""


def example() -> dict:
    return tomllib.loads(EXAMPLE)


def layers_spec(layers: list[dict]) -> dict:
    raw = example()
    raw["model"] = {"arch": "layers", "layers": layers}
    return raw


def error_of(raw: dict) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    return str(info.value)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(EXAMPLE)
    spec = load_spec(path)
    assert isinstance(spec, JobSpec)
    assert spec.name == "digits-mlp" and spec.mode == "single" and spec.seed == 0
    assert spec.model.arch == "mlp" and spec.model.hidden == (128, 64)
    assert spec.data.batch_size == 64 and spec.data.validation == 0.2
    assert spec.optim.name == "adamw" and spec.optim.lr == 1e-3 and spec.optim.steps == 500
    assert spec.requirements.gpu == "preferred" and spec.requirements.max_hours == 1.0
    summary = validate_for_submit(spec, None)
    assert summary.parameters == 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10
    assert summary.task == "classification" and summary.num_samples == 1797
    assert summary.num_val == 359 and summary.total_steps == 500
    assert summary.training_flops == summary.flops_per_sample * 500 * 64 * 3


def test_a_name_is_only_text() -> None:
    raw = example()
    raw["name"] = "<script>alert(1)</script>"
    assert parse_spec(raw).name == "<script>alert(1)</script>"
    raw["name"] = "two\nlines"
    assert "printable" in error_of(raw)
    raw["name"] = "x" * 101
    assert error_of(raw).startswith("name must be 1..100 characters")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: r.update(colour="red"), "colour is not a known key"),
        (lambda r: r["optim"].update(lerning_rate=0.1), "optim.lerning_rate is not a known key"),
        (lambda r: r["model"].update(hiden=[3]), "model.hiden is not a known key"),
        (lambda r: r["optim"].update(lr="fast"), "optim.lr must be a number > 0, got a string"),
        (lambda r: r["optim"].update(lr=-1), "optim.lr must be > 0"),
        (lambda r: r["optim"].update(lr=float("nan")), "optim.lr must be a finite number"),
        (lambda r: r["optim"].update(steps=1.5), "optim.steps must be an integer"),
        (lambda r: r["optim"].update(steps=True), "optim.steps must be an integer"),
        (lambda r: r["model"].update(hidden=[128, -4]), "model.hidden[1] must be > 0, got -4"),
        (lambda r: r["data"].update(batch_size=0), "data.batch_size must be > 0"),
        (lambda r: r["data"].update(validation=0.95), "data.validation must be <= 0.9, got 0.95"),
        (lambda r: r.update(seed=-1), "seed must be >= 0"),
        (lambda r: r.update(mode="turbo"), "mode must be one of single"),
        (lambda r: r.update(mode="sweep"), "sweep.space must be a table of keys to search"),
        (lambda r: r.update(sweep={}), 'sweep: this table is for mode = "sweep"'),
        (lambda r: r["optim"].update(epochs=3), "exactly one of `steps` or `epochs`"),
        (lambda r: r["optim"].pop("steps"), "exactly one of `steps` or `epochs`"),
        (lambda r: r["optim"].update(momentum=0.9), "optim.momentum applies only to sgd"),
        (lambda r: r["optim"].update(warmup_steps=10), "optim.warmup_steps needs schedule"),
        (lambda r: r["requirements"].update(gpu="maybe"), "requirements.gpu must be one of"),
        (lambda r: r["requirements"].update(max_hours=0), "requirements.max_hours must be > 0"),
        (
            lambda r: r["requirements"].update(relay_blob_mb=-1),
            "requirements.relay_blob_mb must be >= 0",
        ),
        (
            lambda r: r["requirements"].update(relay_blob_mb=1.5),
            "requirements.relay_blob_mb must be an integer",
        ),
        (lambda r: r["model"].update(arch="resnet"), "model.arch must be one of mlp, cnn"),
        (lambda r: r["model"].update(activation="swish"), "model.activation must be one of"),
        (lambda r: r.pop("model"), "model.arch is required"),
        (lambda r: r["data"].pop("source"), "data.source is required"),
        (lambda r: r.update(data=[1]), "data must be a table, got a list"),
        (lambda r: r["data"].update(source="builtin:mnist"), "unknown built-in 'builtin:mnist'"),
        (lambda r: r["data"].update(source="blob:abc", format="csv"), "blob:<64 hex digits"),
        (lambda r: r["data"].update(source="blob:" + "a" * 64), "data.format is required"),
        (lambda r: r["data"].update(format="csv"), "data.format is only for blob"),
        (lambda r: r["data"].update(source="https://x.org/a.csv"), "URLs are not fetched"),
        (lambda r: r["data"].update(source="weights.pt"), "never loads pickle"),
        (lambda r: r["data"].update(source="data.pkl"), "never loads pickle"),
        (lambda r: r["data"].update(source="data.xlsx"), "cannot tell the format"),
        (
            lambda r: r["data"].update(source="t.csv", label=None) or r["data"].pop("label"),
            "data.label is required for a csv source",
        ),
        (
            lambda r: r["data"].update(source="builtin:text:a.txt"),
            "char_transformer trains on text",
        ),
        (lambda r: r.update(trust={"checkpoints": 1001}), "trust.checkpoints must be <= 1000"),
        (lambda r: r.update(trust={"spot_check_budget": 2}), "trust.spot_check_budget must be"),
        (lambda r: r.update(trust={"checkpoints": 0}), "set trust.checkpoints"),
        (lambda r: r.update(trust={"replicas": 3}), "trust.replicas must be <= 2"),
        (
            lambda r: r.update(trust={"replicas": 2, "spot_check_budget": 0, "checkpoints": 0}),
            "compared by their checkpoints",
        ),
        (lambda r: r.update(trust={"audit": True}), "trust.audit is not a known key"),
    ],
)
def test_errors_name_the_key_path(edit, expected: str) -> None:
    raw = example()
    edit(raw)
    assert expected in error_of(raw)


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        (
            [{"type": "Linear", "out_features": 10}, {"type": "Softmax2"}],
            "model.layers[1].type: unknown layer type 'Softmax2'; allowed: Linear, Conv1d",
        ),
        (
            [{"type": "Linear", "out_features": 10, "device": 1}],
            "model.layers[0].device is not an allowed argument of Linear",
        ),
        (
            [
                {"type": "ReLU"},
                {"type": "ReLU"},
                {"type": "ReLU"},
                {"type": "Linear", "out_features": 0},
            ],
            "model.layers[3].out_features must be > 0",
        ),
        ([{"type": "Linear"}], "model.layers[0].out_features is required for Linear"),
        (
            [{"type": "Linear", "out_features": "ten"}],
            "model.layers[0].out_features must be an integer",
        ),
        ([{"type": "Dropout", "p": 1.0}], "model.layers[0].p must be < 1, got 1"),
        ([{"out_features": 3}], "model.layers[0].type is required"),
        ([], "model.layers must be a non-empty list"),
        (["Linear"], "model.layers[0] must be a table"),
    ],
)
def test_layer_errors_name_the_layer(layers: list, expected: str) -> None:
    assert expected in error_of(layers_spec(layers))


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        (
            [{"type": "Linear", "in_features": 32, "out_features": 10}],
            "model.layers[0].in_features is 32 but its input gives 64",
        ),
        ([{"type": "Linear", "out_features": 7}], "needs (10,); end with Flatten"),
        (
            [
                {"type": "Conv2d", "out_channels": 4, "kernel_size": 9},
                {"type": "Flatten"},
                {"type": "Linear", "out_features": 10},
            ],
            "model.layers[0]: kernel 9",
        ),
        (
            [
                {"type": "Linear", "out_features": 8},
                {"type": "Embedding", "num_embeddings": 3, "embedding_dim": 2},
            ],
            "model.layers[1]: Embedding must be the first layer",
        ),
        (
            [{"type": "Conv1d", "out_channels": 4, "kernel_size": 3, "groups": 3}],
            "model.layers[0].groups (3) must divide",
        ),
        (
            [{"type": "Flatten", "start_dim": 0}, {"type": "Linear", "out_features": 10}],
            "dims count from 1",
        ),
    ],
)
def test_shape_errors_name_the_layer(layers: list, expected: str) -> None:
    spec = parse_spec(layers_spec(layers))
    with pytest.raises(SpecError) as info:
        validate_for_submit(spec, None)
    assert expected in str(info.value)


def test_a_trillion_parameters_is_refused_fast_with_the_count() -> None:
    raw = example()
    raw["model"]["hidden"] = [1_000_000, 1_000_000]
    begin = time.perf_counter()
    spec = parse_spec(raw)
    with pytest.raises(SpecError) as info:
        validate_for_submit(spec, None)
    elapsed = time.perf_counter() - begin
    assert elapsed < 0.1
    count = 64 * 10**6 + 10**6 + 10**12 + 10**6 + 10**7 + 10
    assert f"{count:,} parameters is over the limit of {MAX_PARAMETERS:,}" in str(info.value)


def test_a_huge_layer_stack_is_refused_without_allocating() -> None:
    layers = [{"type": "Linear", "out_features": 2**24}] * 2 + [
        {"type": "Linear", "out_features": 10}
    ]
    spec = parse_spec(layers_spec(layers))
    begin = time.perf_counter()
    with pytest.raises(SpecError, match="parameters is over the limit"):
        validate_for_submit(spec, None)
    assert time.perf_counter() - begin < 0.1


def test_memory_over_the_limit_is_refused() -> None:
    # few parameters, but a 131080 x 131080 feature map per sample
    layers = [
        {"type": "Conv2d", "out_channels": 1, "kernel_size": 1, "padding": 65536},
        {"type": "MaxPool2d", "kernel_size": 65536},
        {"type": "Flatten"},
        {"type": "Linear", "out_features": 10},
    ]
    with pytest.raises(SpecError, match=r"estimated [\d,.]+ GiB; the limit is 256 GiB"):
        validate_for_submit(parse_spec(layers_spec(layers)), None)


def test_a_trust_table_at_its_defaults_is_left_out_of_the_plain_spec() -> None:
    raw = example()
    assert "trust" not in spec_to_plain(parse_spec(raw))  # older specs keep their bytes
    raw["trust"] = {"checkpoints": 100, "spot_check_budget": 0.1, "replicas": 1}
    assert "trust" not in spec_to_plain(parse_spec(raw))
    raw["trust"] = {"replicas": 2, "spot_check_budget": 0}
    plain = spec_to_plain(parse_spec(raw))
    assert plain["trust"] == {"checkpoints": 100, "spot_check_budget": 0.0, "replicas": 2}
    assert parse_spec(plain) == parse_spec(raw)


def test_relay_blob_mb_at_its_default_is_left_out_and_sets_the_relay_limit() -> None:
    raw = example()
    plain = spec_to_plain(parse_spec(raw))
    assert "relay_blob_mb" not in plain["requirements"]  # older specs keep their bytes
    assert relay_blob_bytes(plain) == 16 << 20
    raw["requirements"]["relay_blob_mb"] = 200
    plain = spec_to_plain(parse_spec(raw))
    assert plain["requirements"]["relay_blob_mb"] == 200
    assert relay_blob_bytes(plain) == 200 << 20
    assert parse_spec(plain) == parse_spec(raw)
    raw["requirements"]["relay_blob_mb"] = 0  # nothing bulk through a relay
    assert relay_blob_bytes(spec_to_plain(parse_spec(raw))) == 0


def test_plain_round_trips_and_is_deterministic() -> None:
    raw = example()
    raw["optim"].update(name="sgd", momentum=0.9, schedule="cosine", warmup_steps=5, grad_clip=1)
    spec = parse_spec(raw)
    plain = spec_to_plain(spec)
    assert parse_spec(plain) == spec
    assert plain["optim"]["grad_clip"] == 1.0 and plain["optim"]["momentum"] == 0.9
    shuffled = {key: raw[key] for key in reversed(list(raw))}
    shuffled["optim"] = dict(reversed(list(raw["optim"].items())))
    assert encode(spec_to_plain(parse_spec(shuffled))) == encode(plain)
    stack = layers_spec(
        [
            {"type": "Linear", "bias": False, "out_features": 32},
            {"type": "GELU"},
            {"out_features": 10, "type": "Linear"},
        ]
    )
    spec = parse_spec(stack)
    assert parse_spec(spec_to_plain(spec)) == spec
    assert spec_to_plain(spec)["model"]["layers"][0] == {
        "type": "Linear",
        "bias": False,
        "out_features": 32,
    }


def _write_csv(path: Path) -> None:
    path.write_text("a,b,target\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))


def test_file_sources_resolve_against_the_spec_folder(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    _write_csv(tmp_path / "data" / "train.csv")
    (tmp_path / "job.toml").write_text(EXAMPLE.replace('"builtin:digits"', '"data/train.csv"'))
    spec = load_spec(tmp_path / "job.toml", allowed_root=tmp_path)
    assert spec.data.source == str((tmp_path / "data" / "train.csv").resolve())
    assert local_files(spec) == [tmp_path.resolve() / "data" / "train.csv"]
    assert parse_spec(spec_to_plain(spec)) == spec
    summary = validate_for_submit(spec, None)
    assert summary.num_samples == 20 and summary.task == "classification"
    blob = with_blob_source(spec, "ab" * 32, "csv")
    assert blob.data.source == "blob:" + "ab" * 32 and blob.data.format == "csv"
    assert local_files(blob) == []
    assert parse_spec(spec_to_plain(blob)) == blob
    assert validate_for_submit(blob, tmp_path / "data" / "train.csv") == summary
    with pytest.raises(SpecError, match="its file must be given"):
        validate_for_submit(blob, None)
    with pytest.raises(SpecError, match="data.format 'npz' does not match the source's csv"):
        with_blob_source(spec, "ab" * 32, "npz")
    with pytest.raises(SpecError, match="not a local file"):
        with_blob_source(parse_spec(example()), "ab" * 32, "csv")


def test_missing_and_escaping_files_are_refused(tmp_path: Path) -> None:
    inner = tmp_path / "jobs"
    inner.mkdir()
    _write_csv(tmp_path / "secret.csv")
    (inner / "job.toml").write_text(EXAMPLE.replace('"builtin:digits"', '"../secret.csv"'))
    with pytest.raises(SpecError, match=r"data.source: '../secret.csv' resolves to .* outside"):
        load_spec(inner / "job.toml", allowed_root=inner)
    (inner / "link.csv").symlink_to(tmp_path / "secret.csv")
    (inner / "job.toml").write_text(EXAMPLE.replace('"builtin:digits"', '"link.csv"'))
    with pytest.raises(SpecError, match="outside the allowed"):
        load_spec(inner / "job.toml", allowed_root=inner)
    (inner / "job.toml").write_text(EXAMPLE.replace('"builtin:digits"', '"gone.csv"'))
    with pytest.raises(SpecError, match="data.source: file not found: .*gone.csv"):
        load_spec(inner / "job.toml")
    (inner / "bad.toml").write_text("name = ")
    with pytest.raises(SpecError, match="is not valid TOML"):
        load_spec(inner / "bad.toml")
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(inner / "none.toml")


# -- fuzzing: anything TOML can express raises SpecError or parses -----------------

KEYS = [
    "name",
    "mode",
    "seed",
    "placement",
    "model",
    "data",
    "optim",
    "requirements",
    "arch",
    "hidden",
    "activation",
    "dropout",
    "channels",
    "kernel_sizes",
    "layers",
    "heads",
    "width",
    "context",
    "type",
    "out_features",
    "kernel_size",
    "source",
    "format",
    "label",
    "batch_size",
    "validation",
    "task",
    "lr",
    "steps",
    "epochs",
    "schedule",
    "loss",
    "warmup_steps",
    "grad_clip",
    "momentum",
    "gpu",
    "max_hours",
    "zzz",
]
scalars = (
    st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.sampled_from(
        [
            "mlp",
            "cnn",
            "layers",
            "char_transformer",
            "builtin:digits",
            "Linear",
            "relu",
            "sgd",
            "cosine",
            "blob:" + "0" * 64,
            "csv",
            "x.csv",
            "a\x00b",
        ]
    )
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_arbitrary_dicts_raise_only_spec_error(raw: dict) -> None:
    with contextlib.suppress(SpecError):
        parse_spec(raw)


def _mutations() -> st.SearchStrategy:
    paths = [
        ("model", k)
        for k in ("hidden", "activation", "dropout", "arch", "channels", "kernel_sizes", "layers")
    ]
    paths += [("data", k) for k in ("batch_size", "validation", "task", "source", "label")]
    paths += [
        ("optim", k)
        for k in ("lr", "steps", "epochs", "schedule", "warmup_steps", "loss", "name", "grad_clip")
    ]
    layer = st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                [
                    "Linear",
                    "Conv2d",
                    "MaxPool2d",
                    "AvgPool2d",
                    "Flatten",
                    "ReLU",
                    "BatchNorm1d",
                    "LayerNorm",
                    "Embedding",
                    "Conv1d",
                    "Dropout",
                ]
            )
        },
        optional={
            k: st.integers(-3, 70) | st.booleans() | st.floats(-1, 2)
            for k in (
                "out_features",
                "out_channels",
                "kernel_size",
                "stride",
                "padding",
                "start_dim",
                "end_dim",
                "num_embeddings",
                "embedding_dim",
                "p",
                "ceil_mode",
                "dilation",
                "groups",
                "in_features",
            )
        },
    )
    value = (
        scalars
        | st.lists(st.integers(-2, 40), max_size=4)
        | st.lists(layer, min_size=1, max_size=6)
    )
    return st.lists(st.tuples(st.sampled_from(paths), value), max_size=4)


@settings(max_examples=300, deadline=None)
@given(_mutations())
def test_mutated_examples_validate_or_raise_spec_error(edits: list) -> None:
    raw = copy.deepcopy(example())
    for (section, key), value in edits:
        raw[section][key] = value
    try:
        spec = parse_spec(raw)
    except SpecError:
        return
    if spec.data.source.startswith("builtin:") and not spec.data.source.startswith("builtin:text"):
        with contextlib.suppress(SpecError):
            validate_for_submit(spec, None)
