"""Encodings, their attention functions and the figures: wrong inputs raise a clear ValueError, never a raw error
from inside torch or plotly, nor a silently wrong result."""

import numpy as np
import pytest
import torch

import posenc as pe
import posenc.viz as viz

P = torch.arange(6)


def qkv(n=6, heads=2, dim=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, heads, n, dim, generator=g, dtype=dtype) for _ in range(3))


Q, K, V = qkv()
NAN = float("nan")


# ------------------------------------------------------------------ a truthy string is not a flag

@pytest.mark.parametrize("name,call", [
    ("interleaved", lambda flag: pe.rope_cos_sin(P, 8, interleaved=flag)),
    ("interleaved", lambda flag: pe.rope_rotation_matrix(1, 8, interleaved=flag)),
    ("centered", lambda flag: pe.xpos_scales(P, 8, centered=flag)),
    ("interleaved", lambda flag: pe.xpos_scales(P, 8, interleaved=flag)),
    ("centered", lambda flag: pe.apply_xpos(Q, K, centered=flag)),
    ("interleaved", lambda flag: pe.apply_xpos(Q, K, interleaved=flag)),
    ("normalized", lambda flag: pe.sinusoidal_similarity(P, 8, normalized=flag)),
    ("return_index", lambda flag: pe.sinusoidal_nearest_distance(P, 4, 8, return_index=flag)),
    ("normalize", lambda flag: pe.rope_decay_bound(P, 8, normalize=flag)),
    ("truncate", lambda flag: pe.rope_frequencies_yarn(8, 10000.0, 2.0, 16, truncate=flag)),
    ("return_weights", lambda flag: pe.sink_attention(Q, K, V, window=2, sinks=1, return_weights=flag)),
    ("return_weights", lambda flag: pe.rerope_attention(Q, K, V, 2, return_weights=flag)),
    ("return_weights", lambda flag: pe.self_extend_attention(Q, K, V, 2, 2, return_weights=flag)),
    ("return_weights", lambda flag: pe.streaming_attention(Q, K, V, 2, 1, return_weights=flag)),
    ("return_weights", lambda flag: pe.cope_attention(Q, K, V, torch.zeros(4, 8), return_weights=flag)),
    ("causal", lambda flag: pe.linear_attention(Q, K, V, causal=flag)),
    ("bidirectional", lambda flag: pe.t5_relative_buckets(P, flag)),
    ("bidirectional", lambda flag: pe.T5RelativeBias(2, bidirectional=flag)),
    ("causal", lambda flag: pe.block_diagonal_mask(4, 2, causal=flag)),
    ("causal", lambda flag: pe.sliding_window_mask(4, window=2, causal=flag)),
    ("causal", lambda flag: pe.attention(Q, K, V, causal=flag)),
    ("reversed_y", lambda flag: viz.heatmap(np.zeros((2, 3)), reversed_y=flag)),
    ("log_x", lambda flag: viz.curves([1, 2], [3, 4], log_x=flag)),
    ("log_y", lambda flag: viz.curves([1, 2], [3, 4], log_y=flag)),
    ("fixed_ranges", lambda flag: viz.slider_figure(lambda v: viz.curves([1, 2], [v, v]), [1, 2], name="v",
                                                    fixed_ranges=flag)),
])
def test_a_truthy_string_is_not_a_flag(name, call):
    call(True)
    call(False)
    with pytest.raises(ValueError, match=f"{name} must be True or False, got 'no'"):
        call("no")


@pytest.mark.parametrize("name,call", [
    ("causal", lambda flag: pe.attention(Q, K, V, causal=flag)),
    ("causal", lambda flag: pe.SoftmaxAttention(16, 2, causal=flag)),
    ("sink_logit", lambda flag: pe.TinyLM(11, 16, 2, 2, sink_logit=flag)),
    ("interleaved", lambda flag: pe.rope_cos_sin(P, 8, interleaved=flag)),
    ("bidirectional", lambda flag: pe.t5_relative_buckets(P, flag)),
    ("keepdim", lambda flag: pe.attention_entropy(torch.full((2, 3), 1 / 3), keepdim=flag)),
    ("own", lambda flag: pe.measured_costs("attention", own=flag)),
])
def test_every_flag_of_the_library_refuses_the_integers_0_and_1_alike(name, call):
    """One check serves every flag: 1 is refused by a model and its layers alike, and the error is a ValueError
    that a caller catching the TypeError some flags raised before still catches."""
    call(np.bool_(True))
    call(torch.tensor(False))
    for number in (0, 1):
        with pytest.raises(ValueError, match=f"{name} must be True or False, got {number}") as error:
            call(number)
        assert isinstance(error.value, TypeError)


