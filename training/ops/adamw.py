"""AdamW over one flat parameter buffer: one kernel launch for every parameter.

`torch.optim.AdamW` without `fused=True` runs about ten elementwise kernels per
parameter tensor (or per group of tensors with `foreach`), each a pass over
memory. Here all parameters live in one flat buffer, their gradients in another,
and one kernel reads weight, gradient and both moments once and writes weight and
moments once. `adamw_step_` is the functional form over flat tensors (the custom
op `torch.ops.meshminer.adamw_step_`); `FlatAdamW` is a `torch.optim.Optimizer`
that moves a model's parameters into such a buffer.

Numerics: the arithmetic is torch's (`reference.adamw_step_` is its op sequence),
done in float32 registers and rounded once into each tensor's dtype. On the CPU
path float32 results equal `torch.optim.AdamW`'s bit for bit; the kernel may fuse
multiply-adds, so it is held to the tolerances in docs/ops.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from training.ops import reference
from training.ops._dispatch import kernels, use_triton
from training.ops.quant import check_float


@torch.library.custom_op("meshminer::adamw_step_", mutates_args=("params", "exp_avg", "exp_avg_sq"))
def _adamw_op(
    params: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    args = (lr, beta1, beta2, eps, weight_decay, step)
    if not use_triton(params, grads, exp_avg, exp_avg_sq):
        reference.adamw_step_(params, grads, exp_avg, exp_avg_sq, *args)
        return
    mutated = [t if t.is_contiguous() else t.contiguous() for t in (params, exp_avg, exp_avg_sq)]
    kernels().adamw(mutated[0], grads.contiguous(), mutated[1], mutated[2], *args)
    for mine, theirs in zip(mutated, (params, exp_avg, exp_avg_sq), strict=True):
        if mine is not theirs:
            theirs.copy_(mine)


@_adamw_op.register_fake
def _adamw_fake(
    params: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    return None


def _check_hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    checks = (
        ("lr", lr, lambda v: v >= 0),
        ("betas[0]", betas[0], lambda v: 0 <= v < 1),
        ("betas[1]", betas[1], lambda v: 0 <= v < 1),
        ("eps", eps, lambda v: v >= 0),
        ("weight_decay", weight_decay, lambda v: v >= 0),
    )
    for name, value, rule in checks:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value) or not rule(value):
            raise ValueError(f"{name} is out of range: {value!r}")


def adamw_step_(
    params: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    step: int,
) -> None:
    """One AdamW step over flat tensors, in place; `step` counts from 1.

    `params`, `exp_avg` and `exp_avg_sq` are updated; all four tensors have the same
    number of elements, on one device, each float32, bfloat16 or float16.
    """
    named = {"params": params, "grads": grads, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    for name, tensor in named.items():
        check_float(tensor, name)
        if tensor.shape != params.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, params {tuple(params.shape)}; "
                "all four must match"
            )
        if tensor.device != params.device:
            raise ValueError(f"{name} is on {tensor.device}, params on {params.device}")
    _check_hyper(lr, betas, eps, weight_decay)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be an integer >= 1 (the step being taken), got {step!r}")
    torch.ops.meshminer.adamw_step_(
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        float(lr),
        float(betas[0]),
        float(betas[1]),
        float(eps),
        float(weight_decay),
        step,
    )


class FlatAdamW(torch.optim.Optimizer):
    """AdamW that updates all its parameters with one `adamw_step_` launch.

    On construction the parameters' data move into one flat buffer (each parameter
    becomes a view of it) and each `.grad` becomes a view of a flat gradient buffer,
    which backward accumulates into in place. So build it after `model.to(device)`.
    Differences from `torch.optim.AdamW`, each for the single launch:
    - one parameter group, one dtype and one device for all parameters;
    - every parameter needs a gradient at each step (freeze one with
      `requires_grad_(False)` before building the optimizer instead);
    - `zero_grad()` zeroes the flat gradients and keeps them (no `set_to_none`).
    A gradient that is not a view of the flat buffer (e.g. after `model.zero_grad()`)
    is copied into it at the next step, so that case is only slower.
    Moments are kept in the parameters' dtype, as torch does. LR schedulers work:
    `param_groups[0]["lr"]` is read at every step.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        _check_hyper(lr, betas, eps, weight_decay)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError(
                "FlatAdamW takes one parameter group (one launch for all); "
                "use one FlatAdamW per group"
            )
        self._params: list[Tensor] = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        if len(self._params) != len(self.param_groups[0]["params"]):
            raise ValueError("FlatAdamW was given parameters that do not require grad")
        if not self._params:
            raise ValueError("FlatAdamW got no parameters")
        first = self._params[0]
        for i, p in enumerate(self._params):
            check_float(p, f"parameter {i}")
            if (p.dtype, p.device) != (first.dtype, first.device):
                raise ValueError(
                    f"parameter {i} is {p.dtype} on {p.device}, parameter 0 {first.dtype} "
                    f"on {first.device}; one flat buffer holds one dtype on one device"
                )
        total = sum(p.numel() for p in self._params)
        like = {"dtype": first.dtype, "device": first.device}
        self.flat_params = torch.empty(total, **like)
        self.flat_grads = torch.zeros(total, **like)
        self.exp_avg = torch.zeros(total, **like)
        self.exp_avg_sq = torch.zeros(total, **like)
        self._spans: list[tuple[int, int]] = []
        offset = 0
        for p in self._params:
            self._spans.append((offset, p.numel()))
            offset += p.numel()
        with torch.no_grad():
            for i, p in enumerate(self._params):
                self._view(self.flat_params, i).copy_(p)
                p.data = self._view(self.flat_params, i)
                grad = self._view(self.flat_grads, i)
                if p.grad is not None:
                    grad.copy_(p.grad)
                p.grad = grad
                self.state[p] = self._moments(i)
        self.steps = 0

    def _view(self, flat: Tensor, i: int) -> Tensor:
        """Parameter `i`'s slice of a flat buffer, in that parameter's shape."""
        offset, n = self._spans[i]
        return flat[offset : offset + n].view_as(self._params[i])

    def _moments(self, i: int) -> dict[str, Tensor]:
        return {
            "exp_avg": self._view(self.exp_avg, i),
            "exp_avg_sq": self._view(self.exp_avg_sq, i),
        }

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradients in one op; they stay in place whatever `set_to_none`."""
        self.flat_grads.zero_()

    def _gather_grads(self) -> None:
        for i, p in enumerate(self._params):
            if p.data_ptr() != self._view(self.flat_params, i).data_ptr():
                raise RuntimeError(
                    f"parameter {i} no longer lives in FlatAdamW's buffer (was the model "
                    "moved or its weights replaced?); build the optimizer after model.to(...)"
                )
            grad = p.grad
            if grad is None:
                raise RuntimeError(
                    f"parameter {i} (shape {tuple(p.shape)}) has no gradient; FlatAdamW "
                    "updates every parameter at once, so each must take part in the loss "
                    "(or be frozen with requires_grad_(False) before building the optimizer)"
                )
            view = self._view(self.flat_grads, i)
            if grad.data_ptr() != view.data_ptr() or grad.stride() != view.stride():
                view.copy_(grad)
                p.grad = view

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._gather_grads()
        group = self.param_groups[0]
        self.steps += 1
        adamw_step_(
            self.flat_params,
            self.flat_grads,
            self.exp_avg,
            self.exp_avg_sq,
            lr=group["lr"],
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            step=self.steps,
        )
        return loss

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["flat"] = {"steps": self.steps}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load moments and the step count into the flat buffers (the views are kept).

        Takes a `torch.optim.AdamW` state dict too (same parameters, one group): its
        per-parameter `step` must agree, as one launch has one step count."""
        state_dict = dict(state_dict)
        flat = state_dict.pop("flat", None)
        super().load_state_dict(state_dict)
        steps = set()
        with torch.no_grad():
            for i, p in enumerate(self._params):
                loaded, views = self.state[p], self._moments(i)
                for key, view in views.items():
                    if key in loaded and loaded[key] is not view:
                        view.copy_(loaded[key])
                if "step" in loaded:
                    steps.add(int(loaded["step"]))
                self.state[p] = views
        if flat is not None:
            self.steps = int(flat["steps"])
        elif len(steps) > 1:
            raise ValueError(
                f"parameters were at different steps {sorted(steps)}; FlatAdamW has one"
            )
        else:
            self.steps = steps.pop() if steps else 0
