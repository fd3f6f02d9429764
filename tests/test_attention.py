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


# ------------------------------------------------------------------ reliability


@pytest.mark.parametrize("return_weights", [False, True])
def test_a_query_allowed_no_key_gets_zeros(return_weights):
    """A mask row without True, or a bias row of -inf, gives a zero row (not NaN) with or without weights."""
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[2] = False
    bias = torch.zeros(4, 9, 9, dtype=torch.float64)
    bias[:, 5] = float("-inf")
    for kw in (dict(mask=mask), dict(bias=bias), dict(mask=mask, bias=bias, causal=False)):
        out = pe.attention(q, k, v, return_weights=return_weights, **kw)
        out, w = out if return_weights else (out, None)
        dead = [2] if "mask" in kw else [5]
        assert torch.isfinite(out).all() and (out[:, :, dead] == 0).all()
        if w is not None:
            assert (w[:, :, dead] == 0).all() and torch.isfinite(w).all()
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)
    ref = reference(q, k, v, mask=mask)
    live = torch.arange(9) != 2
    assert torch.allclose(pe.attention(q, k, v, mask=mask)[:, :, live], ref[:, :, live], atol=1e-12)


def test_inputs_converted_when_safe():
    q, k, v = qkv()
    bias = pe.alibi_bias(4, 9, dtype=torch.float64)
    ref = pe.attention(q, k, v, bias=bias)
    assert torch.allclose(pe.attention(q, k, v, bias=bias.numpy()), ref)  # NumPy bias
    int_bias = torch.randint(-3, 1, (4, 9, 9))
    assert torch.allclose(pe.attention(q, k, v, bias=int_bias), pe.attention(q, k, v, bias=int_bias.double()))
    mask = pe.sliding_window_mask(9, window=3)
    assert torch.equal(pe.attention(q, k, v, mask=mask.numpy()), pe.attention(q, k, v, mask=mask))
    # a (heads, q, k) bias with a (batch, 1, q, k) mask: combined by broadcasting (rows left empty give 0)
    mask4 = torch.rand(2, 1, 9, 9) < 0.8
    assert torch.allclose(pe.attention(q, k, v, bias=bias, mask=mask4),
                          reference(q, k, v, bias=bias, mask=mask4).nan_to_num(0.0), atol=1e-12)


def test_empty_and_meta_inputs():
    q, k, v = qkv()
    assert pe.attention(q[:, :, :0], k, v).shape == (2, 4, 0, 8)
    assert pe.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0]).shape == (2, 4, 0, 8)
    out, w = pe.attention(q[:0], k[:0], v[:0], return_weights=True)
    assert out.shape == (0, 4, 9, 8) and w.shape == (0, 4, 9, 9)
    meta = [t.to("meta") for t in (q, k, v)]
    bias = pe.alibi_bias(4, 9).to("meta")
    assert pe.attention(*meta, bias=bias).shape == (2, 4, 9, 8)
    assert pe.attention(*meta, bias=bias, return_weights=True)[1].shape == (2, 4, 9, 9)


def test_clear_errors_for_bad_inputs():
    q, k, v = qkv()
    cases = [
        ((q.numpy(), k, v), {}, TypeError, "torch.Tensor"),
        ((q.long(), k.long(), v.long()), {}, ValueError, "floating-point"),
        ((q > 0, k > 0, v > 0), {}, ValueError, "floating-point"),
        ((q, k.float(), v), {}, ValueError, "one dtype and device"),
        ((q, k, v.to("meta")), {}, ValueError, "one dtype and device"),
        ((q, k, v[:, :2]), {}, ValueError, "batch, seq, heads, head_dim"),
        ((q, k, v), dict(bias=torch.zeros(3, 4, 9, 9)), ValueError, "does not broadcast"),
        ((q, k, v), dict(bias=torch.zeros(1, 2, 4, 9, 9)), ValueError, "does not broadcast"),
        ((q, k, v), dict(bias=torch.zeros(4, 9, 9, dtype=torch.bool)), ValueError, "mask="),
        ((q, k, v), dict(bias=torch.zeros(4, 9, 9, device="meta")), ValueError, "meta"),
        ((q, k, v), dict(bias="alibi"), TypeError, "bias"),
        ((q, k, v), dict(mask=torch.ones(3, 1, 9, 9, dtype=torch.bool)), ValueError, "does not broadcast"),
        ((q, k, v), dict(scale=float("nan")), ValueError, "scale"),
        ((q, k, v), dict(causal="yes"), TypeError, "causal"),
    ]
    for args, kw, error, match in cases:
        with pytest.raises(error, match=match):
            pe.attention(*args, **kw)
    # (batch, seq, heads, dim) by mistake: caught through the bias's shape
    with pytest.raises(ValueError, match="batch, seq, heads, head_dim"):
        pe.attention(*(t.transpose(1, 2) for t in (q, k, v)), bias=pe.alibi_bias(4, 9))
    with pytest.raises(ValueError, match="floating-point"):
        pe.combine_bias_and_mask(torch.zeros(2, 3, 3), None, torch.int64)
    with pytest.raises(ValueError, match="do not broadcast"):
        pe.combine_bias_and_mask(torch.zeros(2, 3, 3), torch.ones(4, 3, 3, dtype=torch.bool), torch.float32)
    with pytest.raises(ValueError, match="boolean"):
        pe.combine_bias_and_mask(None, torch.ones(3, 3), torch.float32)


@pytest.mark.parametrize("scale", [-1.0, 0.0, -0.0, -0.25])
def test_non_positive_scales(scale):
    """PyTorch's fused causal kernel gives NaN for scale <= 0 on the CPU; attention does not."""
    q, k, v = qkv()
    for kw in (dict(), dict(bias=pe.alibi_bias(4, 9, dtype=torch.float64)), dict(causal=False)):
        out = pe.attention(q, k, v, scale=scale, **kw)
        assert torch.allclose(out, reference(q, k, v, scale=scale, **kw), atol=1e-12), kw
    assert torch.allclose(pe.relative_attention(q, k, v, scale=scale), reference(q, k, v, scale=scale), atol=1e-12)
