"""Scalable-Softmax (SSMax): logits times s_h log n, s_h learned; fixed log-n scaling unchanged."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


def _reference(q, k, v, s, window=None):
    """softmax(s_h log(n_i) z_ij) over the n_i keys query i sees (Nakanishi, 2025), row by row."""
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=q.dtype)
    for i in range(n):
        keys = [j for j in range(i + 1) if window is None or i - j < window]
        z = torch.stack([(q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(d) for j in keys], -1)  # (b, h, n_i)
        weights = torch.softmax(s[:, None] * math.log(len(keys)) * z, -1)
        out[:, :, i] = (weights[..., None] * v[:, :, keys]).sum(-2)
    return out


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), n=st.integers(1, 10), window=st.one_of(st.none(), st.integers(1, 5)),
       seed=st.integers(0, 1000))
def test_layer_equals_the_definition(b, h, n, window, seed):
    g = torch.Generator().manual_seed(seed)
    layer = pe.SoftmaxAttention(4 * h, h, ssmax=True).double()
    with torch.no_grad():
        layer.ssmax_scale.copy_(torch.rand(h, dtype=torch.float64, generator=g) * 2)
    x = torch.randn(b, n, 4 * h, dtype=torch.float64, generator=g)
    q, k, v = layer._qkv(x)
    pos = pe.Positions(window=window)
    ref = _reference(q, k, v, layer.ssmax_scale.detach(), window)
    torch.testing.assert_close(layer.mix(layer._qkv(x), pos), ref, rtol=1e-10, atol=1e-12)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(4)).masked_fill(
        ~pe.sliding_window_mask(n, window=window) if window else ~pe.causal_mask(n, n), float("-inf"))
    torch.testing.assert_close(layer.weights(layer._qkv(x), pos), pe.scalable_softmax(scores, layer.ssmax_scale),
                               rtol=1e-10, atol=1e-12)


def test_factors_and_the_fixed_log_n_scaling():
    assert pe.keys_seen(4).tolist() == [1.0, 2.0, 3.0, 4.0]
    s = torch.tensor([1.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(pe.ssmax_factors(3, s)[:, :, 0],
                               torch.tensor([[0.0, math.log(2), math.log(3)], [0.0, math.log(2) / 2, math.log(3) / 2]],
                                            dtype=torch.float64))
    torch.testing.assert_close(pe.log_n_factors(8, 4), torch.tensor([max(1.0, math.log(n) / math.log(4))
                                                                    for n in range(1, 9)], dtype=torch.float64))


def test_gradcheck():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 2, 5, 5, dtype=torch.float64, generator=g).masked_fill(~pe.causal_mask(5, 5), float("-inf"))
    s = torch.rand(2, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda z, s: pe.scalable_softmax(z, s), (scores.requires_grad_(), s))
    layer = pe.SoftmaxAttention(8, 2, ssmax=True).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, s: torch.func.functional_call(layer, {"ssmax_scale": s}, (x,)), (x, s))
    layer(x).sum().backward()
    assert layer.ssmax_scale.grad is not None and bool(layer.ssmax_scale.grad.abs().sum() > 0)


def test_model_option_is_architecture_and_fixed_scaling_is_unchanged():
    model = pe.TinyLM(10, 16, 2, 2, log_n_scaling="SSMax")
    assert model.log_n_scaling == "ssmax" and model.config["log_n_scaling"] == "ssmax"
    assert all(b.attn.ssmax_scale.tolist() == [1.0, 1.0] for b in model.blocks)
    assert pe.TinyLM(**model.config).config == model.config
    idx = torch.randint(0, 10, (2, 256))  # 16 x a training length of 16
    assert bool(torch.isfinite(model(idx)).all())
    model.log_n_scaling = "ssmax"  # unchanged: allowed
    with pytest.raises(ValueError, match="architecture"):
        model.log_n_scaling = False
    plain = pe.TinyLM(10, 16, 2, 2, train_len=8)
    assert "log_n_scaling" not in plain.config and plain.blocks[0].attn.ssmax_scale is None
    plain.log_n_scaling = True
    assert plain.log_n_scaling is True and plain._log_n_scale(16, torch.device("cpu"), None) is not None
    with pytest.raises(ValueError, match="architecture"):
        plain.log_n_scaling = "ssmax"
    with pytest.raises(ValueError, match="log_n_scaling"):
        pe.TinyLM(10, 16, 1, 2, log_n_scaling="ssmaxx")
    with pytest.raises(ValueError, match="log_n_scaling"):
        plain.log_n_scaling = 1
    with pytest.raises(ValueError, match="softmax"):
        pe.TinyLM(10, 16, 2, 2, attention=["softmax", "linear"], log_n_scaling="ssmax")


def test_errors():
    with pytest.raises(ValueError, match=r"\(heads,\)"):
        pe.ssmax_factors(4, torch.ones(2, 2))
    with pytest.raises(ValueError, match="finite entry"):
        pe.scalable_softmax(torch.full((2, 3), float("-inf")), torch.tensor(1.0))
    with pytest.raises(ValueError, match="causal"):
        pe.SoftmaxAttention(8, 2, ssmax=True, causal=False)
