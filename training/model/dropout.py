"""Random numbers that are the same bits on every device: dropout and the program ops
that draw (`bernoulli`, `rand_like`, `randn_like`, attention dropout).

Why not torch's own: the CPU and each CUDA generator draw different masks from one
seed, so a segment a GPU worker trained with dropout could not be replayed by an owner
without a GPU (measured: 0.19 relative distance for dropout 0.1, where honest noise
across devices is about 1e-3). Here each call takes one 62-bit key from torch's *CPU*
generator (seeded, and kept in every checkpoint, on every device alike) and hashes
`(key, element index)` with integer tensor operations, which give the same bits on
any device. The masks multiply as torch's do (`x * mask / (1 - p)`), a single IEEE
rounding per element, so a kept value is bitwise the same everywhere too.

The hash is murmur3's 32-bit finaliser applied twice, keyed by the two halves of the
key, in int32 tensors: products wrap modulo 2**32 on every device, and each right
shift is masked so that it acts as an unsigned one. On one CPU thread a mask costs
1.0-1.2x torch's own dropout (int64 tensors took 7-10x). `reference_bits` is the same hash in Python
integers, for the tests.
"""

from __future__ import annotations

import math

import torch
from torch import nn

_M32 = 0xFFFFFFFF
_C1, _C2 = 0x85EBCA6B, 0xC2B2AE35
_TWO32 = 1 << 32
_SIGN = 1 << 31
#: at most this many elements per draw: the index must fit the hash's int32
MAX_ELEMENTS = 1 << 31
#: the constant of torch's alpha dropout (SELU's alpha)
_ALPHA = 1.7580993408473766


def _signed(value: int) -> int:
    """A 32-bit pattern as the int32 that holds it."""
    value &= _M32
    return value - _TWO32 if value >= _SIGN else value


def next_key() -> int:
    """One key from torch's CPU generator: the only state a draw consumes."""
    return int(torch.randint(0, 1 << 62, (1,), dtype=torch.int64))


