"""Torch modules built from a model plan (`training.model.plan`), never from peer code.

A layer stack is `torch.nn` classes from the allow-list, constructed with the kwargs
the plan resolved (ints, floats and bools only). The character transformer is a small
pre-LayerNorm decoder written out here; its attention is plain matrix products with a
causal mask, which is deterministic on every device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from training.model.dropout import Dropout
from training.model.layers import LAYER_TYPES
from training.model.plan import ModelPlan
from training.spec.model import CharTransformerSpec


class LayerStack(nn.Module):
    """The plan's layers in order; each sample is first reshaped to the plan's input shape."""

    def __init__(self, plan: ModelPlan) -> None:
        super().__init__()
        self.input_shape = plan.input_shape
        modules = []
        for layer in plan.layers:
            if layer.type not in LAYER_TYPES:  # the plan came from the allow-list; be sure
                raise ValueError(f"layer type {layer.type!r} is not allowed")
            make = Dropout if layer.type == "Dropout" else getattr(nn, layer.type)
            modules.append(make(**layer.kwargs))
        self.body = nn.Sequential(*modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.reshape(x.shape[0], *self.input_shape))


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, context: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = Dropout(dropout)
        mask = torch.ones(context, context, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(width // self.heads)
        scores = scores.masked_fill(~self.mask[:length, :length], float("-inf"))
        attended = self.dropout(scores.softmax(dim=-1)) @ v
        return self.proj(attended.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), Dropout(dropout)
        )
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    """A decoder-only character LM: token and position embeddings, blocks, LM head."""

    def __init__(self, spec: CharTransformerSpec, vocab_size: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, spec.width)
        self.positions = nn.Embedding(spec.context, spec.width)
        self.dropout = Dropout(spec.dropout)
        self.blocks = nn.Sequential(
            *(Block(spec.width, spec.heads, spec.context, spec.dropout) for _ in range(spec.layers))
        )
        self.norm = nn.LayerNorm(spec.width)
        self.head = nn.Linear(spec.width, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.dropout(self.tokens(ids) + self.positions(positions))
        return self.head(self.norm(self.blocks(x)))


def build_model(plan: ModelPlan) -> nn.Module:
    """The torch module for `plan`, initialised from torch's global RNG (seed it first);
    a program's module starts from the program's own initial state. A prepared start
    (`model.init`, `model.trainable`) is applied on top."""
    module = _module(plan)
    if plan.start is not None:
        from training.model.start import apply_start

        apply_start(module, plan.start)
    return module


def _module(plan: ModelPlan) -> nn.Module:
    if plan.program is not None:
        from training.program.interpreter import ProgramModule

        if plan.loaded is None:
            raise ValueError("a program's plan must be prepared (training.run.execute.prepare)")
        return ProgramModule(
            plan.loaded,
            sample_shape=plan.input_shape,
            returns_loss=plan.program.output == "loss",
            fixed_batch=plan.program.batch,
        )
    if plan.transformer is not None:
        return CharTransformer(plan.transformer, plan.vocab_size)
    return LayerStack(plan)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
