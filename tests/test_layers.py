"""Attention layers (posenc.layers) and TinyLM with linear attention kinds (TransNormer's layout).

DiagAttention is checked against softmax attention with an explicit block
mask; every layer against its kernel function; every model layout for
causality beyond the training length.
"""

import math

import pytest
import torch

import posenc as pe
from posenc import layers as Y


def qkv(b=2, h=3, n=37, d=8, e=6, dtype=torch.float64):
    return (torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype),
            torch.randn(b, h, n, e, dtype=dtype))


# ---------------------------------------------------------------------------
# DiagAttention
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n,block", [(37, 8), (32, 8), (5, 64), (16, 1)])
def test_diag_equals_softmax_with_block_mask(causal, n, block):
    q, k, v = qkv(n=n)
    mask = Y.block_diagonal_mask(n, block, causal=causal)
    expected = pe.attention(q, k, v, mask=mask, causal=causal)
    out = Y.diag_attention(q, k, v, block_size=block, causal=causal)
    assert torch.allclose(out, expected, atol=1e-12)


def test_diag_special_cases():
    q, k, v = qkv(n=20)
    assert torch.allclose(Y.diag_attention(q, k, v, block_size=1), v, atol=1e-12)  # each token sees itself
    assert torch.allclose(Y.diag_attention(q, k, v, block_size=20), pe.attention(q, k, v), atol=1e-12)


def test_block_diagonal_mask():
    m = Y.block_diagonal_mask(10, 4, causal=False)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    assert torch.equal(m, i // 4 == j // 4)
    assert torch.equal(Y.block_diagonal_mask(10, 4), m & (j <= i))


def test_diag_relu_kind():
    q, k, v = qkv(n=13, d=8)
    mask = Y.block_diagonal_mask(13, 4)
    weights = torch.relu(q @ k.transpose(-2, -1) / math.sqrt(8)) * mask
    raw = weights @ v
    expected = raw / (raw.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    assert torch.allclose(Y.diag_attention(q, k, v, block_size=4, kind="relu"), expected, atol=1e-10)


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


def _heads(layer, x):
    """q, k, v of a layer computed by hand: (batch, heads, seq, head_dim) each."""
    b, t, _ = x.shape
    return (u.reshape(b, t, layer.n_heads, layer.head_dim).transpose(1, 2) for u in layer.qkv(x).chunk(3, -1))


def test_layers_match_functions():
    torch.manual_seed(0)
    x = torch.randn(2, 11, 16)
    for layer, fn in (
        (Y.NormAttention(16, 4), lambda q, k, v: pe.norm_attention(q, k, v)),
        (Y.DiagAttention(16, 4, block_size=4), lambda q, k, v: Y.diag_attention(q, k, v, block_size=4)),
        (Y.LinearAttention(16, 4), lambda q, k, v: pe.linear_attention(q, k, v)),
        (Y.SoftmaxAttention(16, 4), lambda q, k, v: pe.attention(q, k, v)),
        (Y.LinearAttention(16, 4, rope=True), lambda q, k, v: pe.rope_linear_attention(q, k, v)),
        (Y.SoftmaxAttention(16, 4, rope=True), lambda q, k, v: pe.attention(pe.apply_rope(q), pe.apply_rope(k), v)),
    ):
        q, k, v = _heads(layer, x)
        expected = layer.proj(fn(q, k, v).transpose(1, 2).reshape(2, 11, 16))
        assert torch.allclose(layer(x), expected, atol=1e-6), type(layer).__name__
        w = layer.attention_weights(x)
        assert w.shape == (2, 4, 11, 11) and (w.triu(1) == 0).all()


def test_attention_layer_factory_and_errors():
    assert isinstance(Y.attention_layer("norm", 16, 4), Y.NormAttention)
    assert Y.attention_layer("softmax", 16, 4, bias=True).qkv.bias is not None
    with pytest.raises(ValueError, match="attention kind"):
        Y.attention_layer("performer", 16, 4)
    with pytest.raises(ValueError, match="divisible"):
        Y.NormAttention(10, 3)
    with pytest.raises(ValueError, match="x must be"):
        Y.LinearAttention(16, 4)(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match="rotation only"):  # a bias needs softmax logits
        Y.LinearAttention(16, 4)(torch.randn(1, 5, 16), Y.Positions(slopes=pe.alibi_slopes(4)))


def test_norm_attention_layer_gain_option():
    assert Y.NormAttention(16, 4).gain is None
    assert Y.NormAttention(16, 4, gain=True).gain.shape == (16,)
    assert Y.NormAttention(16, 4, gain=True, per_head=True).gain.shape == (4,)


def test_linear_layer_denominator():
    torch.manual_seed(0)
    layer = Y.LinearAttention(16, 4)
    x = torch.randn(2, 11, 16)
    q, k, _ = _heads(layer, x)
    raw = pe.linear_attention_weights(q, k, normalize=False)
    assert torch.allclose(layer.denominator(x), raw.sum(-1), rtol=1e-5)


# ---------------------------------------------------------------------------
# TinyLM(attention=...)
# ---------------------------------------------------------------------------

V, T = 20, 16


def lm(attention, position="rope", **kw):
    torch.manual_seed(0)
    return pe.TinyLM(V, d_model=16, n_layers=len(attention) if isinstance(attention, list) else 2,
                     n_heads=2, position=position, attention=attention, diag_block=4, **kw).eval()


@pytest.mark.parametrize("position", ["none", "rope", "xpos", "sinusoidal", "learned"])
@pytest.mark.parametrize("kind", ["softmax", "linear", "norm", "diag"])
def test_every_kind_is_causal_beyond_training_length(kind, position):
    """Changing tokens after t never changes logits up to t, at 4x the training length."""
    model = lm(kind, position, **({"max_len": 8 * T} if position == "learned" else {}))
    n, t = 4 * T, 3 * T
    idx = torch.randint(V, (2, n), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 3) % V
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.isfinite(a).all()
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:], atol=1e-4)