def _mix(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser, in place on an int32 tensor of 32-bit patterns."""
    h ^= (h >> 16) & 0xFFFF
    h *= _signed(_C1)
    h ^= (h >> 13) & 0x7FFFF
    h *= _signed(_C2)
    h ^= (h >> 16) & 0xFFFF
    return h


def random_bits(shape: tuple[int, ...], key: int, device: torch.device) -> torch.Tensor:
    """32 random bits per element for `key`, on `device`, as int32 patterns (read them
    with `unsigned`, `_at_least` or `_uniform`)."""
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        raise ValueError(f"a draw of {n} elements is over the {MAX_ELEMENTS} the hash indexes")
    h = torch.arange(n, dtype=torch.int32, device=device)
    h ^= _signed(key)
    h = _mix(h)
    h += _signed(key >> 32)
    return _mix(h).reshape(shape)


def unsigned(bits: torch.Tensor) -> torch.Tensor:
    """The patterns as the unsigned values they stand for (int64)."""
    return bits.to(torch.int64) & _M32


def _at_least(bits: torch.Tensor, threshold: int) -> torch.Tensor:
    """unsigned(bits) >= threshold, compared in int32 with the sign bit flipped."""
    if threshold >= _TWO32:
        return torch.zeros_like(bits, dtype=torch.bool)
    return (bits ^ _signed(_SIGN)) >= threshold - _SIGN


def _mix_int(h: int) -> int:
    h ^= h >> 16
    h = (h * _C1) & _M32
    h ^= h >> 13
    h = (h * _C2) & _M32
    return h ^ (h >> 16)


def reference_bits(n: int, key: int) -> list[int]:
    """`random_bits` in Python integers: what every device must give."""
    return [_mix_int((_mix_int(i ^ (key & _M32)) + (key >> 32)) & _M32) for i in range(n)]


def _threshold(p: float) -> int:
    return min(round(p * _TWO32), _TWO32)


def _kept(shape: tuple[int, ...], p: float, device: torch.device) -> torch.Tensor:
    """True where an element survives a dropout of probability `p`."""
    return _at_least(random_bits(shape, next_key(), device), _threshold(p))


def _scaled_mask(x: torch.Tensor, p: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Dropout's multiplier in `shape` (broadcast over `x`): kept / (1 - p), or 0."""
    if p >= 1:
        return torch.zeros(shape, dtype=x.dtype, device=x.device)
    return _kept(shape, p, x.device).to(x.dtype).div_(1 - p)


def dropout(x: torch.Tensor, p: float, train: bool = True) -> torch.Tensor:
    """`aten.dropout`: zero each element with probability `p`, scale the rest by 1/(1-p)."""
    if not train or p == 0:
        return x
    return x * _scaled_mask(x, p, tuple(x.shape))


def feature_dropout(x: torch.Tensor, p: float, train: bool = True) -> torch.Tensor:
    """`aten.feature_dropout`: whole channels (dimension 1) dropped together."""
    if not train or p == 0:
        return x
    return x * _scaled_mask(x, p, (*x.shape[:2], *(1,) * (x.dim() - 2)))


def alpha_dropout(x: torch.Tensor, p: float, train: bool = True) -> torch.Tensor:
    """`aten.alpha_dropout`: SELU's dropout, keeping mean and variance (torch's formula)."""
    if not train or p == 0:
        return x
    if p >= 1:
        return x * 0
    noise = _kept(tuple(x.shape), p, x.device).to(x.dtype)
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    b = noise.add(-1).mul_(_ALPHA * a).add_(_ALPHA * a * p)
    return x * noise.mul_(a) + b


def bernoulli(x: torch.Tensor, p: float, generator: object = None) -> torch.Tensor:
    """`aten.bernoulli.p`: ones with probability `p`, in `x`'s shape and dtype."""
    bits = random_bits(tuple(x.shape), next_key(), x.device)
    return _at_least(bits, _threshold(p)).logical_not_().to(x.dtype)


def _uniform(shape: tuple[int, ...], device: torch.device, key: int) -> torch.Tensor:
    """Floats in [0, 1) with 24 random bits: exact in float32 on every device."""
    top = (random_bits(shape, key, device) >> 8) & 0xFFFFFF
    return top.to(torch.float32) * (1.0 / (1 << 24))


def rand_like(x: torch.Tensor, dtype: torch.dtype | None = None, **_: object) -> torch.Tensor:
    """`aten.rand_like`: uniform in [0, 1)."""
    return _uniform(tuple(x.shape), x.device, next_key()).to(dtype or x.dtype)


def randn_like(x: torch.Tensor, dtype: torch.dtype | None = None, **_: object) -> torch.Tensor:
    """`aten.randn_like`: standard normal by Box-Muller. The uniforms are the same bits
    everywhere; `log` and `cos` may differ in the last bit between devices."""
    shape = tuple(x.shape)
    key = next_key()
    u1 = 1.0 - _uniform(shape, x.device, key)  # (0, 1]: log is finite
    u2 = _uniform(shape, x.device, key ^ (1 << 61))
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2 * math.pi) * u2)
    return z.to(dtype or x.dtype)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """`aten.scaled_dot_product_attention`: torch's fused kernels without dropout; with
    it, the math form with the portable mask (fused kernels draw their own bits)."""
    if dropout_p == 0:
        return torch.ops.aten.scaled_dot_product_attention.default(
            q, k, v, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return dropout(scores.softmax(dim=-1), dropout_p) @ v


#: the program ops that draw random numbers, by their graph target
PROGRAM_OPS = {
    "aten.dropout.default": dropout,
    "aten.feature_dropout.default": feature_dropout,
    "aten.alpha_dropout.default": alpha_dropout,
    "aten.bernoulli.p": bernoulli,
    "aten.rand_like.default": rand_like,
    "aten.randn_like.default": randn_like,
    "aten.scaled_dot_product_attention.default": scaled_dot_product_attention,
}


class Dropout(nn.Dropout):
    """`nn.Dropout` with the portable mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
