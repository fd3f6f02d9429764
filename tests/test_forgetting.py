"""Forgetting attention (FoX): the fast form against the paper's double sum, ALiBi, fla's reference, gradients."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import posenc as pe


def _reference(q, k, v, log_forget, scale=None):
    """Lin et al. (2025)'s definition as written: s_ij = scale q_i.k_j + sum_{l=j+1..i} log f_l, causal softmax."""
    b, h, n, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, h, n, v.shape[-1], dtype=q.dtype)
    for i in range(n):
        logits = []
        for j in range(i + 1):
            forget = sum((log_forget[:, :, l] for l in range(j + 1, i + 1)), torch.zeros(b, h, dtype=q.dtype))
            logits.append(scale * (q[:, :, i] * k[:, :, j]).sum(-1) + forget)
        weights = torch.softmax(torch.stack(logits, -1), -1)  # (b, h, i + 1)
        out[:, :, i] = (weights[..., None] * v[:, :, : i + 1]).sum(-2)
    return out


def _inputs(b, h, n, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3))
    log_forget = F.logsigmoid(torch.randn(b, h, n, generator=g, dtype=dtype) * 2 + 1)
    return q, k, v, log_forget


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), n=st.integers(1, 12), d=st.sampled_from([1, 4, 8]),
       scale=st.sampled_from([None, 0.5, -1.0]), seed=st.integers(0, 1000))
def test_equals_the_double_sum_of_the_paper(b, h, n, d, scale, seed):
    q, k, v, log_forget = _inputs(b, h, n, d, seed=seed)
    out, weights = pe.forgetting_attention(q, k, v, log_forget, scale=scale, return_weights=True)
    ref = _reference(q, k, v, log_forget, scale)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    for path in pe.FORGETTING_PATHS:
        torch.testing.assert_close(pe.forgetting_attention(q, k, v, log_forget, scale=scale, path=path), ref,
                                   rtol=1e-10, atol=1e-12)
    assert bool((weights.triu(1) == 0).all())  # exactly causal
    torch.testing.assert_close(weights.sum(-1), torch.ones(b, h, n, dtype=torch.float64))


@pytest.mark.parametrize("heads", [1, 4, 6, 8])
def test_constant_gates_are_alibi(heads):
    """log f = -m_h at every step gives D_ij = -m_h (i - j): ALiBi with the library's slopes, in float64."""
    q, k, v, _ = _inputs(2, heads, 40, 8)
    m = pe.alibi_slopes(heads, dtype=torch.float64)
    log_forget = (-m)[None, :, None].expand(2, heads, 40)
    for fox_path in pe.FORGETTING_PATHS:
        fox = pe.forgetting_attention(q, k, v, log_forget, path=fox_path)
        for path in ("naive", "chunked", "bias"):
            torch.testing.assert_close(fox, pe.relative_attention(q, k, v, slopes=m, path=path), rtol=1e-12,
                                       atol=1e-12)
    bias = pe.forgetting_bias(log_forget)[0]
    alibi = pe.alibi_bias(heads, 40, dtype=torch.float64)
    torch.testing.assert_close(bias, alibi.masked_fill(~pe.causal_mask(40, 40), float("-inf")), rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", pe.FORGETTING_PATHS)
def test_future_tokens_change_nothing_before_them(path):
    q, k, v, log_forget = _inputs(1, 2, 10, 4)
    out = pe.forgetting_attention(q, k, v, log_forget, path=path)
    q2, k2, v2, f2 = (t.clone() for t in (q, k, v, log_forget))
    for t in (q2, k2, v2):
        t[:, :, 6:] = torch.randn_like(t[:, :, 6:]) * 10
    f2[:, :, 6:] = -5.0
    again = pe.forgetting_attention(q2, k2, v2, f2, path=path)
    assert torch.equal(out[:, :, :6], again[:, :, :6])


@pytest.mark.parametrize("path", pe.FORGETTING_PATHS)
def test_finite_at_sixteen_times_the_training_length(path):
    """1024 tokens (16 x 64) in float32 and bfloat16 with gates near 0 and near 1: finite, close to float64."""
    q, k, v, _ = _inputs(1, 2, 1024, 16, dtype=torch.float32)
    for logit in (-20.0, 0.0, 20.0):
        log_forget = F.logsigmoid(torch.full((1, 2, 1024), logit))
        out = pe.forgetting_attention(q * 4, k * 4, v, log_forget, path=path)
        assert bool(torch.isfinite(out).all())
    full = F.logsigmoid(torch.randn(1, 2, 1024))
    exact = pe.forgetting_attention(q.double(), k.double(), v.double(), full.double())
    torch.testing.assert_close(pe.forgetting_attention(q, k, v, full, path=path), exact.float(), rtol=1e-3, atol=1e-3)
    half = pe.forgetting_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), full.bfloat16(), path=path)
    assert half.dtype == torch.bfloat16 and bool(torch.isfinite(half).all())