def test_transnormer_layout_puts_diag_attention_in_the_lower_half():
    assert pe.transnormer_layout(1) == ["norm"] and pe.transnormer_layout(2) == ["diag", "norm"]
    assert pe.transnormer_layout(3) == ["diag", "norm", "norm"]              # the odd layer goes to NormAttention
    assert pe.transnormer_layout(6) == ["diag"] * 3 + ["norm"] * 3
    model = lm(pe.transnormer_layout(3), "none")
    assert [type(b.attn) for b in model.blocks] == [Y.DiagAttention, Y.NormAttention, Y.NormAttention]
    for bad in (0, -2, 2.0, True, "4", None):
        with pytest.raises(ValueError, match="n_layers"):
            pe.transnormer_layout(bad)


def test_transnormer_hybrid_per_layer():
    n = 4
    kinds = pe.transnormer_layout(n)
    model = lm(kinds, "none", ffn="glu")
    assert [type(b.attn) for b in model.blocks] == [Y.DiagAttention] * 2 + [Y.NormAttention] * 2
    assert model.config["attention"] == kinds and model.config["ffn"] == "glu"
    assert model.blocks[0].mlp.fc.out_features == 2 * 4 * 16  # GLU: gate and value
    idx = torch.randint(V, (2, 12))
    logits, weights = model(idx, return_attention=True)
    assert logits.shape == (2, 12, V) and len(weights) == n
    inputs = model.attention_inputs(idx)
    assert len(inputs) == n and inputs[0].shape == (2, 12, 16)
    assert torch.allclose(weights[3], model.blocks[3].attn.attention_weights(inputs[3], Y.Positions()), atol=1e-6)
    # a DiagAttention layer only mixes inside its blocks of 4
    assert (weights[0][..., 4:, :4] == 0).all()


