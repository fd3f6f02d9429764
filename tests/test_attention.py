import math

import pytest
import torch
import torch.nn.functional as F

import posenc as pe


def reference(q, k, v, bias=None, mask=None, causal=True, scale=None):
    """Explicit softmax attention, the textbook formula."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if bias is not None:
        scores = scores + bias
    lq, lk = q.shape[-2], k.shape[-2]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = allowed & pe.causal_mask(lq, lk)
    if mask is not None:
        allowed = allowed & mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v


def qkv(b=2, h=4, lq=9, lk=9, d=8):
    return (torch.randn(b, h, lq, d, dtype=torch.float64), torch.randn(b, h, lk, d, dtype=torch.float64),
            torch.randn(b, h, lk, d, dtype=torch.float64))


def test_plain_causal_equals_sdpa_and_reference():
    q, k, v = qkv()
    out = pe.attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12)
    assert torch.allclose(out, reference(q, k, v), atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_equals_reference(causal):
    q, k, v = qkv()
    bias = pe.alibi_bias(4, 9, dtype=torch.float64)
    assert torch.allclose(pe.attention(q, k, v, bias=bias, causal=causal),
                          reference(q, k, v, bias=bias, causal=causal), atol=1e-12)


def test_cache_alignment_bottom_right():
    # attention of the last 3 queries over 9 keys equals the last rows of the full computation
    q, k, v = qkv()
    bias = pe.alibi_bias(4, 9, dtype=torch.float64)
    full = pe.attention(q, k, v, bias=bias)
    part = pe.attention(q[:, :, -3:], k, v, bias=pe.alibi_bias(4, 3, 9, dtype=torch.float64))
    assert torch.allclose(part, full[:, :, -3:], atol=1e-12)


def test_window_mask_and_weights():
    q, k, v = qkv()
    mask = pe.sliding_window_mask(9, window=3)
    out, w = pe.attention(q, k, v, mask=mask, return_weights=True)
    assert w.shape == (2, 4, 9, 9)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64))
    assert torch.all(w[..., ~mask] == 0)
    assert torch.allclose(out, reference(q, k, v, mask=mask), atol=1e-12)
    assert torch.allclose(out, pe.attention(q, k, v, mask=mask), atol=1e-12)


def test_weights_path_with_bias_equals_sdpa_path():
    q, k, v = qkv()
    bias = pe.alibi_bias(4, 9, dtype=torch.float64)
    out, w = pe.attention(q, k, v, bias=bias, return_weights=True, scale=0.3)
    assert torch.allclose(out, pe.attention(q, k, v, bias=bias, scale=0.3), atol=1e-12)
    assert torch.all(w.triu(1) == 0)


def test_permutation_equivariance_without_position():
    q, k, v = qkv(b=1, h=1, lq=6, lk=6)
    perm = torch.randperm(6)
    out = pe.attention(q, k, v, causal=False)
    out_p = pe.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], causal=False)
    assert torch.allclose(out_p, out[:, :, perm], atol=1e-12)


def test_float32_bias_with_bfloat16_inputs():
    q, k, v = (t.to(torch.bfloat16) for t in qkv())
    out = pe.attention(q, k, v, bias=pe.alibi_bias(4, 9))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_bad_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        pe.attention(q[0], k, v)
    with pytest.raises(ValueError, match="head_dim"):
        pe.attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="q_len"):
        pe.attention(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match="bias"):
        pe.attention(q, k, v, bias=torch.zeros(4, 8, 9))
    with pytest.raises(ValueError, match="heads"):
        pe.attention(q, k, v, bias=torch.zeros(3, 9, 9))
    with pytest.raises(ValueError, match="boolean"):
        pe.attention(q, k, v, mask=torch.ones(9, 9))
