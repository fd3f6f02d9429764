"""Tests for posenc.attention_entropy and posenc.log_length_scale."""

import math

import pytest
import torch

import posenc as pe


def test_uniform_distribution_has_entropy_log_n():
    for n in (1, 2, 7, 512):
        p = torch.full((n,), 1.0 / n)
        assert pe.attention_entropy(p).item() == pytest.approx(math.log(n), abs=1e-5)


def test_one_hot_has_zero_entropy_and_zeros_are_ignored():
    p = torch.zeros(3, 10)
    p[torch.arange(3), torch.tensor([0, 4, 9])] = 1.0
    assert torch.equal(pe.attention_entropy(p), torch.zeros(3))


def test_matches_definition_on_random_softmax():
    logits = torch.randn(2, 3, 5, 11, dtype=torch.float64)
    p = logits.softmax(-1)
    expected = -(p * p.log()).sum(-1)
    got = pe.attention_entropy(p)
    assert got.shape == (2, 3, 5)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected)
    # Entropy of a softmax: H = logsumexp(z) - sum_j p_j z_j.
    torch.testing.assert_close(got, logits.logsumexp(-1) - (p * logits).sum(-1))


def test_bounds_and_other_dim_and_keepdim():
    p = torch.randn(4, 9, 6).softmax(1)
    h = pe.attention_entropy(p, dim=1, keepdim=True)
    assert h.shape == (4, 1, 6)
    assert (h >= 0).all() and (h <= math.log(9) + 1e-6).all()


def test_two_point_distribution_is_binary_entropy():
    q = 0.3
    p = torch.tensor([q, 1 - q])
    expected = -(q * math.log(q) + (1 - q) * math.log(1 - q))
    assert pe.attention_entropy(p).item() == pytest.approx(expected, rel=1e-6)


def test_causal_attention_rows_with_uniform_weights():
    # q = k = 0: query i attends uniformly to i + 1 keys, entropy log(i + 1).
    q = torch.zeros(1, 1, 6, 4)
    v = torch.randn(1, 1, 6, 4)
    _, w = pe.attention(q, q, v, causal=True, return_weights=True)
    h = pe.attention_entropy(w)[0, 0]
    torch.testing.assert_close(h, torch.log(torch.arange(1, 7, dtype=torch.float32)))


def test_half_precision_input():
    p = torch.full((4, 8), 1.0 / 8).to(torch.bfloat16)
    h = pe.attention_entropy(p)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h, torch.full((4,), math.log(8)))


@pytest.mark.parametrize(
    "weights",
    [
        torch.tensor([0.5, 0.6]),  # does not sum to 1
        torch.tensor([1.5, -0.5]),  # negative
        torch.tensor([float("nan"), 1.0]),  # fully masked softmax row
        torch.tensor([1, 0]),  # integer
        torch.zeros(3, 0),  # no keys
        torch.tensor(1.0),  # 0-d
    ],
)
def test_bad_weights_raise(weights):
    with pytest.raises(ValueError):
        pe.attention_entropy(weights)


def test_bad_dim_raises():
    with pytest.raises(ValueError):
        pe.attention_entropy(torch.full((2, 2), 0.5), dim=2)


def test_log_length_scale_identities():
    assert pe.log_length_scale(512, 512) == 1.0
    assert pe.log_length_scale(512 ** 2, 512) == pytest.approx(2.0)
    assert pe.log_length_scale(4096, 512) == pytest.approx(12 / 9)  # log_{2^9} 2^12
    assert pe.log_length_scale(16, 512) == 1.0  # clamped below the training length
    assert pe.log_length_scale(8, 64, clamp=False) == pytest.approx(0.5)
    assert pe.log_length_scale(1, 64, clamp=False) == 0.0


@pytest.mark.parametrize("n, train_len", [(0, 512), (512, 1), (2.5, 512), (512, True), (-3, 8)])
def test_log_length_scale_bad_input(n, train_len):
    with pytest.raises(ValueError):
        pe.log_length_scale(n, train_len)


def test_weights_without_values_or_of_an_empty_row():
    with pytest.raises(ValueError, match="meta"):
        pe.attention_entropy(torch.full((2, 4), 0.25, device="meta"))
    # attention gives a query allowed no key zero weights: they are not a distribution
    q = torch.zeros(1, 1, 3, 4)
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    _, w = pe.attention(q, q, q, mask=mask, return_weights=True)
    with pytest.raises(ValueError, match="allowed no key"):
        pe.attention_entropy(w)
    assert torch.allclose(pe.attention_entropy(w[:, :, [0, 2]]), torch.tensor([[[0.0, math.log(3)]]]))
    with pytest.raises(ValueError, match="dim"):
        pe.attention_entropy(torch.full((2, 2), 0.5), dim=torch.ones(2))
    with pytest.raises(TypeError, match="keepdim"):
        pe.attention_entropy(torch.full((2, 2), 0.5), keepdim="no")


def test_log_length_scale_other_integer_types():
    import numpy as np

    assert pe.log_length_scale(np.int64(4096), torch.tensor(512)) == pytest.approx(12 / 9)
    with pytest.raises(TypeError, match="clamp"):
        pe.log_length_scale(8, 64, clamp=None)
