"""Models: every zoo architecture builds and maps the data's samples to the task's
outputs; the plan's parameter counts (computed without allocating) equal torch's; the
layer form infers input sizes, and random layer stacks agree with torch on shapes."""

from __future__ import annotations

import math
import tomllib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from training.budget import check_budget
from training.data.info import DatasetInfo, probe
from training.errors import SpecError
from training.model.modules import build_model, count_parameters
from training.model.plan import plan_model
from training.spec.job import parse_spec

DIGITS = DatasetInfo("classification", (64,), 1438, 359, num_classes=10)
IMAGES = DatasetInfo("classification", (3, 12, 10), 90, 10, num_classes=4)
TABLE = DatasetInfo("regression", (7,), 90, 10, target_shape=(3,))
TEXT = DatasetInfo("lm", (16,), 200, 40, vocab_size=27)


def spec_with(model: dict, source: str = "builtin:digits") -> object:
    raw = tomllib.loads(f'name = "m"\n[data]\nsource = "{source}"\n[optim]\nsteps = 10\n')
    raw["model"] = model
    return parse_spec(raw)


def run(model: torch.nn.Module, info: DatasetInfo, batch: int = 5) -> torch.Tensor:
    if info.task == "lm":
        x = torch.randint(0, info.vocab_size, (batch, *info.sample_shape))
    else:
        x = torch.randn(batch, *info.sample_shape)
    model.eval()
    return model(x)


ZOO = [
    ({"arch": "mlp", "hidden": [32, 16], "activation": "gelu", "dropout": 0.1}, DIGITS),
    ({"arch": "mlp", "hidden": []}, TABLE),
    ({"arch": "mlp", "hidden": [8], "activation": "silu"}, IMAGES),
    ({"arch": "cnn", "channels": [8, 16], "kernel_sizes": [3, 3]}, DIGITS),
    (
        {"arch": "cnn", "channels": [4, 4, 4, 4], "kernel_sizes": [3, 5, 2, 1], "dropout": 0.2},
        DIGITS,
    ),
    ({"arch": "cnn", "channels": [6], "activation": "tanh"}, IMAGES),
    ({"arch": "char_transformer", "layers": 2, "heads": 2, "width": 16, "context": 16}, TEXT),
]


@pytest.mark.parametrize(("model", "info"), ZOO)
def test_zoo_builds_with_the_planned_shapes_and_counts(model: dict, info: DatasetInfo) -> None:
    source = "builtin:text:t.txt" if info.task == "lm" else "builtin:digits"
    plan = plan_model(spec_with(model, source).model, info)
    module = build_model(plan)
    assert count_parameters(module) == plan.parameters
    out = run(module, info)
    expected = {"classification": (info.num_classes,), "lm": (16, 27)}.get(
        info.task, info.target_shape
    )
    assert tuple(out.shape) == (5, *expected)


def test_digits_are_8x8_images_for_the_cnn() -> None:
    plan = plan_model(spec_with({"arch": "cnn", "channels": [4]}).model, DIGITS)
    assert plan.input_shape == (1, 8, 8)
    assert plan.layers[0].kwargs["in_channels"] == 1


@pytest.mark.parametrize(("model", "info"), [ZOO[0], ZOO[3], ZOO[6]])
def test_planned_flops_match_torchs_flop_counter(model: dict, info: DatasetInfo) -> None:
    source = "builtin:text:t.txt" if info.task == "lm" else "builtin:digits"
    plan = plan_model(spec_with(model, source).model, info)
    module = build_model(plan)
    with FlopCounterMode(display=False) as counter:
        run(module, info, batch=1)
    assert counter.get_total_flops() == plan.flops_per_sample


