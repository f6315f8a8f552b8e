"""A model's plan: every layer with its resolved sizes, worked out before any tensor exists.

The plan is the single answer to "what will this spec build on this data": input
view, layer kwargs (with inferred input sizes), output shape, exact parameter count,
forward FLOPs per sample and a rough count of activations. The budget check reads it;
`training.model.modules` builds torch modules from it, so the two cannot disagree.

Zoo architectures expand to the same layer stack as `arch = "layers"`, except the
character transformer, whose counts are closed-form (checked against torch in tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from training.data.info import DatasetInfo
from training.errors import SpecError
from training.model.layers import IMAGE_INPUT, SEQUENCE_INPUT, SHAPE_AGNOSTIC, Shape, propagate
from training.spec.model import (
    CharTransformerSpec,
    CnnSpec,
    LayerStackSpec,
    MlpSpec,
    ModelSpec,
)
from training.spec.program import ProgramSpec

ACTIVATION_LAYERS = {"relu": "ReLU", "gelu": "GELU", "tanh": "Tanh", "silu": "SiLU"}


@dataclass(frozen=True)
class PlannedLayer:
    type: str
    kwargs: dict[str, Any]
    out_shape: Shape
    params: int
    flops: int


@dataclass(frozen=True)
class ModelPlan:
    arch: str
    input_shape: Shape  # each sample is reshaped to this before the first layer
    token_input: bool  # samples are integer token ids (Embedding first, or the LM)
    output_shape: Shape
    parameters: int
    flops_per_sample: int  # forward; 2 per multiply-add in linear, conv and attention
    activations_per_sample: int  # rough count of floats kept for the backward pass
    layers: tuple[PlannedLayer, ...] = ()
    transformer: CharTransformerSpec | None = None
    vocab_size: int = 0
    program: ProgramSpec | None = None
    loaded: Any = None  # the program itself (training.program.Program), set by prepare()
    start: Any = (
        None  # model.init and model.trainable (training.model.start.Start), set by prepare()
    )


class _Stack:
    """Layers appended one by one, each seeing the shape the previous one produced."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.layers: list[PlannedLayer] = []

    def add(self, type_name: str, path: str, **args: Any) -> None:
        out = propagate(type_name, args, self.shape, path)
        self.layers.append(PlannedLayer(type_name, out.kwargs, out.shape, out.params, out.flops))
        self.shape = out.shape

    def plan(self, arch: str, input_shape: Shape, token_input: bool) -> ModelPlan:
        return ModelPlan(
            arch=arch,
            input_shape=input_shape,
            token_input=token_input,
            output_shape=self.shape,
            parameters=sum(layer.params for layer in self.layers),
            flops_per_sample=sum(layer.flops for layer in self.layers),
            activations_per_sample=math.prod(input_shape)
            + sum(math.prod(layer.out_shape) for layer in self.layers),
            layers=tuple(self.layers),
        )


def output_shape(info: DatasetInfo) -> Shape:
    """What the model must produce per sample for this data's task."""
    if info.task == "classification":
        return (info.num_classes,)
    if info.task == "lm":
        return (info.sample_shape[0], info.vocab_size)
    return info.target_shape or (1,)


def image_shape(sample: Shape) -> Shape:
    """A sample as (channels, height, width); square flat samples become 1 x s x s."""
    if len(sample) == 3:
        return sample
    if len(sample) == 2:
        return (1, *sample)
    side = math.isqrt(sample[0])
    if side * side != sample[0]:
        raise SpecError(
            f"model: 2-D layers need images, but samples have {sample[0]} features, which is "
            "not a square; give x shaped (N, C, H, W) or (N, H, W) in npz or safetensors"
        )
    return (1, side, side)


def sequence_shape(sample: Shape) -> Shape:
    """A sample as (channels, length); flat samples become one channel."""
    if len(sample) == 2:
        return sample
    if len(sample) == 1:
        return (1, sample[0])
    raise SpecError(f"model: 1-D layers need (channels, length) samples, got {sample}")


