"""ReRoPE and Self-Extend: exact against a reference that rotates by the substituted relative position."""

import math

from hypothesis import given, settings, strategies as st

import pytest
import torch

import posenc as pe


def reference(q, k, v, rel, allowed, base=10000.0, interleaved=False, rotary_dim=None):
    """Logits <q_i, R_{-r_ij} k_j> with the relative positions ``rel`` built explicitly, then a masked softmax.

    <R_i q, R_j k> = <q, R_{j-i} k>: the score at relative position r = i - j rotates the key by -r.
    """
    d = q.shape[-1]
    r = d if rotary_dim is None else rotary_dim
    n_q = q.shape[2]
    kk = k[:, :, None].expand(-1, -1, n_q, -1, -1)  # (b, h, i, j, d)
    # (1, i, j): relative positions per pair, right-aligned (2-D positions of a 5-D x would be (batch, seq))
    rot = pe.apply_rope(kk[..., :r], -rel.to(torch.float64)[None], base, interleaved)
    kk = torch.cat((rot, kk[..., r:]), dim=-1)
    scores = torch.einsum("bhid,bhijd->bhij", q, kk) / math.sqrt(d)
    w = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return w @ v, w


def qkv(n, d=8, k_len=None, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    k_len = n if k_len is None else k_len
    return (torch.randn(2, 3, n, d, generator=g, dtype=dtype), torch.randn(2, 3, k_len, d, generator=g, dtype=dtype),
            torch.randn(2, 3, k_len, 5, generator=g, dtype=dtype))


@pytest.mark.parametrize("n,k_len,window", [(12, 12, 3), (20, 20, 1), (7, 15, 4), (300, 300, 40), (9, 9, 50)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rerope_equals_the_clipped_relative_reference(n, k_len, window, interleaved):
    q, k, v = qkv(n, k_len=k_len)
    rel = pe.rerope_positions(n, window, k_len)
    allowed = pe.causal_mask(n, k_len)
    out, w = pe.rerope_attention(q, k, v, window, interleaved=interleaved, return_weights=True)
    ref_out, ref_w = reference(q, k, v, rel, allowed, interleaved=interleaved)
    assert torch.allclose(out, ref_out, atol=1e-10) and torch.allclose(w, ref_w, atol=1e-10)
    assert torch.allclose(pe.rerope_attention(q, k, v, window, interleaved=interleaved), ref_out, atol=1e-10)


@pytest.mark.parametrize("n,group,window", [(16, 2, 4), (33, 3, 5), (300, 4, 64), (10, 1, 2)])
def test_self_extend_equals_the_grouped_relative_reference(n, group, window):
    q, k, v = qkv(n)
    rel = pe.self_extend_positions(n, group, window)
    out, w = pe.self_extend_attention(q, k, v, group, window, return_weights=True)
    ref_out, ref_w = reference(q, k, v, rel, pe.causal_mask(n))
    assert torch.allclose(out, ref_out, atol=1e-10) and torch.allclose(w, ref_w, atol=1e-10)


def test_partial_rotation_sinks_and_a_mask_window_match_the_reference():
    q, k, v = qkv(40, d=12)
    rel = pe.rerope_positions(40, 6)
    allowed = pe.sliding_window_mask(40, window=10, sinks=3)
    out = pe.rerope_attention(q, k, v, 6, rotary_dim=4, mask_window=10, sinks=3, base=100.0)
    assert torch.allclose(out, reference(q, k, v, rel, allowed, base=100.0, rotary_dim=4)[0], atol=1e-10)


def test_window_beyond_the_length_is_plain_rope_and_group_one_is_plain_rope():
    q, k, v = qkv(24)
    plain = pe.attention(pe.apply_rope(q), pe.apply_rope(k), v)
    assert torch.allclose(pe.rerope_attention(q, k, v, 24), plain, atol=1e-10)
    assert torch.allclose(pe.self_extend_attention(q, k, v, 1, 3), plain, atol=1e-10)


def test_relative_positions():
    r = pe.rerope_positions(6, 2)
    assert r[5].tolist() == [2, 2, 2, 2, 1, 0] and r[0, 1] == -1
    s = pe.self_extend_positions(12, 3, 4)
    i, j = torch.arange(12)[:, None], torch.arange(12)
    near = (i - j < 4) & (j <= i)
    assert torch.equal(s[near], (i - j).expand(12, 12)[near])
    far = i - j >= 4
    assert torch.equal(s[far], ((i // 3) - (j // 3) + 4 - 4 // 3).expand(12, 12)[far])
    assert int(s[far].max()) <= 11 // 3 + 4 and int(s[far].min()) >= 0
    assert pe.rerope_positions(3, 1, k_len=5).shape == (3, 5)


def test_causal_at_lengths_beyond_training():
    """Changing a later token never changes earlier outputs, also in a model with these scalings."""
    torch.manual_seed(0)
    m = pe.TinyLM(19, 32, 2, 2, position="rope", train_len=16)
    x = torch.randint(19, (1, 80))
    y = x.clone()
    y[0, 50:] = (y[0, 50:] + 1) % 19
    with torch.no_grad():
        for spec in (("rerope", 8), ("self_extend", 4, 8)):
            m.rope_scaling = spec
            m.window, m.sinks = None, 0
            assert torch.allclose(m(x)[:, :50], m(y)[:, :50], atol=1e-6)
            m.window, m.sinks = 24, 2
            assert torch.allclose(m(x)[:, :50], m(y)[:, :50], atol=1e-6)
            logits, weights = m(x, return_attention=True)
            assert torch.allclose(logits, m(x), atol=1e-5)
            assert weights[0][0, :, 40, 2:40 - 23].abs().max() == 0 and weights[0][0, :, 40, :2].sum() > 0


def test_model_rerope_is_plain_rope_within_the_window():
    torch.manual_seed(0)
    m = pe.TinyLM(19, 32, 2, 2, position="rope", train_len=16)
    x = torch.randint(19, (2, 30))
    with torch.no_grad():
        for block in m.blocks:  # sharper attention than at initialisation: position differences show
            block.attn.qkv.weight.mul_(50)
        plain = m(x)
        m.rope_scaling = ("rerope", 30)
        assert torch.allclose(m(x), plain, atol=1e-5)
        m.rope_scaling = ("rerope", 10)
        assert torch.allclose(m(x)[:, :10], plain[:, :10], atol=1e-5)
        assert not torch.allclose(m(x)[:, 10:], plain[:, 10:], atol=1e-4)


@pytest.mark.parametrize("call", [
    lambda q, k, v: pe.rerope_attention(q, k, v, 0),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2.5),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2, rotary_dim=3),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2, rotary_dim=10),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2, sinks=-1),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2, mask_window=0),
    lambda q, k, v: pe.streaming_attention(q, k, v, 0, 2),
    lambda q, k, v: pe.streaming_attention(q, k, v, 2, -1),
    lambda q, k, v: pe.rerope_attention(q[0], k, v, 2),
    lambda q, k, v: pe.rerope_attention(q, k[:, :, :3], v, 2),
    lambda q, k, v: pe.rerope_attention(q.long(), k, v, 2),
    lambda q, k, v: pe.rerope_attention(q, k, v, 2, inv_freq=torch.ones(3)),
    lambda q, k, v: pe.self_extend_attention(q, k, v, 0, 2),
    lambda q, k, v: pe.self_extend_attention(q, k, v, 2, 0),
    lambda q, k, v: pe.rerope_positions(4, 0),
    lambda q, k, v: pe.self_extend_positions(4, 2, 2, k_len=3),
])
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call(*qkv(6))


def test_attend_needs_a_two_pass_scaling():
    scheme = pe.RoPE()
    scheme.bind(d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="two-pass"):
        scheme.attend(*qkv(4))


def test_gradients_equal_the_reference_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(40))
    rel = pe.self_extend_positions(40, 3, 6)
    out = pe.self_extend_attention(q, k, v, 3, 6, mask_window=20, sinks=2)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = reference(q, k, v, rel, pe.sliding_window_mask(40, window=20, sinks=2))[0]
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-9)