def test_layers_infer_input_sizes() -> None:
    layers = [
        {"type": "Conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
        {"type": "BatchNorm2d"},
        {"type": "ReLU"},
        {"type": "MaxPool2d", "kernel_size": 2},
        {"type": "Conv2d", "out_channels": 12, "kernel_size": 3, "groups": 4},
        {"type": "AvgPool2d", "kernel_size": 2, "ceil_mode": True},
        {"type": "Flatten"},
        {"type": "LayerNorm"},
        {"type": "Dropout", "p": 0.1},
        {"type": "Linear", "out_features": 32},
        {"type": "BatchNorm1d"},
        {"type": "GELU"},
        {"type": "Linear", "out_features": 10, "in_features": 32},
    ]
    plan = plan_model(spec_with({"arch": "layers", "layers": layers}).model, DIGITS)
    assert plan.input_shape == (1, 8, 8)
    kwargs = [layer.kwargs for layer in plan.layers]
    assert kwargs[0]["in_channels"] == 1 and kwargs[1]["num_features"] == 8
    assert kwargs[4]["in_channels"] == 8
    assert [layer.out_shape for layer in plan.layers][4:7] == [(12, 2, 2), (12, 1, 1), (12,)]
    assert kwargs[7]["normalized_shape"] == 12 and kwargs[9]["in_features"] == 12
    module = build_model(plan)
    assert count_parameters(module) == plan.parameters
    assert tuple(run(module, DIGITS).shape) == (5, 10)


def test_layers_with_embedding_and_conv1d() -> None:
    layers = [
        {"type": "Embedding", "num_embeddings": 50, "embedding_dim": 6},
        {"type": "Flatten"},
        {"type": "Linear", "out_features": 3},
    ]
    ints = DatasetInfo("regression", (5,), 10, 0, target_shape=(3,))
    plan = plan_model(spec_with({"arch": "layers", "layers": layers}).model, ints)
    assert plan.token_input and plan.layers[2].kwargs["in_features"] == 30
    module = build_model(plan)
    assert module(torch.randint(0, 50, (2, 5))).shape == (2, 3)
    conv = [
        {"type": "Conv1d", "out_channels": 4, "kernel_size": 3, "dilation": 2},
        {"type": "MaxPool1d", "kernel_size": 2},
        {"type": "Flatten"},
        {"type": "Linear", "out_features": 10},
    ]
    plan = plan_model(spec_with({"arch": "layers", "layers": conv}).model, DIGITS)
    assert plan.input_shape == (1, 64) and plan.layers[0].out_shape == (4, 60)
    assert count_parameters(build_model(plan)) == plan.parameters


def test_a_cnn_on_non_square_features_says_what_it_needs() -> None:
    with pytest.raises(SpecError, match="10 features, which is not a square"):
        plan_model(
            spec_with({"arch": "cnn"}).model,
            DatasetInfo("classification", (10,), 10, 0, num_classes=2),
        )


def test_plans_for_builtins_come_without_the_data_loaded() -> None:
    spec = spec_with({"arch": "mlp", "hidden": [16]})
    info = probe(spec)
    assert (info.sample_shape, info.num_classes, info.num_samples) == ((64,), 10, 1797)
    assert check_budget(spec, DIGITS).parameters == 64 * 16 + 16 + 16 * 10 + 10


# -- random layer stacks: the plan's shapes and counts are torch's -------------------

_ARGS = {
    "Conv2d": {
        "out_channels": st.integers(1, 6),
        "kernel_size": st.integers(1, 4),
        "stride": st.integers(1, 3),
        "padding": st.integers(0, 2),
        "dilation": st.integers(1, 2),
        "bias": st.booleans(),
    },
    "MaxPool2d": {
        "kernel_size": st.integers(1, 3),
        "stride": st.integers(1, 3),
        "padding": st.integers(0, 1),
        "dilation": st.integers(1, 2),
        "ceil_mode": st.booleans(),
    },
    "AvgPool2d": {
        "kernel_size": st.integers(1, 3),
        "stride": st.integers(1, 3),
        "padding": st.integers(0, 1),
        "ceil_mode": st.booleans(),
        "count_include_pad": st.booleans(),
    },
    "BatchNorm2d": {"affine": st.booleans()},
    "ReLU": {},
    "Tanh": {},
    "Identity": {},
    "LeakyReLU": {"negative_slope": st.floats(0, 1)},
    "Dropout": {"p": st.floats(0, 0.9)},
}
_TAIL = {
    "Linear": {"out_features": st.integers(1, 12), "bias": st.booleans()},
    "LayerNorm": {"elementwise_affine": st.booleans(), "bias": st.booleans()},
    "BatchNorm1d": {"track_running_stats": st.booleans()},
    "SiLU": {},
}


def _layer(table: dict) -> st.SearchStrategy:
    return st.sampled_from(sorted(table)).flatmap(
        lambda name: st.fixed_dictionaries({"type": st.just(name)}, optional=table[name])
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_layer(_ARGS), min_size=1, max_size=5),
    st.lists(_layer(_TAIL), max_size=3),
)
def test_random_layer_stacks_agree_with_torch(image_layers: list, flat_layers: list) -> None:
    layers = [{"type": "Conv2d", "out_channels": 3, "kernel_size": 1}, *image_layers]
    layers += [{"type": "Flatten"}, *flat_layers, {"type": "Linear", "out_features": 4}]
    info = IMAGES
    try:
        plan = plan_model(spec_with({"arch": "layers", "layers": layers}).model, info)
    except SpecError:
        return  # e.g. a kernel larger than its input; torch would refuse too
    module = build_model(plan)
    assert count_parameters(module) == plan.parameters
    module.eval()
    x = torch.randn(2, *info.sample_shape).reshape(2, -1)
    out = module.body[0](x.reshape(2, *plan.input_shape))
    for layer, planned in zip(list(module.body)[1:], plan.layers[1:], strict=True):
        out = layer(out)
        assert tuple(out.shape[1:]) == planned.out_shape, planned
    assert math.prod(out.shape[1:]) == 4