def plan_model(model: ModelSpec, info: DatasetInfo) -> ModelPlan:
    """Resolve `model` against the data described by `info`, or raise `SpecError`."""
    target = output_shape(info)
    if isinstance(model, ProgramSpec):
        return _program(model, info, target)
    if isinstance(model, CharTransformerSpec):
        return _transformer(model, info)
    if info.task == "lm":
        raise SpecError("model.arch: text and token data need arch = char_transformer or program")
    flat = (math.prod(info.sample_shape),)
    if isinstance(model, MlpSpec):
        stack = _Stack(flat)
        for i, width in enumerate(model.hidden):
            stack.add("Linear", f"model.hidden[{i}]", out_features=width)
            stack.add(ACTIVATION_LAYERS[model.activation], "model.activation")
            if model.dropout > 0:
                stack.add("Dropout", "model.dropout", p=model.dropout)
        stack.add("Linear", "model (output layer)", out_features=target[0])
        return stack.plan("mlp", flat, token_input=False)
    if isinstance(model, CnnSpec):
        image = image_shape(info.sample_shape)
        stack = _Stack(image)
        for i, (channels, kernel) in enumerate(
            zip(model.channels, model.kernel_sizes, strict=True)
        ):
            path = f"model.kernel_sizes[{i}]"
            stack.add(
                "Conv2d", path, out_channels=channels, kernel_size=kernel, padding=kernel // 2
            )
            stack.add(ACTIVATION_LAYERS[model.activation], "model.activation")
            if min(stack.shape[1:]) >= 2:
                stack.add("MaxPool2d", path, kernel_size=2)
        stack.add("Flatten", "model")
        if model.dropout > 0:
            stack.add("Dropout", "model.dropout", p=model.dropout)
        stack.add("Linear", "model (output layer)", out_features=target[0])
        return stack.plan("cnn", image, token_input=False)
    assert isinstance(model, LayerStackSpec)
    return _layer_stack(model, info, target)


def _layer_stack(model: LayerStackSpec, info: DatasetInfo, target: Shape) -> ModelPlan:
    first = next((layer.type for layer in model.layers if layer.type not in SHAPE_AGNOSTIC), "")
    token_input = model.layers[0].type == "Embedding"
    if token_input:
        shape = info.sample_shape
    elif first in IMAGE_INPUT:
        shape = image_shape(info.sample_shape)
    elif first in SEQUENCE_INPUT:
        shape = sequence_shape(info.sample_shape)
    else:
        shape = (math.prod(info.sample_shape),)
    stack = _Stack(shape)
    for i, layer in enumerate(model.layers):
        path = f"model.layers[{i}]"
        if layer.type == "Embedding" and i > 0:
            raise SpecError(f"{path}: Embedding must be the first layer (it reads token ids)")
        stack.add(layer.type, path, **dict(layer.args))
    if stack.shape != target:
        raise SpecError(
            f"model.layers: the last layer gives shape {stack.shape} per sample, but this "
            f"{info.task} data needs {target}; end with Flatten and "
            f'{{type = "Linear", out_features = {target[-1]}}}'
        )
    return stack.plan("layers", shape, token_input)


def _transformer(model: CharTransformerSpec, info: DatasetInfo) -> ModelPlan:
    if info.task != "lm":
        raise SpecError("model.arch: char_transformer needs text data (task lm)")
    vocab, width, context, depth = info.vocab_size, model.width, model.context, model.layers
    per_block = 12 * width * width + 13 * width  # 2 LayerNorms, qkv, proj, 4x MLP
    params = vocab * width + context * width + depth * per_block + 2 * width
    params += width * vocab + vocab
    matmul = 2 * context * (12 * width * width) + 2 * 2 * context * context * width
    flops = depth * matmul + 2 * context * width * vocab
    activations = depth * context * (16 * width + 2 * model.heads * context)
    activations += 2 * context * width + 2 * context * vocab
    return ModelPlan(
        arch="char_transformer",
        input_shape=(context,),
        token_input=True,
        output_shape=(context, vocab),
        parameters=params,
        flops_per_sample=flops,
        activations_per_sample=activations,
        transformer=model,
        vocab_size=vocab,
    )


def _program(model: ProgramSpec, info: DatasetInfo, target: Shape) -> ModelPlan:
    """A program's plan is its figures (re-derived from the graph by every runner),
    checked against the data it will see."""
    if not model.converted:
        raise SpecError(
            "model.program: the program's figures come from converting it (the node does so "
            "at submit, train-local before training)"
        )
    token_input = model.input_dtype.startswith("int")
    sample = info.sample_shape
    fits = sample == model.input_shape or (
        not token_input and math.prod(sample) == math.prod(model.input_shape)
    )
    if not fits:
        raise SpecError(
            f"model.program: the graph takes samples of shape {model.input_shape} "
            f"({model.input_dtype}), but the data's samples are {sample}"
        )
    if info.task == "lm" and not token_input:
        raise SpecError(
            f"model.program: token data needs a graph taking int64 ids, not {model.input_dtype}"
        )
    if model.output == "logits" and not _covers(model.output_shape, target, info.task):
        raise SpecError(
            f"model.program: the graph returns {model.output_shape} per sample, but this "
            f"{info.task} data needs {target}"
        )
    return ModelPlan(
        arch="program",
        input_shape=model.input_shape,
        token_input=token_input,
        output_shape=model.output_shape,
        parameters=model.parameters,
        flops_per_sample=model.flops_per_sample,
        activations_per_sample=model.activations_per_sample,
        vocab_size=info.vocab_size,
        program=model,
    )


def _covers(produced: Shape, target: Shape, task: str) -> bool:
    """Logits for at least the data's classes (or vocabulary); regression exactly."""
    if task == "regression" or len(produced) != len(target) or not produced:
        return produced == target
    return produced[:-1] == target[:-1] and produced[-1] >= target[-1]