def test_a_model_trains_with_rerope():
    """Fine-tuning with ReRoPE switched on (Su's suggestion) goes through autograd on the fused path."""
    data = pe.MarkovChain(vocab_size=12, order=1, seed=0)
    model = pe.TinyLM(12, 32, 1, 2, position="rope", train_len=16)
    model.rope_scaling = ("rerope", 8)
    result = pe.train(model, data, steps=30, seq_len=32, batch_size=8, lr=1e-2, cache=False, progress=False)
    assert all(map(math.isfinite, result.losses)) and result.losses[-1] < result.losses[0]
    assert result.config["train"]["rope_scaling"] == {"method": "rerope", "window": 8}


def _spy_on_the_flash_path():
    from unittest import mock

    from posenc import rerope
    return mock.patch.object(rerope, "_band_and_triangle", wraps=rerope._band_and_triangle)


@pytest.mark.skipif(getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None) is None,
                    reason="this torch has no CPU flash attention with log-sum-exp")
@given(n=st.integers(1, 200), window=st.integers(1, 80), group=st.integers(1, 5), heads=st.integers(1, 3),
       dtype=st.sampled_from([torch.float64, torch.float32]), self_extend=st.booleans())
@settings(max_examples=40)
def test_inference_on_a_cpu_merges_band_and_triangle_exactly(n, window, group, heads, dtype, self_extend):
    """Without gradients the two passes run as flash attention over a band and a shifted triangle, merged by their
    log-sum-exps: equal to the explicit two-pass softmax (return_weights) and to the reference."""
    g = torch.Generator().manual_seed(n * 7 + window)
    q, k, v = (torch.randn(2, heads, n, 8, generator=g, dtype=dtype) for _ in range(3))
    call = ((lambda **kw: pe.self_extend_attention(q, k, v, group, window, **kw)) if self_extend
            else (lambda **kw: pe.rerope_attention(q, k, v, window, **kw)))
    with torch.no_grad(), _spy_on_the_flash_path() as spy:
        fast = call()
        explicit = call(return_weights=True)[0]
    assert spy.call_count == 1, "the flash path was not taken"
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    assert torch.allclose(fast, explicit, atol=tol, rtol=0)
    if dtype == torch.float64 and n <= 60:
        rel = pe.self_extend_positions(n, group, window) if self_extend else pe.rerope_positions(n, window)
        assert torch.allclose(fast, reference(q, k, v, rel, pe.causal_mask(n))[0], atol=1e-10)


def test_the_flash_path_is_kept_for_inference_only():
    q, k, v = qkv(30, d=8)
    v = torch.randn(2, 3, 30, 8, dtype=torch.float64)
    q.requires_grad_()
    with _spy_on_the_flash_path() as spy:
        out = pe.rerope_attention(q, k, v, 4)       # gradients wanted: the log-sum-exp has none, the fused path runs
        assert spy.call_count == 0 and out.requires_grad
        with torch.no_grad():
            pe.rerope_attention(q, k, v, 4, mask_window=10, sinks=2)      # a mask window: the fused path
            pe.rerope_attention(q[:, :, -5:], k, v, 4)                    # fewer queries than keys (decoding)
            pe.rerope_attention(q, k, v[..., :5], 4)                      # another value width
            assert spy.call_count == 0
            pe.rerope_attention(q, k, v, 4)
        assert spy.call_count == 1
