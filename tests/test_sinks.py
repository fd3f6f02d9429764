"""Attention sinks (StreamingLLM): a window plus the first tokens, on the fused attention path."""

import pytest
import torch

import posenc as pe


def qkv(n, k_len=None, seed=0, dtype=torch.float64, heads=3):
    g = torch.Generator().manual_seed(seed)
    k_len = n if k_len is None else k_len
    return (torch.randn(2, heads, n, 8, generator=g, dtype=dtype),
            torch.randn(2, heads, k_len, 8, generator=g, dtype=dtype),
            torch.randn(2, heads, k_len, 4, generator=g, dtype=dtype))


def naive(q, k, v, window, sinks, bias=None):
    n, k_len = q.shape[2], k.shape[2]
    allowed = torch.zeros(n, k_len, dtype=torch.bool)
    for i in range(n):
        pos = i + k_len - n
        for j in range(k_len):
            allowed[i, j] = j <= pos and (pos - j < window or j < sinks)
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5
    if bias is not None:
        scores = scores + bias
    w = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return w @ v, w


def test_mask():
    m = pe.sliding_window_mask(6, window=2, sinks=1)
    assert m.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]]
    assert torch.equal(pe.sliding_window_mask(9, window=3, sinks=0), pe.sliding_window_mask(9, window=3))
    assert pe.sliding_window_mask(3, 5, window=1, sinks=2).int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 1, 0],
                                                                              [1, 1, 0, 0, 1]]
    with pytest.raises(ValueError):
        pe.sliding_window_mask(4, window=2, sinks=-1)


@pytest.mark.parametrize("n,k_len,window,sinks", [(10, 10, 3, 2), (300, 300, 20, 4), (600, 600, 256, 1),
                                                  (5, 9, 2, 3), (270, 400, 7, 300), (40, 40, 50, 4), (8, 8, 1, 0)])
def test_equals_the_naive_masked_reference(n, k_len, window, sinks):
    q, k, v = qkv(n, k_len)
    ref_out, ref_w = naive(q, k, v, window, sinks)
    assert torch.allclose(pe.sink_attention(q, k, v, window=window, sinks=sinks), ref_out, atol=1e-10)
    out, w = pe.sink_attention(q, k, v, window=window, sinks=sinks, return_weights=True)
    assert torch.allclose(out, ref_out, atol=1e-10) and torch.allclose(w, ref_w, atol=1e-10)


def test_with_alibi_slopes_and_a_distance_table_uses_the_true_distances():
    q, k, v = qkv(300, heads=2)
    slopes = pe.alibi_slopes(2).double()
    table = torch.randn(2, 300, dtype=torch.float64)
    d = torch.arange(300)[:, None] - torch.arange(300)
    bias = -slopes[:, None, None] * d.clamp(min=0) + table[:, d.clamp(min=0)]
    ref = naive(q, k, v, 16, 4, bias)[0]
    assert torch.allclose(pe.sink_attention(q, k, v, window=16, sinks=4, slopes=slopes, distance_bias=table), ref,
                          atol=1e-10)


def test_no_sinks_is_the_plain_window():
    q, k, v = qkv(300)
    plain = pe.relative_attention(q, k, v, window=30)
    assert torch.allclose(pe.sink_attention(q, k, v, window=30, sinks=0), plain, atol=1e-10)


@pytest.mark.parametrize("kw", [dict(window=4, sinks=-1), dict(window=0, sinks=2), dict(window=None, sinks=2),
                                dict(window=4, sinks=1.5), dict(window=4, sinks=True)])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        pe.sink_attention(*qkv(6), **kw)


def test_model_sinks_are_evaluation_time_causal_and_exact():
    torch.manual_seed(0)
    m = pe.TinyLM(17, 32, 2, 2, position="rope", train_len=16)
    key = m.config
    x = torch.randint(17, (2, 300))
    with torch.no_grad():
        m.window = 32
        windowed = m(x)
        m.sinks = 0
        assert torch.equal(m(x), windowed)
        m.sinks = 4
        assert m.config == key and "sinks=4" in repr(m)
        out = m(x)
        assert not torch.allclose(out[:, 40:], windowed[:, 40:])
        assert torch.allclose(out[:, :32], windowed[:, :32], atol=1e-6)  # the window still covers the start
        y = x.clone()
        y[:, 200:] = (y[:, 200:] + 1) % 17
        assert torch.allclose(m(y)[:, :200], out[:, :200], atol=1e-6)
        logits, weights = m(x, return_attention=True)
        assert torch.allclose(logits, out, atol=1e-5)
        allowed = pe.sliding_window_mask(300, window=32, sinks=4)
        assert weights[0][:, :, ~allowed].abs().max() == 0
        m.window = None  # sinks without a window: every key is visible anyway
        assert torch.allclose(m(x), m(x), atol=0)


