"""Stick-breaking attention: log-space weights against the paper's product, stability, the diagonal convention."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


def _reference_weights(z, attend_current=False):
    """Tan et al. (2025)'s definition as written: A_ij = beta_ij prod_{j<k<i} (1 - beta_ik), keys j < i (or j <= i)."""
    n = z.shape[-1]
    beta = torch.sigmoid(z)
    a = torch.zeros_like(z)
    for i in range(n):
        last = i if attend_current else i - 1  # the nearest key the query may see
        for j in range(last + 1):
            weight = beta[..., i, j]
            for k in range(j + 1, last + 1):
                weight = weight * (1 - beta[..., i, k])
            a[..., i, j] = weight
    return a


def _reference(q, k, v, attend_current=False):
    z = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    a = _reference_weights(z, attend_current)
    return a @ v + (1 - a.sum(-1, keepdim=True)) * v  # the rest of the stick on the query's own value


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 3), min_size=0, max_size=2), n=st.integers(1, 10),
       attend_current=st.booleans(), spread=st.sampled_from([0.5, 3.0, 12.0]), seed=st.integers(0, 1000))
def test_weights_equal_the_product_of_the_paper(shape, n, attend_current, spread, seed):
    z = torch.randn(*shape, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * spread
    w = pe.stick_breaking_weights(z, attend_current=attend_current)
    torch.testing.assert_close(w, _reference_weights(z, attend_current), rtol=1e-10, atol=1e-13)
    assert bool((w.sum(-1) <= 1 + 1e-12).all()) and bool((w >= 0).all())
    assert bool((w.triu(0 if not attend_current else 1) == 0).all())


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), n=st.integers(1, 9), d=st.sampled_from([2, 4]),
       attend_current=st.booleans(), seed=st.integers(0, 1000))
def test_attention_equals_the_reference(b, h, n, d, attend_current, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, generator=g) for _ in range(3))
    out, w = pe.stick_breaking_attention(q, k, v, attend_current=attend_current, return_weights=True)
    torch.testing.assert_close(out, _reference(q, k, v, attend_current), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w @ v, out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w.sum(-1), torch.ones(b, h, n, dtype=torch.float64))


def test_diagonal_convention_first_token_and_nearest_key():
    """Keys j < i: the first token has no key and outputs its own value; beta = 1/2 halves the stick per key."""
    w = pe.stick_breaking_weights(torch.zeros(4, 4))
    assert w[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert w[3].tolist() == [0.125, 0.25, 0.5, 0.0]  # the nearest key breaks first
    v = torch.randn(1, 1, 4, 3)
    out = pe.stick_breaking_attention(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2), v)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])
    torch.testing.assert_close(out[0, 0, 3], 0.125 * v[0, 0, 0] + 0.25 * v[0, 0, 1] + 0.5 * v[0, 0, 2]
                               + 0.125 * v[0, 0, 3])
    current = pe.stick_breaking_weights(torch.zeros(2, 2), attend_current=True)
    assert current.tolist() == [[0.5, 0.0], [0.25, 0.5]]


def test_stable_at_sixteen_times_the_training_length():
    """1024 tokens (16 x 64), float32, logits up to +-80: finite, rows <= 1, equal to float64."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, 1024, 1024, generator=g) * 40
    w = pe.stick_breaking_weights(z)
    assert bool(torch.isfinite(w).all()) and bool((w.sum(-1) <= 1 + 1e-5).all())
    torch.testing.assert_close(w, pe.stick_breaking_weights(z.double()).float(), rtol=1e-4, atol=1e-6)
    q, k, v = (torch.randn(1, 2, 1024, 16, generator=g) * 3 for _ in range(3))
    out = pe.stick_breaking_attention(q, k, v)
    assert bool(torch.isfinite(out).all())
    half = pe.stick_breaking_weights(z.bfloat16())  # the sums in float32
    assert half.dtype == torch.bfloat16 and bool(torch.isfinite(half).all())
    torch.testing.assert_close(half.float(), w, rtol=0.05, atol=0.02)


def test_future_tokens_change_nothing_before_them():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 10, 4, generator=g) for _ in range(3))
    out = pe.stick_breaking_attention(q, k, v)
    for t in (q, k, v):
        t[:, :, 6:] = torch.randn(1, 2, 4, 4) * 10
    assert torch.equal(out[:, :, :6], pe.stick_breaking_attention(q, k, v)[:, :, :6])


def test_gradcheck():
    g = torch.Generator().manual_seed(2)
    inputs = tuple(torch.randn(1, 2, 5, 3, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(lambda *a: pe.stick_breaking_attention(*a), inputs)
    assert torch.autograd.gradcheck(lambda *a: pe.stick_breaking_attention(*a, attend_current=True), inputs)
    z = (torch.randn(6, 6, dtype=torch.float64, generator=g) * 4).requires_grad_()
    assert torch.autograd.gradcheck(pe.stick_breaking_weights, (z,))


def test_errors():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        pe.stick_breaking_weights(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"\(\.\.\., n, n\)"):
        pe.stick_breaking_weights(torch.zeros(3))
    with pytest.raises(ValueError, match="floating-point"):
        pe.stick_breaking_weights(torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="attend_current"):
        pe.stick_breaking_weights(torch.zeros(3, 3), attend_current="yes")
    with pytest.raises(ValueError, match="one length"):
        pe.stick_breaking_attention(q[:, :, :3], q, q)
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        pe.stick_breaking_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="causal"):
        pe.StickBreakingAttention(16, 2, causal=False)
    assert isinstance(pe.attention_layer("stick_breaking", 16, 2), pe.StickBreakingAttention)
