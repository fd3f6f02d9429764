"""Learned sink logits (gpt-oss): a logit per head in every softmax row's normaliser."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


def _reference(q, k, v, a, slopes=None, table=None, window=None):
    """The definition, as gpt-oss's eager attention computes it: the sink as an extra column, then dropped."""
    n, kn = q.shape[2], k.shape[2]
    d = torch.arange(n)[:, None] + (kn - n) - torch.arange(kn)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if slopes is not None:
        scores = scores - slopes[:, None, None] * d.clamp(min=0)
    if table is not None:
        scores = scores + table[:, d.clamp(min=0)]
    allowed = (d >= 0) & ((d < window) if window is not None else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    sink = a[None, :, None, None].expand(*scores.shape[:3], 1)
    weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    return weights @ v, weights


@settings(max_examples=40, deadline=None)
@given(heads=st.integers(1, 3), n=st.integers(1, 40), dim=st.sampled_from([2, 4, 8]),
       bias=st.sampled_from(["none", "slopes", "table"]), window=st.one_of(st.none(), st.integers(1, 12)),
       seed=st.integers(0, 1000))
def test_equals_the_extra_column_definition(heads, n, dim, bias, window, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, dim, dtype=torch.float64, generator=g) for _ in range(3))
    a = torch.randn(heads, dtype=torch.float64, generator=g) * 2
    slopes = torch.rand(heads, dtype=torch.float64, generator=g) if bias == "slopes" else None
    table = torch.randn(heads, n, dtype=torch.float64, generator=g) if bias == "table" else None
    out, w = pe.sink_logit_attention(q, k, v, a, slopes=slopes, distance_bias=table, window=window,
                                     return_weights=True)
    ref_out, ref_w = _reference(q, k, v, a, slopes, table, window)
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    fused = pe.sink_logit_attention(q, k, v, a, slopes=slopes, distance_bias=table, window=window)
    torch.testing.assert_close(fused, ref_out, rtol=1e-10, atol=1e-12)
    assert bool((w.sum(-1) < 1).all())                        # the real tokens get less than all of it


def test_long_sequences_go_in_chunks_and_match():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 600, 8, dtype=torch.float64, generator=g) for _ in range(3))
    a = torch.tensor([0.5, -1.0], dtype=torch.float64)
    slopes = torch.tensor([0.1, 0.01], dtype=torch.float64)
    for window in (None, 100):
        ref_out, _ = _reference(q, k, v, a, slopes=slopes, window=window)
        torch.testing.assert_close(pe.sink_logit_attention(q, k, v, a, slopes=slopes, window=window), ref_out)


def test_a_very_low_sink_logit_is_plain_softmax():
    q, k, v = torch.randn(3, 1, 2, 30, 8).unbind()
    plain = pe.relative_attention(q, k, v, slopes=torch.tensor([0.5, 0.1]))
    low = pe.sink_logit_attention(q, k, v, torch.full((2,), -200.0), slopes=torch.tensor([0.5, 0.1]))
    torch.testing.assert_close(low, plain)


def test_logsumexp_equals_the_explicit_one():
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, 300, 8, dtype=torch.float64, generator=g) for _ in range(2))
    table = torch.randn(3, 300, dtype=torch.float64, generator=g)
    d = torch.arange(300)[:, None] - torch.arange(300)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8) + table[:, d.clamp(min=0)]
    for window in (None, 7):
        allowed = (d >= 0) & ((d < window) if window is not None else True)
        ref = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), -1)
        torch.testing.assert_close(pe.attention_logsumexp(q, k, distance_bias=table, window=window), ref)
    half = pe.attention_logsumexp(q.bfloat16(), k.bfloat16(), distance_bias=table.bfloat16())
    assert half.dtype == torch.float32
    torch.testing.assert_close(half.double(), torch.logsumexp(scores.masked_fill(d < 0, float("-inf")), -1),
                               rtol=0.05, atol=0.1)


def test_gradients_of_every_input_and_the_sink_logits():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    a = torch.randn(2, dtype=torch.float64, generator=g, requires_grad=True)
    slopes = torch.tensor([0.3, 0.05], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *t: pe.sink_logit_attention(*t, slopes=slopes, window=4), (q, k, v, a))


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.tensor([0.0, math.nan]),
                                 [0.0, 0.0]])
def test_bad_sink_logits_are_refused(bad):
    q = k = v = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="sink_logits must be a finite float"):
        pe.sink_logit_attention(q, k, v, bad)


# ------------------------------------------------------------------------------------------- the model

def test_model_with_sink_logits():
    model = pe.TinyLM(11, 16, 2, 2, position="alibi", sink_logit=True)
    assert model.config["sink_logit"] is True and "sink_logit" not in pe.TinyLM(11, 16, 2, 2).config
    params = [b.attn.sink_logits for b in model.blocks]
    assert all(p.shape == (2,) and bool((p == 0).all()) for p in params)
    x = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(0))
    logits, weights = model(x, return_attention=True)
    assert all(bool((w.sum(-1) < 1).all()) for w in weights)
    torch.testing.assert_close(model(x), logits)                  # the fused path gives the same output
    model.loss(x[:, :-1], x[:, 1:]).backward()
    assert all(p.grad is not None and bool((p.grad != 0).any()) for p in params)
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 11
    with torch.no_grad():
        torch.testing.assert_close(model(y)[:, :10], model(x)[:, :10], rtol=0, atol=0)   # causal


def test_sink_logits_sit_in_softmax_layers_only_and_refuse_what_they_do_not_combine_with():
    hybrid = pe.TinyLM(11, 16, 2, 2, position="rope", attention=["linear", "softmax"], sink_logit=True)
    assert getattr(hybrid.blocks[0].attn, "sink_logits", None) is None
    assert hybrid.blocks[1].attn.sink_logits is not None
    with pytest.raises(ValueError, match="no softmax layer"):
        pe.TinyLM(11, 16, 2, 2, position="rope", attention="linear", sink_logit=True)
    with pytest.raises(ValueError, match="sink_logit must be True or False"):
        pe.TinyLM(11, 16, 2, 2, sink_logit=1)
    model = pe.TinyLM(11, 16, 2, 2, position="rope", window=4, sink_logit=True)
    model.sinks = 2
    with pytest.raises(ValueError, match="do not combine"):
        model(torch.zeros(1, 10, dtype=torch.long))
    with pytest.raises(ValueError, match="causal=True"):
        pe.SoftmaxAttention(16, 2, causal=False, sink_logit=True)
