"""The reviewed operators a program may call: `aten` overloads, and integer arithmetic
on symbolic sizes.

Each entry was read for what it does with memory and the outside world. Left out on
purpose: anything that reads or writes files or prints (`from_file`, `_print`, `save`),
views or resizes storage by hand (`as_strided`, `set_`, `resize_`, `_unsafe_view`),
returns uninitialised memory (`empty`, `new_empty`, `empty_strided`), synchronises
with the host or depends on tensor values for its shape (`item`, `nonzero`,
`_local_scalar_dense`, `masked_select`, `unique`), every namespace but `aten` and every
higher-order op (`cond`, `map`, `wrap_with_*`, `auto_functionalized`).

The table maps the string a graph names to the callable: a name from a file is only
ever looked up in this table, never resolved against torch. The callables are bound
lazily, so importing this module does not import torch.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import cache
from typing import Any

# torch.ops.aten.<name>.<overload>, as the graph writes them without "torch.ops."
ATEN_OVERLOADS: tuple[str, ...] = (
    # linear algebra and layers
    "linear.default",
    "matmul.default",
    "mm.default",
    "bmm.default",
    "addmm.default",
    "baddbmm.default",
    "einsum.default",
    "conv1d.default",
    "conv2d.default",
    "conv3d.default",
    "conv1d.padding",
    "conv2d.padding",
    "conv_transpose1d.default",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "embedding.default",
    "scaled_dot_product_attention.default",
    "layer_norm.default",
    "group_norm.default",
    "batch_norm.default",
    "instance_norm.default",
    "rms_norm.default",
    "dropout.default",
    "feature_dropout.default",
    "alpha_dropout.default",
    "max_pool1d.default",
    "max_pool2d.default",
    "max_pool3d.default",
    "avg_pool1d.default",
    "avg_pool2d.default",
    "avg_pool3d.default",
    "adaptive_avg_pool1d.default",
    "adaptive_avg_pool2d.default",
    "adaptive_avg_pool3d.default",
    "adaptive_max_pool2d.default",
    "upsample_nearest1d.vec",
    "upsample_nearest2d.vec",
    "upsample_bilinear2d.vec",
    "upsample_linear1d.vec",
    "pad.default",
    "constant_pad_nd.default",
    "pixel_shuffle.default",
    "pixel_unshuffle.default",
    # activations
    "relu.default",
    "relu_.default",
    "gelu.default",
    "gelu_.default",
    "silu.default",
    "silu_.default",
    "sigmoid.default",
    "sigmoid_.default",
    "tanh.default",
    "tanh_.default",
    "softmax.int",
    "log_softmax.int",
    "_softmax.default",
    "_log_softmax.default",
    "leaky_relu.default",
    "leaky_relu_.default",
    "elu.default",
    "elu_.default",
    "hardtanh.default",
    "hardtanh_.default",
    "hardswish.default",
    "hardswish_.default",
    "hardsigmoid.default",
    "mish.default",
    "softplus.default",
    "glu.default",
    "relu6.default",
    "prelu.default",
    "celu.default",
    "selu.default",
    # losses
    "cross_entropy_loss.default",
    "nll_loss_nd.default",
    "nll_loss.default",
    "mse_loss.default",
    "l1_loss.default",
    "smooth_l1_loss.default",
    "huber_loss.default",
    "binary_cross_entropy_with_logits.default",
    "kl_div.default",
    # elementwise arithmetic
    "add.Tensor",
    "add.Scalar",
    "add_.Tensor",
    "add_.Scalar",
    "sub.Tensor",
    "sub.Scalar",
    "sub_.Tensor",
    "rsub.Scalar",
    "rsub.Tensor",
    "mul.Tensor",
    "mul.Scalar",
    "mul_.Tensor",
    "mul_.Scalar",
    "div.Tensor",
    "div.Scalar",
    "div.Tensor_mode",
    "div_.Tensor",
    "div_.Scalar",
    "neg.default",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "sqrt.default",
    "rsqrt.default",
    "exp.default",
    "log.default",
    "log1p.default",
    "abs.default",
    "sin.default",
    "cos.default",
    "clamp.default",
    "clamp.Tensor",
    "clamp_.default",
    "clamp_min.default",
    "clamp_max.default",
    "reciprocal.default",
    "square.default",
    "sign.default",
    "floor.default",
    "ceil.default",
    "round.default",
    "erf.default",
    "where.self",
    "where.ScalarOther",
    "where.ScalarSelf",
    "masked_fill.Scalar",
    "masked_fill.Tensor",
    "masked_fill_.Scalar",
    "lerp.Scalar",
    "addcmul.default",
    "maximum.default",
    "minimum.default",
    "fmod.Scalar",
    "remainder.Scalar",
    # comparison and logic
    "eq.Scalar",
    "eq.Tensor",
    "ne.Scalar",
    "ne.Tensor",
    "lt.Scalar",
    "lt.Tensor",
    "le.Scalar",
    "le.Tensor",
    "gt.Scalar",
    "gt.Tensor",
    "ge.Scalar",
    "ge.Tensor",
    "logical_not.default",
    "logical_and.default",
    "logical_or.default",
    "bitwise_not.default",
    # reductions
    "sum.default",
    "sum.dim_IntList",
    "mean.default",
    "mean.dim",
    "amax.default",
    "amin.default",
    "max.dim",
    "min.dim",
    "max.default",
    "min.default",
    "argmax.default",
    "argmin.default",
    "var.correction",
    "std.correction",
    "var_mean.correction",
    "norm.Scalar",
    "norm.ScalarOpt_dim",
    "logsumexp.default",
    "prod.dim_int",
    "cumsum.default",
    "all.default",
    "any.default",
    "topk.default",
    "sort.default",
    # shapes and views (within a tensor's own storage)
    "view.default",
    "reshape.default",
    "transpose.int",
    "permute.default",
    "t.default",
    "unsqueeze.default",
    "squeeze.dim",
    "squeeze.dims",
    "squeeze.default",
    "flatten.using_ints",
    "unflatten.int",
    "expand.default",
    "expand_as.default",
    "contiguous.default",
    "clone.default",
    "split.Tensor",
    "split_with_sizes.default",
    "chunk.default",
    "unbind.int",
    "slice.Tensor",
    "select.int",
    "narrow.default",
    "index.Tensor",
    "index_select.default",
    "gather.default",
    "cat.default",
    "stack.default",
    "repeat.default",
    "repeat_interleave.self_int",
    "tile.default",
    "roll.default",
    "flip.default",
    "tril.default",
    "triu.default",
    "movedim.int",
    "unfold.default",
    "view_as.default",
    "reshape_as.default",
    "type_as.default",
    "detach.default",
    "one_hot.default",
    "scatter.src",
    "scatter_add.default",
    "index_put.default",
    "index_add.default",
    "lift_fresh_copy.default",
    "copy_.default",
    "fill_.Scalar",
    "zero_.default",
    "sym_size.int",
    "sym_numel.default",
    # dtype changes and fresh tensors (sizes bounded by the dry run before any real op)
    "to.dtype",
    "to.dtype_layout",
    "to.device",
    "_to_copy.default",
    "arange.default",
    "arange.start",
    "arange.start_step",
    "zeros.default",
    "ones.default",
    "full.default",
    "zeros_like.default",
    "ones_like.default",
    "full_like.default",
    "scalar_tensor.default",
    "tensor.int",
    "tensor.float",
    "rand_like.default",
    "randn_like.default",
    "bernoulli.p",
    "new_zeros.default",
    "new_ones.default",
    "new_full.default",
    "tril_indices.default",
    "triu_indices.default",
    "linspace.default",
    "polar.default",
    "outer.default",
    "complex.default",
    "view_as_real.default",
    "view_as_complex.default",
)

# integer arithmetic on symbolic sizes (a dynamic batch dimension), ints only
SYM_OPERATORS: dict[str, Callable[[int, int], int]] = {
    "_operator.add": operator.add,
    "_operator.sub": operator.sub,
    "_operator.mul": operator.mul,
    "_operator.floordiv": operator.floordiv,
}

# nodes that draw random numbers: a graph holding one needs an eval graph beside it
RANDOM_OPS = frozenset(
    {
        "dropout.default",
        "feature_dropout.default",
        "alpha_dropout.default",
        "rand_like.default",
        "randn_like.default",
        "bernoulli.p",
    }
)
# nodes whose behaviour depends on train/eval mode in ways the graph bakes in
MODE_OPS = RANDOM_OPS | {"batch_norm.default", "instance_norm.default"}

# nodes that make a tensor from sizes alone: always made on the run's device (the dry
# run's is `meta`, so an absurd size allocates nothing before it is refused)
FACTORY_OPS = frozenset(
    f"aten.{name}"
    for name in (
        "arange.default",
        "arange.start",
        "arange.start_step",
        "zeros.default",
        "ones.default",
        "full.default",
        "scalar_tensor.default",
        "tensor.int",
        "tensor.float",
        "tril_indices.default",
        "triu_indices.default",
        "linspace.default",
    )
)

ALLOWED = frozenset(f"aten.{name}" for name in ATEN_OVERLOADS) | frozenset(SYM_OPERATORS)


def allowed(target: str) -> bool:
    """Whether a graph node may call `target` (a graph's name, `torch.ops.` stripped)."""
    return target in ALLOWED


@cache
def callable_for(target: str) -> Callable[..., Any]:
    """The callable behind an allowed target; `KeyError` for any other string."""
    if target in SYM_OPERATORS:
        return SYM_OPERATORS[target]
    if target not in ALLOWED:
        raise KeyError(target)
    import torch

    _, name, overload = target.split(".")
    return getattr(getattr(torch.ops.aten, name), overload)
