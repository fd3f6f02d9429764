import math

import numpy as np
import pytest
import torch

import posenc as pe


def test_slopes_8_heads_published():
    # Press et al. (2022), Sec. 3: 1/2, 1/4, ..., 1/256 for 8 heads
    assert pe.alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]


def test_slopes_16_heads_published():
    # 1/sqrt(2), 1/2, ..., 1/256 for 16 heads
    expected = [2.0 ** (-k / 2) for k in range(1, 17)]
    assert torch.allclose(pe.alibi_slopes(16, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("n", [1, 2, 4, 32, 64])
def test_power_of_two_is_geometric_with_start_equal_ratio(n):
    s = pe.alibi_slopes(n, dtype=torch.float64)
    start = 2.0 ** (-8.0 / n)
    assert s[0].item() == pytest.approx(start)
    assert torch.allclose(s[1:] / s[:-1], torch.full((n - 1,), start, dtype=torch.float64))
    assert s[-1].item() == pytest.approx(2.0 ** -8)


def _authors_rule(n):
    # The rule of the ALiBi authors' code, written independently from the paper's text.
    def geometric(k):
        return [2.0 ** (-8.0 * (h + 1) / k) for h in range(k)]

    p = 2 ** math.floor(math.log2(n))
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 20, 24, 40])
def test_non_power_of_two_follow_authors_rule(n):
    got = pe.alibi_slopes(n, dtype=torch.float64)
    assert torch.allclose(got, torch.tensor(_authors_rule(n), dtype=torch.float64))
    assert len(set(got.tolist())) == n  # no repeated slope


def test_six_heads_differ_from_one_line_formula():
    naive = [2.0 ** (-8.0 * (h + 1) / 6) for h in range(6)]
    assert not torch.allclose(pe.alibi_slopes(6, dtype=torch.float64), torch.tensor(naive, dtype=torch.float64))
    assert pe.alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_bad_head_count(bad):
    with pytest.raises(ValueError, match="n_heads"):
        pe.alibi_slopes(bad)


def test_bias_values_and_shape():
    b = pe.alibi_bias(4, 5)
    slopes = pe.alibi_slopes(4)
    assert b.shape == (4, 5, 5)
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    assert torch.allclose(b, -slopes[:, None, None] * (i - j).abs())
    assert torch.all(torch.diagonal(b, dim1=-2, dim2=-1) == 0)
    assert not torch.signbit(torch.diagonal(b, dim1=-2, dim2=-1)).any()  # +0.0, not -0.0


def test_bias_with_cache_is_last_rows():
    full = pe.alibi_bias(2, 9)
    assert torch.equal(pe.alibi_bias(2, 3, 9), full[:, -3:])


def test_bias_explicit_slopes():
    b = pe.alibi_bias(torch.tensor([1.0, 0.5]), 3)
    assert b[0, 2, 0] == -2.0 and b[1, 2, 0] == -1.0


def test_bias_row_softmax_invariance_under_causal_mask():
    # The authors add +m*j instead of -m*|i-j|: under a causal mask each row differs
    # by a constant, so the attention weights are identical.
    n = 6
    slopes = pe.alibi_slopes(2)
    j = torch.arange(n)
    authors = (slopes[:, None, None] * j).expand(2, n, n)
    mask = pe.causal_mask(n)
    w_ours = pe.alibi_bias(2, n).masked_fill(~mask, float("-inf")).softmax(-1)
    w_authors = authors.masked_fill(~mask, float("-inf")).softmax(-1)
    assert torch.allclose(w_ours, w_authors, atol=1e-6)


def test_bad_slopes():
    with pytest.raises(ValueError, match="1-D"):
        pe.alibi_bias(torch.ones(2, 2), 3)


# ------------------------------------------------------------------ reliability


def test_learnable_slopes_keep_their_graph():
    """alibi_bias(slopes) with slopes that require grad: d bias / d m_h = -|i - j| (and a finite difference)."""
    slopes = torch.tensor([0.5, 0.125, 0.03], dtype=torch.float64, requires_grad=True)
    bias = pe.alibi_bias(slopes, 5, 7, dtype=torch.float64)
    assert bias.requires_grad
    weight = torch.randn(3, 5, 7, dtype=torch.float64)
    (grad,) = torch.autograd.grad((bias * weight).sum(), slopes)
    dist = pe.relative_positions(5, 7).abs().double()
    assert torch.allclose(grad, -(weight * dist).sum((-2, -1)), atol=1e-12)
    h, step = 1, 1e-6
    plus, minus = slopes.detach().clone(), slopes.detach().clone()
    plus[h] += step
    minus[h] -= step
    finite = ((pe.alibi_bias(plus, 5, 7, dtype=torch.float64) - pe.alibi_bias(minus, 5, 7, dtype=torch.float64))
              * weight).sum() / (2 * step)
    assert grad[h].item() == pytest.approx(finite.item(), rel=1e-6)
    # through attention, a learned slope trains
    q = torch.randn(1, 3, 5, 4, dtype=torch.float64)
    k, v = torch.randn(1, 3, 7, 4, dtype=torch.float64), torch.randn(1, 3, 7, 4, dtype=torch.float64)
    out = pe.attention(q, k, v, bias=pe.alibi_bias(slopes, 5, 7, dtype=torch.float64))
    (g_att,) = torch.autograd.grad(out.square().sum(), slopes)
    (g_rel,) = torch.autograd.grad(pe.relative_attention(q, k, v, slopes=slopes).square().sum(), slopes)
    assert torch.allclose(g_att, g_rel, atol=1e-10) and (g_att != 0).all()


def test_head_counts_and_slopes_of_other_types():
    assert torch.equal(pe.alibi_bias(np.int64(4), 5), pe.alibi_bias(4, 5))
    assert torch.equal(pe.alibi_bias(torch.tensor(4), 5), pe.alibi_bias(4, 5))
    slopes = pe.alibi_slopes(4)
    for given in (slopes.tolist(), slopes.numpy(), tuple(slopes.tolist())):
        assert torch.equal(pe.alibi_bias(given, 5), pe.alibi_bias(slopes, 5))
    assert torch.equal(pe.alibi_bias(torch.tensor([1, 2]), 3), pe.alibi_bias(torch.tensor([1.0, 2.0]), 3))
    assert pe.alibi_bias(slopes.to("meta"), 5).is_meta


@pytest.mark.parametrize("call,match", [
    (lambda: pe.alibi_bias(8.0, 512), "n_heads must be an integer"),
    (lambda: pe.alibi_bias(True, 5), "n_heads must be an integer"),
    (lambda: pe.alibi_bias("eight", 5), "n_heads must be an integer"),
    (lambda: pe.alibi_bias(torch.tensor(8.0), 5), "n_heads must be an integer"),
    (lambda: pe.alibi_bias([], 5), "non-empty 1-D"),
    (lambda: pe.alibi_bias([0.5, float("nan")], 5), "finite"),
    (lambda: pe.alibi_bias(torch.tensor([True, False]), 5), "real numbers"),
    (lambda: pe.alibi_bias(8, 16, dtype=torch.int64), "floating-point"),
    (lambda: pe.alibi_bias(8, 16, dtype=torch.bool), "floating-point"),
    (lambda: pe.alibi_slopes(8, dtype=torch.int32), "floating-point"),
    (lambda: pe.alibi_bias(8, 0), "q_len"),
    (lambda: pe.alibi_bias(8, 5, 4), "k_len"),
])
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    with pytest.raises(TypeError, match="slopes"):
        pe.alibi_bias(["a", "b"], 5)