def test_flags_that_raised_a_type_error_still_do():
    with pytest.raises(TypeError, match="causal must be True or False"):  # callers catching TypeError keep working
        pe.linear_attention(Q, K, V, causal="no")


def test_scheme_hooks_check_their_flags():
    rope = pe.RoPE()
    rope.bind(d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="cache_positions must be True or False"):
        rope.attend(Q, K, V, window=4, cache_positions="no")
    cope = pe.CoPE(4)
    cope.bind(d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="cache_positions must be True or False"):
        cope.attend(Q, K, V, cache_positions="no")


# ------------------------------------------------------------------ ReRoPE, Self-Extend, StreamingLLM: q, k, v

TWO_PASS = [
    lambda q, k, v, **kw: pe.rerope_attention(q, k, v, 2, **kw),
    lambda q, k, v, **kw: pe.self_extend_attention(q, k, v, 2, 2, **kw),
    lambda q, k, v, **kw: pe.streaming_attention(q, k, v, 2, 1, **kw),
]


@pytest.mark.parametrize("call", TWO_PASS)
@pytest.mark.parametrize("args,error,match", [
    ((Q.half(), K, V), ValueError, "share one dtype and device"),
    ((Q, K, V.double()), ValueError, "share one dtype and device"),
    ((torch.tensor(1.0), K, V), ValueError, r"must be \(batch, heads, seq, head_dim\)"),
    ((Q[0], K, V), ValueError, r"must be \(batch, heads, seq, head_dim\)"),
    ((Q, K, V[:, :1]), ValueError, "agree on batch and heads"),
    ((Q.long(), K.long(), V.long()), ValueError, "floating-point"),
    ((Q.tolist(), K, V), TypeError, "q must be a torch.Tensor"),
    ((None, K, V), TypeError, "q must be a torch.Tensor"),
    ((Q, K, V.numpy()), TypeError, "v must be a torch.Tensor"),
])
def test_two_pass_attention_checks_q_k_v_as_attention_does(call, args, error, match):
    with pytest.raises(error, match=match):
        call(*args)