def test_linear_model_denominators_through_attention_inputs():
    model = lm(["linear", "softmax"], "none")
    idx = torch.randint(V, (2, 9))
    x = model.attention_inputs(idx)[0]
    den = model.blocks[0].attn.denominator(x)
    assert den.shape == (2, 2, 9) and (den > 0).all()


def test_rotation_in_linear_layers_is_numerator_only():
    """A RoPE model with linear layers computes pe.rope_linear_attention in each of them."""
    model = lm("linear", "rope")
    layer = model.blocks[0].attn
    x = torch.randn(1, 10, 16)
    q, k, v = _heads(layer, x)
    expected = layer.proj(pe.rope_linear_attention(q, k, v).transpose(1, 2).reshape(1, 10, 16))
    positions = model._positions(10, x.device)[0]
    with torch.no_grad():
        assert torch.allclose(layer(x, positions), expected, atol=1e-6)


def test_bad_attention_arguments():
    with pytest.raises(ValueError, match="attention"):
        lm("performer")
    with pytest.raises(ValueError, match="attention"):
        pe.TinyLM(V, 16, 3, 2, attention=["norm", "diag"])  # 2 kinds for 3 layers
    with pytest.raises(ValueError, match="ffn"):
        lm("softmax", ffn="swiglu")
    with pytest.raises(ValueError, match="softmax"):  # a distance bias needs softmax logits
        lm("norm", "alibi")
    model = lm("linear")
    with pytest.raises(ValueError, match="softmax"):
        model.window = 8
    model.train_len = T
    with pytest.raises(ValueError, match="softmax"):
        model.log_n_scaling = True


# ---------------------------------------------------------------------------
# Reliability
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("build,error,match", [
    (lambda: Y.SoftmaxAttention(16, 4.0), ValueError, "n_heads"),
    (lambda: Y.SoftmaxAttention(16, 4, dropout=float("nan")), ValueError, "dropout"),
    (lambda: Y.SoftmaxAttention(16, 4, dropout=1.5), ValueError, "dropout"),
    (lambda: Y.SoftmaxAttention(16, 4, rope=True, rope_base=float("inf")), ValueError, "rope_base"),
    (lambda: Y.SoftmaxAttention(16, 4, rope=True, rope_base=0.5), ValueError, "rope_base"),
    (lambda: Y.SoftmaxAttention(16, 4, causal="yes"), TypeError, "causal"),
    (lambda: Y.LinearAttention(16, 4, eps=float("nan")), ValueError, "eps"),
    (lambda: Y.LinearAttention(16, 4, method="fast"), ValueError, "method"),
    (lambda: Y.NormAttention(16, 4, feature="softmax"), ValueError, "feature"),
    (lambda: Y.NormAttention(16, 4, gain=torch.ones(2)), TypeError, "gain"),
    (lambda: Y.DiagAttention(16, 4, block_size=0), ValueError, "block_size"),
    (lambda: Y.DiagAttention(16, 4, kind="gelu"), ValueError, "kind"),
])
def test_layers_validate_at_construction(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_layer_inputs_are_checked():
    layer = Y.SoftmaxAttention(16, 4)
    with pytest.raises(ValueError, match="floating-point"):
        layer(torch.ones(1, 3, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="layer's weights are torch.float32"):
        layer(torch.ones(1, 3, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([[0.0] * 16])
    with pytest.raises(ValueError, match="slopes"):
        layer(torch.ones(1, 3, 16), Y.Positions(slopes=torch.ones(3)))
    with pytest.raises(ValueError, match="q_scale"):
        layer(torch.ones(1, 5, 16), Y.Positions(q_scale=torch.ones(4, 1)))
    assert layer(torch.ones(1, 0, 16)).shape == (1, 0, 16)
    meta = Y.attention_layer("softmax", 16, 4).to("meta")
    assert meta(torch.ones(1, 5, 16, device="meta"), Y.Positions(slopes=pe.alibi_slopes(4))).shape == (1, 5, 16)