def test_gradcheck():
    q, k, v, log_forget = _inputs(1, 2, 5, 3)
    log_forget = (log_forget - 0.1).requires_grad_()  # well below 0: the check's nudges keep it <= 0
    inputs = tuple(t.requires_grad_() for t in (q, k, v)) + (log_forget,)
    for path in pe.FORGETTING_PATHS:
        assert torch.autograd.gradcheck(lambda *a: pe.forgetting_attention(*a, path=path), inputs)


def test_errors():
    q, k, v, log_forget = _inputs(1, 2, 5, 4)
    with pytest.raises(ValueError, match="<= 0"):
        pe.forgetting_attention(q, k, v, log_forget.abs() + 0.1)
    with pytest.raises(ValueError, match="<= 0"):
        pe.forgetting_attention(q, k, v, log_forget.masked_fill(log_forget < -0.5, float("nan")))
    with pytest.raises(ValueError, match=r"\(batch, heads, seq\)"):
        pe.forgetting_attention(q, k, v, log_forget[..., :4])
    with pytest.raises(ValueError, match=r"\(batch, heads, seq\)"):
        pe.forgetting_attention(q, k, v, log_forget[..., None])
    with pytest.raises(ValueError, match="one length"):
        pe.forgetting_attention(q[:, :, :3], k, v, log_forget[:, :, :3])
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        pe.forgetting_attention(q[0], k[0], v[0], log_forget[0])
    with pytest.raises(ValueError, match="floating-point"):
        pe.forgetting_attention(q, k, v, torch.zeros(1, 2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, heads, seq\)"):
        pe.forgetting_bias(torch.zeros(5))
    with pytest.raises(ValueError, match="path"):
        pe.forgetting_attention(q, k, v, log_forget, path="flash")
    with pytest.raises(ValueError, match="forget_bias"):
        pe.ForgettingAttention(16, 2, forget_bias="high")
    with pytest.raises(ValueError, match="causal"):
        pe.ForgettingAttention(16, 2, causal=False)


def test_matches_fla_naive_reference():
    """flash-linear-attention's naive_forgetting_attn (q, k, v (B, T, H, D); g (B, T, H) log gates; float32 out)."""
    fla = pytest.importorskip("fla.ops.forgetting_attn")
    q, k, v, log_forget = _inputs(2, 3, 33, 16, dtype=torch.float32)
    ref = fla.naive_forgetting_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    log_forget.transpose(1, 2), scale=0.25)
    ours = pe.forgetting_attention(q, k, v, log_forget, scale=0.25)
    torch.testing.assert_close(ours.transpose(1, 2), ref.to(ours.dtype), rtol=1e-4, atol=1e-5)


def test_layer_gate_starts_as_the_authors_and_learns():
    layer = pe.attention_layer("forgetting", 16, 2)
    assert isinstance(layer, pe.ForgettingAttention) and layer.forget_gate.bias.tolist() == [0.0, 0.0]
    model = pe.TinyLM(8, 16, 1, 2, position="none", attention="forgetting", forget_bias=3.0)
    assert model.blocks[0].attn.forget_gate.bias.tolist() == [3.0, 3.0]
    assert model.config["forget_bias"] == 3.0 and pe.TinyLM(**model.config).config == model.config
    x = torch.randn(2, 7, 16, requires_grad=True)
    layer(x).sum().backward()
    assert layer.forget_gate.weight.grad is not None and bool(layer.forget_gate.weight.grad.abs().sum() > 0)
    w = layer.attention_weights(x.detach())
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 7))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 80), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       path=st.sampled_from(pe.FORGETTING_PATHS), seed=st.integers(0, 1000))
def test_lower_precision_stays_near_float64(n, dtype, path, seed):
    q, k, v, log_forget = _inputs(2, 2, n, 8, seed=seed)
    exact = pe.forgetting_attention(q, k, v, log_forget)
    got = pe.forgetting_attention(q.to(dtype), k.to(dtype), v.to(dtype), log_forget.to(dtype), path=path)
    assert got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert float((got.double() - exact).abs().max()) < tolerance