@pytest.mark.parametrize("call", TWO_PASS)
@pytest.mark.parametrize("inv_freq,match", [
    (torch.full((4,), NAN), "finite"),
    (torch.full((4,), float("inf")), "finite"),
    (torch.ones(4, dtype=torch.complex64), "integers or floating-point"),
    (torch.ones(4, dtype=torch.bool), "integers or floating-point"),
    (torch.ones(3), r"shape \(4,\)"),
    ("fast", "tensor"),
])
def test_two_pass_attention_checks_inv_freq(call, inv_freq, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(Q, K, V, inv_freq=inv_freq)


@pytest.mark.parametrize("call", TWO_PASS)
def test_two_pass_attention_with_given_frequencies_is_unchanged(call):
    freqs = pe.rope_frequencies(8)
    torch.testing.assert_close(call(Q, K, V, inv_freq=freqs), call(Q, K, V), rtol=0, atol=0)
    torch.testing.assert_close(call(Q, K, V, inv_freq=freqs.float()), call(Q, K, V, inv_freq=freqs.float().tolist()),
                               rtol=0, atol=0)
    p_rope = pe.p_rope_frequencies(8, p=0.5)  # zeros: pairs left unrotated
    assert torch.isfinite(call(Q, K, V, inv_freq=p_rope)).all()


# ------------------------------------------------------------------ CoPE

def test_cope_position_logits_checks_its_inputs():
    e, pos = torch.randn(5, 8), torch.rand(1, 2, 6, 6) * 4
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        pe.cope_position_logits(Q.tolist(), e, pos)
    with pytest.raises(ValueError, match="q must be a floating-point tensor"):
        pe.cope_position_logits(Q.long(), e, pos)
    with pytest.raises(ValueError, match="positions must be integers or floating-point"):
        pe.cope_position_logits(Q, e, pos > 1)
    with pytest.raises(ValueError, match="positions must be finite"):
        pe.cope_position_logits(Q, e, pos.masked_fill(pos > 3, NAN))
    with pytest.raises(ValueError, match="embeddings must hold real numbers"):
        pe.cope_position_logits(Q, e > 0, pos)
    with pytest.raises(ValueError, match="embeddings must be finite"):
        pe.cope_position_logits(Q, e.masked_fill(e > 1, NAN), pos)
    with pytest.raises(ValueError, match="embeddings must be"):
        pe.cope_position_logits(Q, e.tolist(), pos)
    by_lists = pe.cope_position_logits(Q, e, pos.tolist())  # a sequence of numbers is read as positions
    torch.testing.assert_close(by_lists, pe.cope_position_logits(Q, e, pos), rtol=0, atol=0)


@pytest.mark.parametrize("embeddings,match", [
    (torch.ones(4, 8, dtype=torch.bool), "real numbers"),
    (torch.ones(4, 8, dtype=torch.complex64), "real numbers"),
    (torch.full((4, 8), NAN), "finite"),
    (torch.full((4, 8), float("inf")), "finite"),
    (torch.ones(1, 8), r"n_positions >= 2"),
    (torch.ones(4, 6), "head_dim=8"),
    (torch.ones(4, 8, device="meta"), "on meta"),
])
def test_cope_attention_checks_its_embeddings(embeddings, match):
    with pytest.raises(ValueError, match=match):
        pe.cope_attention(Q, K, V, embeddings)


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), NAN])
def test_cope_attention_refuses_non_finite_queries_and_keys(bad):
    broken = Q.clone()
    broken[0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match="q must be finite"):
        pe.cope_attention(broken, K, V, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="k must be finite"):
        pe.cope_attention(Q, broken, V, torch.zeros(4, 8))


# ------------------------------------------------------------------ figures

def figure(base=10000, dim=8):
    return viz.curves([1, 2, 3], [base, dim, 1])


@pytest.mark.parametrize("values", [10000, "10000", torch.tensor(3), np.float64(2.0), None])
def test_a_slider_needs_a_list_of_values(values):
    with pytest.raises(ValueError, match="base' must be a list of the slider's values"):
        viz.interactive(figure, base=values)
    with pytest.raises(ValueError, match="values must be a list of the slider's values"):
        viz.slider_figure(figure, values, name="base")


@pytest.mark.parametrize("active", ["0", 1.5, True, torch.tensor(True), -1, 2, None])
def test_the_active_step_is_an_integer_index(active):
    with pytest.raises(ValueError, match=r"active must be an integer index of values \(0..1\)"):
        viz.slider_figure(figure, [1, 2], name="base", active=active)


@pytest.mark.parametrize("active", [1, np.int64(1), torch.tensor(1)])
def test_integers_of_numpy_and_torch_index_the_active_step(active):
    assert viz.slider_figure(figure, [1, 2], name="base", active=active).layout.sliders[0].active == 1


def test_heatmap_labels_fit_the_cells():
    z = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"x must hold one label per column of z \(4, or 5 cell edges\)"):
        viz.heatmap(z, x=[1, 2])
    with pytest.raises(ValueError, match=r"y must hold one label per row of z \(3, or 4 cell edges\)"):
        viz.heatmap(z, y=["a", "b"])
    with pytest.raises(ValueError, match="x must hold one label"):
        viz.heatmap(z, x=np.zeros((2, 2)))
    assert list(viz.heatmap(z, x=list("abcd"), y=[0, 1, 2]).data[0].x) == list("abcd")
    assert len(viz.heatmap(z, x=np.arange(5)).data[0].x) == 5  # cell edges


# ------------------------------------------------------------------ Scalable-Softmax, feature maps

SCORES = torch.randn(1, 2, 4, 4)


@pytest.mark.parametrize("s,match", [
    (torch.tensor([1.0, 2.0, 3.0]), "one factor per head"),
    (torch.tensor([1.0, NAN]), "s must be finite"),
    (torch.tensor(float("inf")), "s must be finite"),
    (torch.tensor([True, False]), "real scalar tensor"),
    (torch.ones(2, dtype=torch.complex64), "real scalar tensor"),
    (1.0, "real scalar tensor"),
])
def test_scalable_softmax_checks_s(s, match):
    with pytest.raises(ValueError, match=match):
        pe.scalable_softmax(SCORES, s)


