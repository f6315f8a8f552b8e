"""Portable randomness (training.model.dropout): the bits are the hash the reference
computes in Python integers, whatever the device, the threads or the dtype; the masks
have dropout's statistics; the draws follow torch's CPU generator (so a checkpoint's
RNG state replays them); and a program with dropout trains through the same draws."""

from __future__ import annotations

import math

import pytest
import torch

from training.model import dropout as portable

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("key", [0, 1, (1 << 62) - 1, 0x1234_5678_9ABC_DEF0 >> 2])
@pytest.mark.parametrize("device", DEVICES)
def test_the_bits_are_the_reference_hash_on_every_device(key: int, device: str) -> None:
    bits = portable.unsigned(portable.random_bits((257,), key, torch.device(device))).cpu().tolist()
    assert bits == portable.reference_bits(257, key)
    assert all(0 <= b < 1 << 32 for b in bits)


def test_the_bits_do_not_depend_on_the_number_of_threads() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = portable.random_bits((64, 1000), 7, torch.device("cpu"))
        torch.set_num_threads(max(2, before))
        many = portable.random_bits((64, 1000), 7, torch.device("cpu"))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_a_dropout_mask_keeps_one_minus_p_and_scales_the_rest(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(200_000)
    y = portable.dropout(x, p)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    assert torch.equal(y[kept], torch.full_like(y[kept], 1) / (1 - p))
    assert torch.equal(portable.dropout(x, p, train=False), x)


def test_the_draws_follow_torchs_cpu_generator() -> None:
    x = torch.randn(8, 16)
    torch.manual_seed(5)
    first = portable.dropout(x, 0.3)
    state = torch.get_rng_state()
    second = portable.dropout(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(portable.dropout(x, 0.3), first)
    torch.set_rng_state(state)
    assert torch.equal(portable.dropout(x, 0.3), second)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_mask_is_the_same_in_every_dtype(dtype: torch.dtype) -> None:
    x = torch.ones(4096)
    torch.manual_seed(3)
    base = portable.dropout(x, 0.25) != 0
    torch.manual_seed(3)
    assert torch.equal(portable.dropout(x.to(dtype), 0.25) != 0, base)


def test_feature_dropout_drops_whole_channels() -> None:
    torch.manual_seed(1)
    y = portable.feature_dropout(torch.ones(4, 32, 5, 5), 0.5)
    per_channel = y.flatten(2)
    assert torch.equal(per_channel.amin(-1), per_channel.amax(-1))
    assert 0 < (per_channel[..., 0] == 0).sum() < 4 * 32


def test_the_uniform_and_normal_draws_have_their_moments() -> None:
    torch.manual_seed(2)
    x = torch.empty(100_000)
    u = portable.rand_like(x)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    z = portable.randn_like(x)
    assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1) < 0.02
    assert abs(portable.bernoulli(x, 0.2).mean().item() - 0.2) < 0.01


def test_attention_without_dropout_is_torchs_and_with_it_the_math_form() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(portable.scaled_dot_product_attention(q, k, v, is_causal=True), fused)
    torch.manual_seed(4)
    dropped = portable.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)
    torch.manual_seed(4)
    scores = (q @ k.transpose(-2, -1) * (1 / math.sqrt(8))).masked_fill(
        ~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf")
    )
    assert torch.equal(dropped, portable.dropout(scores.softmax(-1), 0.5) @ v)
    nearly_none = portable.scaled_dot_product_attention(q, k, v, dropout_p=1e-9, is_causal=True)
    assert torch.allclose(nearly_none, fused, atol=1e-5)


def test_a_draw_too_large_to_index_is_refused() -> None:
    with pytest.raises(ValueError, match="elements"):
        portable.random_bits((1 << 16, 1 << 16, 2), 0, torch.device("meta"))
