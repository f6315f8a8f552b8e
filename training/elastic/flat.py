"""The flat vector: a model's floating-point state (parameters and float buffers such
as BatchNorm's running statistics, not those `model.trainable` freezes) as one
float32 vector in sorted name order; integer buffers stay as they are. Deltas go up
in it and the global weights' updates come down in it."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def float_names(
    state: Mapping[str, torch.Tensor], frozen: frozenset[str] = frozenset()
) -> list[str]:
    """The tensors a delta carries: floating point, and not frozen by `model.trainable`."""
    return sorted(
        name for name, tensor in state.items() if tensor.is_floating_point() and name not in frozen
    )


def flatten(state: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].detach().reshape(-1).to(torch.float32) for n in names])


def unflatten(
    state: Mapping[str, torch.Tensor], names: list[str], flat: torch.Tensor
) -> dict[str, torch.Tensor]:
    """`state` with its floating-point tensors taken from `flat`, in `names` order."""
    out = dict(state)
    offset = 0
    for name in names:
        like = state[name]
        out[name] = flat[offset : offset + like.numel()].view(like.shape).to(like.dtype).clone()
        offset += like.numel()
    return out
