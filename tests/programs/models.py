"""Ordinary PyTorch modules, written as a user would, that the program tests export.

Each is small enough to train in a test on one CPU thread, and each exercises what
its kind of model needs from the interpreter: the GPT scaled-dot-product attention,
dropout and tied embeddings; the ResNet BatchNorm statistics, in-place ReLU and `+=`;
the UNet block transposed convolutions, upsampling, group norm and concatenation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class GPTBlock(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    """nanoGPT's shape: token and position embeddings, pre-norm blocks, a tied LM head."""

    def __init__(
        self,
        vocab: int = 64,
        context: int = 16,
        width: int = 32,
        layers: int = 2,
        heads: int = 2,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPTBlock(width, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        # nanoGPT's 0.02: with the embedding's default N(0, 1) the tied head starts at
        # logits of std ~sqrt(width), a first loss of ~16 for 512 tokens (ln 512 = 6.2)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class GPTWithLoss(nn.Module):
    """The GPT with its loss inside the graph: forward(x, y) -> loss."""

    def __init__(self, **kwargs: int | float) -> None:
        super().__init__()
        self.gpt = GPT(**kwargs)  # type: ignore[arg-type]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.gpt(idx)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class BasicBlock(nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y += self.shortcut(x)
        return self.relu(y)


class ResNet(nn.Module):
    """A small ResNet for (N, C, H, W) images."""

    def __init__(self, in_channels: int = 1, classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        self.layer1 = BasicBlock(width)
        self.layer2 = BasicBlock(width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class UNetBlock(nn.Module):
    """One down-up level of a UNet with a skip connection, for (N, C, H, W) images."""

    def __init__(self, in_channels: int = 1, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.GroupNorm(2, width), nn.SiLU()
        )
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.fuse = nn.Conv2d(2 * width, width, 3, padding=1)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        y = F.silu(self.mid(self.pool(skip)))
        y = self.up(y) + F.interpolate(y, scale_factor=2.0, mode="nearest")[:, : skip.shape[1]]
        y = F.gelu(self.fuse(torch.cat([y, skip], dim=1)))
        return self.head(y.mean(dim=(2, 3)))