def test_scalable_softmax_checks_dim_and_scores():
    for dim in (4, -5, 1.0, "k"):
        with pytest.raises(ValueError, match=r"dim must be an integer in \[-4, 3\]"):
            pe.scalable_softmax(SCORES, torch.ones(2), dim=dim)
    with pytest.raises(ValueError, match="one factor per head"):
        pe.scalable_softmax(SCORES[0, 0], torch.ones(2))  # no heads dimension
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        pe.scalable_softmax(SCORES.masked_fill(SCORES > 1, NAN), torch.ones(2))
    causal = SCORES.masked_fill(~pe.causal_mask(4), float("-inf"))
    weights = pe.scalable_softmax(causal, torch.ones(2), dim=np.int64(3))
    torch.testing.assert_close(weights, pe.scalable_softmax(causal, torch.ones(2)), rtol=0, atol=0)
    torch.testing.assert_close(weights, pe.scalable_softmax(causal, torch.ones(1)), rtol=0, atol=0)


def test_ssmax_factors_refuse_non_finite_scales():
    with pytest.raises(ValueError, match="s must be finite"):
        pe.ssmax_factors(4, torch.tensor([1.0, NAN]))


def test_relu_feature_checks_its_input():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        pe.relu_feature([1.0, -2.0])
    with pytest.raises(ValueError, match="floating-point"):
        pe.relu_feature(torch.tensor([1, -2]))
    assert pe.relu_feature(np.array([1.0, -2.0])).tolist() == [1.0, 0.0]


# ------------------------------------------------------------------ sinusoidal counts, attention's scale

@pytest.mark.parametrize("n", [torch.tensor(5), np.int64(5), np.array(5)])
def test_a_zero_dimensional_integer_is_a_count(n):
    torch.testing.assert_close(pe.sinusoidal_embedding(n, 8), pe.sinusoidal_embedding(5, 8), rtol=0, atol=0)
    torch.testing.assert_close(pe.sinusoidal_similarity(n, 8), pe.sinusoidal_similarity(5, 8), rtol=0, atol=0)
    assert pe.sinusoidal_embedding(torch.tensor(5.0), 8).shape == (8,)  # a floating one is one position
    with pytest.raises(ValueError, match="n_positions must be >= 1"):
        pe.sinusoidal_embedding(torch.tensor(0), 8)


def test_train_length_as_a_zero_dimensional_tensor():
    want = pe.sinusoidal_nearest_distance(P, 4, 8)
    torch.testing.assert_close(pe.sinusoidal_nearest_distance(P, torch.tensor(4), 8), want, rtol=0, atol=0)
    torch.testing.assert_close(pe.sinusoidal_period_coverage(torch.tensor(4), 8),
                               pe.sinusoidal_period_coverage(4, 8), rtol=0, atol=0)


@pytest.mark.parametrize("call", [
    lambda scale: pe.attention(Q, K, V, scale=scale),
    lambda scale: pe.attention(Q, K, V, scale=scale, causal=False),
    lambda scale: pe.relative_attention(Q, K, V, slopes=torch.ones(2), scale=scale),
    lambda scale: pe.sink_attention(Q, K, V, window=2, sinks=1, scale=scale),
    lambda scale: pe.rerope_attention(Q, K, V, 2, scale=scale),
    lambda scale: pe.cope_attention(Q, K, V, torch.zeros(4, 8), scale=scale),
])
@pytest.mark.parametrize("scale", [1e-300, -1e-300, 1e300, float("inf"), NAN])
def test_a_scale_the_dtype_cannot_hold_is_refused(call, scale):
    with pytest.raises(ValueError, match="scale must be"):
        call(scale)


def test_scales_that_float32_holds_still_work():
    for scale in (0.0, -0.5, 1e-30, 1e4):
        assert torch.isfinite(pe.attention(Q, K, V, scale=scale)).all()
    q, k, v = qkv(dtype=torch.float64)
    assert torch.isfinite(pe.attention(q, k, v, scale=1e-300)).all()  # float64 holds it