def test_model_sinks_with_alibi_and_bad_values():
    torch.manual_seed(0)
    m = pe.TinyLM(17, 32, 1, 2, position="alibi", train_len=16)
    m.window, m.sinks = 20, 2
    x = torch.randint(17, (1, 280))
    with torch.no_grad():
        assert torch.isfinite(m(x)).all()
    for bad in (-1, 1.5, None, True):
        with pytest.raises(ValueError, match="sinks"):
            m.sinks = bad
    lin = pe.TinyLM(17, 32, 1, 2, position="rope", attention="linear")
    with pytest.raises(ValueError, match="softmax"):
        lin.sinks = 2


# --------------------------------------------------------------------------- positions in the rolling cache


def decode_with_rolling_cache(q, k, v, window, sinks, base=10000.0):
    """StreamingLLM token by token: the cache holds the sinks and the latest keys, positioned within the cache."""
    n = q.shape[2]
    outs = []
    for i in range(n):
        kept = sorted(set(range(min(sinks, i + 1))) | set(range(max(0, i - window + 1), i + 1)))
        pos = torch.arange(len(kept), dtype=torch.float64)  # positions inside the cache
        kc = pe.apply_rope(k[:, :, kept], pos, base)
        qc = pe.apply_rope(q[:, :, i:i + 1], pos[-1:], base)
        outs.append(pe.attention(qc, kc, v[:, :, kept], causal=False))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("n,window,sinks", [(30, 6, 2), (40, 1, 3), (12, 20, 4), (25, 5, 0), (300, 16, 4)])
def test_streaming_attention_equals_decoding_with_the_rolling_cache(n, window, sinks):
    q, k, v = qkv(n)
    ref = decode_with_rolling_cache(q, k, v, window, sinks)
    out, w = pe.streaming_attention(q, k, v, window, sinks, return_weights=True)
    assert torch.allclose(out, ref, atol=1e-10)
    assert torch.allclose(pe.streaming_attention(q, k, v, window, sinks), ref, atol=1e-10)
    assert w[:, :, ~pe.sliding_window_mask(n, window=window, sinks=sinks)].abs().max() == 0
    if sinks == 0 or n <= sinks + window - 1:  # nothing re-indexed: original positions
        plain = pe.sink_attention(pe.apply_rope(q), pe.apply_rope(k), v, window=window, sinks=sinks)
        assert torch.allclose(out, plain, atol=1e-10)


def test_model_sink_positions():
    torch.manual_seed(0)
    m = pe.TinyLM(17, 32, 2, 2, position="rope", train_len=16)
    with torch.no_grad():
        for block in m.blocks:
            block.attn.qkv.weight.mul_(30)
    x = torch.randint(17, (1, 120))
    key = m.config
    with torch.no_grad():
        m.window, m.sinks = 16, 4
        original = m(x)
        m.sink_positions = "cache"
        assert m.config == key and "sink_positions='cache'" in repr(m)
        cache = m(x)
        assert torch.allclose(cache[:, :19], original[:, :19], atol=1e-5)  # nothing evicted yet
        assert not torch.allclose(cache[:, 40:], original[:, 40:], atol=1e-4)
        y = x.clone()
        y[:, 80:] = (y[:, 80:] + 1) % 17
        assert torch.allclose(m(y)[:, :80], cache[:, :80], atol=1e-6)
        m.rope_scaling = ("yarn", 2)
        assert torch.isfinite(m(x)).all()
        m.rope_scaling = ("rerope", 8)
        with pytest.raises(ValueError, match="do not combine"):
            m(x)
    with pytest.raises(ValueError, match="'original' or 'cache'"):
        m.sink_positions = "rolling"
    alibi = pe.TinyLM(17, 32, 1, 2, position="alibi")
    with pytest.raises(ValueError, match="RoPE"):
        alibi.sink_positions = "cache"


def test_attention_on_first_tokens():
    torch.manual_seed(0)
    m = pe.TinyLM(11, 32, 2, 2, position="rope")
    x = torch.randint(11, (3, 40))
    share = pe.attention_on_first_tokens(m, x, 4, from_position=10)
    with torch.no_grad():
        _, weights = m(x, return_attention=True)
    expected = torch.stack([w[:, :, 10:, :4].sum(-1).mean((0, 2)) for w in weights])
    assert share.shape == (2, 2) and torch.allclose(share, expected)
    assert torch.allclose(pe.attention_on_first_tokens(m, x, 40), torch.ones(2, 2))  # every key: all of it
    m.window, m.sinks = 8, 2
    windowed = pe.attention_on_first_tokens(m, x, 2, from_position=20)
    assert (windowed > 0).all()  # the sinks stay visible beyond the window
    m.sinks = 0
    assert pe.attention_on_first_tokens(m, x, 2, from_position=20).abs().max() == 0  # a plain window cannot see them
    for bad in (dict(first=0), dict(from_position=40), dict(from_position=-1)):
        with pytest.raises(ValueError):
            pe.attention_on_first_tokens(m, x, **bad)
    with pytest.raises(ValueError):
        pe.attention_on_first_tokens(m, x[0])
