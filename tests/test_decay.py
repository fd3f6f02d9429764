"""Decayed and gated linear attention (posenc.decay) and the "decay" / "gated" attention kinds.

The chunked form, the recurrence and the weights are checked against a loop
over the definition (explicit products of the gates); the rates against the
papers' formulas; ALiBi's factor exp(-m (i - j)) against pe.alibi_bias; and
every model layout for causality and finiteness at 16x its training length.
"""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc import decay as D
from posenc import layers as Y

CHUNKS = [1, 2, 5, 8, 16, 36, 37, 38, 64, 1000]


def qkv(b=2, h=3, n=37, d=4, e=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, x, generator=g, dtype=torch.float64).to(dtype) for x in (d, d, e))


def gates(b=2, h=3, n=37, low=0.3, high=1.0, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (low + (high - low) * torch.rand(b, h, n, generator=g, dtype=torch.float64)).to(dtype)


def reference(q, k, v, gamma):
    """out_i = sum_{j<=i} (prod_{s=j+1}^{i} gamma_s) (q_i . k_j) v_j, by loops (a fixed decay: gamma_s = gamma_h)."""
    b, h, n, _ = q.shape
    if gamma.ndim == 1:
        gamma = gamma[None, :, None].expand(b, h, n)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for i in range(n):
        factor = torch.ones(b, h, dtype=torch.float64)
        for j in range(i, -1, -1):  # factor = prod of the gates of steps j+1 .. i
            out[:, :, i] += (factor * (q[:, :, i] * k[:, :, j]).sum(-1))[..., None] * v[:, :, j]
            factor = factor * gamma[:, :, j]
    return out


def rms(x, eps=1e-6):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


# ---------------------------------------------------------------------------
# The three forms agree with the definition
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fixed", [True, False])
def test_chunked_recurrent_and_weights_equal_the_definition(fixed):
    q, k, v = qkv()
    gamma = torch.tensor([0.9, 0.5, 1.0], dtype=torch.float64) if fixed else gates()
    ref = reference(q, k, v, gamma)
    for chunk in CHUNKS:  # 37 is prime: the chunk divides the length only for 1 and 37
        out = D.decayed_linear_attention(q, k, v, gamma, chunk=chunk, normalize=False)
        assert torch.allclose(out, ref, rtol=0, atol=1e-10), chunk
    assert torch.allclose(D.decayed_linear_attention_recurrent(q, k, v, gamma, normalize=False), ref, atol=1e-10)
    w = D.decayed_attention_weights(q, k, gamma)
    assert (w.triu(1) == 0).all() and torch.allclose(w @ v, ref, atol=1e-10)
    # normalised: an RMSNorm (no gain) of every head's output
    for out in (D.decayed_linear_attention(q, k, v, gamma, chunk=8),
                D.decayed_linear_attention_recurrent(q, k, v, gamma)):
        assert torch.allclose(out, rms(ref), atol=1e-10)


def test_log_space_and_feature_maps():
    q, k, v = qkv()
    g = gates()
    ref = D.decayed_linear_attention(q, k, v, g, chunk=8)
    assert torch.allclose(D.decayed_linear_attention(q, k, v, g.log(), chunk=8, log_space=True), ref, atol=1e-12)
    phi = pe.feature_map("elu+1")
    out = D.decayed_linear_attention(q, k, v, g, chunk=5, feature="elu+1", normalize=False)
    assert torch.allclose(out, reference(phi(q), phi(k), v, g), atol=1e-10)
    # gamma = 1 is plain (unnormalised) causal linear attention
    ones = torch.ones(3, dtype=torch.float64)
    assert torch.allclose(D.decayed_linear_attention(q, k, v, ones, normalize=False, feature="elu+1"),
                          pe.linear_attention(q, k, v, normalize=False), atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 4), n=st.integers(1, 70), d=st.integers(1, 5), e=st.integers(1, 5),
       chunk=st.integers(1, 80), per_step=st.booleans(), low=st.sampled_from([1e-3, 0.5, 0.99]),
       seed=st.integers(0, 2**16))
def test_forms_agree_for_any_shape_and_chunk(b, h, n, d, e, chunk, per_step, low, seed):
    q, k, v = qkv(b, h, n, d, e, seed=seed)
    gamma = gates(b, h, n, low=low, seed=seed + 1) if per_step else gates(1, 1, h, low=low, seed=seed + 1)[0, 0]
    ref = D.decayed_attention_weights(q, k, gamma) @ v
    chunked = D.decayed_linear_attention(q, k, v, gamma, chunk=chunk, normalize=False)
    recurrent = D.decayed_linear_attention_recurrent(q, k, v, gamma, normalize=False)
    assert torch.allclose(chunked, ref, rtol=1e-10, atol=1e-10)
    assert torch.allclose(recurrent, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("fixed", [True, False])
def test_state_carries_a_sequence_fed_in_pieces(fixed):
    """Prefill with the chunked form, then generate token by token with the recurrence: the same outputs."""
    q, k, v = qkv(n=40)
    gamma = torch.tensor([0.9, 0.5, 0.99], dtype=torch.float64) if fixed else gates(n=40)
    full, final = D.decayed_linear_attention(q, k, v, gamma, chunk=7, return_state=True)
    split = 29
    g1, g2 = (gamma, gamma) if fixed else (gamma[..., :split], gamma[..., split:])
    first, state = D.decayed_linear_attention(q[:, :, :split], k[:, :, :split], v[:, :, :split], g1, chunk=7,
                                              return_state=True)
    outs = [first]
    for t in range(split, 40):
        g = gamma if fixed else g2[..., t - split:t - split + 1]
        out, state = D.decayed_linear_attention_recurrent(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], g,
                                                          state=state, return_state=True)
        outs.append(out)
    assert torch.allclose(torch.cat(outs, dim=2), full, atol=1e-10)
    assert torch.allclose(state, final, atol=1e-10)
    # the state is sum_j (decay from j to the end) k_j v_j^T
    ones = torch.ones(2, 3, 40, 1, dtype=torch.float64)
    to_end = D.decayed_attention_weights(ones, ones, gamma)[:, :, -1]  # row n-1: the decays to the last step
    expected = torch.einsum("bhj,bhjd,bhje->bhde", to_end, k, v)
    assert torch.allclose(final, expected, atol=1e-9)


# ---------------------------------------------------------------------------
# Causal and stable far beyond a training length
# ---------------------------------------------------------------------------

TRAIN_LEN = 16


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("chunk", [16, 64, 100])
def test_causal_at_16x_the_training_length(fixed, chunk):
    n, t = 16 * TRAIN_LEN, 150
    q, k, v = qkv(b=1, h=2, n=n, d=4, e=3)
    gamma = torch.tensor([0.99, 0.9], dtype=torch.float64) if fixed else gates(1, 2, n, low=0.8)
    q2, k2, v2, g2 = q.clone(), k.clone(), v.clone(), gamma.clone()
    for x in (q2, k2, v2):
        x[:, :, t] += 1.0
    if not fixed:
        g2[:, :, t] = 0.1
    for fn in (lambda *a: D.decayed_linear_attention(*a, chunk=chunk), D.decayed_linear_attention_recurrent):
        a, b = fn(q, k, v, gamma), fn(q2, k2, v2, g2)
        assert torch.equal(a[:, :, :t], b[:, :, :t]) or torch.allclose(a[:, :, :t], b[:, :, :t], rtol=0, atol=1e-13)
        assert not torch.allclose(a[:, :, t], b[:, :, t])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_at_length_1024_with_gates_near_0_and_1(dtype):
    n = 1024
    q, k, v = (x.requires_grad_() for x in qkv(b=1, h=4, n=n, d=8, e=8, dtype=dtype))
    tiny = torch.finfo(torch.float32).tiny
    g = torch.Generator().manual_seed(0)
    pick = torch.randint(0, 4, (1, 4, n), generator=g)
    gamma = torch.tensor([tiny, 1e-6, 1.0 - 1e-7, 1.0], dtype=torch.float64)[pick].to(dtype)
    gamma[:, 0] = tiny  # a head that forgets at every step
    gamma[:, 1] = 1.0  # a head that never forgets
    for chunk in (64, 1000):
        out = D.decayed_linear_attention(q, k, v, gamma, chunk=chunk)
        assert torch.isfinite(out).all()
        out.square().sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    ref = D.decayed_linear_attention(q.detach().double(), k.detach().double(), v.detach().double(), gamma.double())
    assert torch.allclose(out.detach().double(), ref, atol=1e-3 if dtype == torch.float32 else 1e-10)
    # gate logits far out: log gates stay finite where the gates themselves round to 0 or 1
    logits = torch.tensor([-1e4, -50.0, 0.0, 50.0, 1e4], dtype=dtype).repeat(1, 4, n // 5 + 1)[..., :n]
    log_gates = pe.gate_decay(logits, 16.0, log=True)
    assert torch.isfinite(log_gates).all() and (log_gates <= 0).all()
    out = D.decayed_linear_attention(q.detach(), k.detach(), v.detach(), log_gates, log_space=True)
    assert torch.isfinite(out).all()


def test_gradcheck_both_forms():
    q, k, v = (x.requires_grad_() for x in qkv(b=1, h=2, n=9, d=3, e=2))
    log_g = gates(1, 2, 9, low=0.4).log().requires_grad_()
    fixed = torch.tensor([0.8, 0.95], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c, g: D.decayed_linear_attention(a, b, c, g, chunk=4, log_space=True),
                                    (q, k, v, log_g))
    assert torch.autograd.gradcheck(lambda a, b, c, g: D.decayed_linear_attention_recurrent(a, b, c, g, log_space=True),
                                    (q, k, v, log_g))
    assert torch.autograd.gradcheck(lambda a, b, c: D.decayed_linear_attention(a, b, c, fixed, chunk=2,
                                                                               normalize=False), (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: D.decayed_linear_attention_recurrent(a, b, c, fixed),
                                    (q, k, v))


# ---------------------------------------------------------------------------
# Rates, gates, and ALiBi's factor
# ---------------------------------------------------------------------------


def test_retnet_rates_are_the_papers():
    """RetNet (Sun et al., 2023): gamma = 1 - 2^(-5 - arange(0, h)); for 8 heads 31/32 ... 4095/4096."""
    rates = pe.decay_rates("retnet", 8, dtype=torch.float64)
    assert rates.tolist() == [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256, 1 - 1 / 512, 1 - 1 / 1024,
                              1 - 1 / 2048, 1 - 1 / 4096]
    assert rates.dtype == torch.float64 and pe.decay_rates("RetNet", 8).dtype == torch.float32
    log = pe.decay_rates("retnet", 40, log=True, dtype=torch.float64)
    exact = [math.log1p(-(2.0 ** (-5 - h))) for h in range(40)]
    assert log.tolist() == exact and (log < 0).all()  # no rounding to log(1) = 0 for the slowest heads


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16])
def test_alibi_rates_are_exp_minus_the_slopes(heads):
    rates = pe.decay_rates("alibi", heads, dtype=torch.float64)
    expected = [math.exp(-(2.0 ** (-8 * (h + 1) / heads))) for h in range(heads)]
    assert torch.allclose(rates, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=0)
    assert torch.equal(pe.decay_rates("alibi", heads, log=True, dtype=torch.float64),
                       -pe.alibi_slopes(heads, dtype=torch.float64))
    assert torch.allclose(pe.decay_rates("alibi", 6, dtype=torch.float64),
                          torch.exp(-pe.alibi_slopes(6, dtype=torch.float64)))  # not a power of two: ALiBi's rule


def test_rates_of_your_own():
    for spelling in ([0.5, 1.0], (0.5, 1), np.array([0.5, 1.0]), torch.tensor([0.5, 1.0], dtype=torch.float64)):
        assert pe.decay_rates(spelling, 2).tolist() == [0.5, 1.0]
    assert pe.decay_rates([0.5, 1.0], 2, log=True, dtype=torch.float64).tolist() == [math.log(0.5), 0.0]


def test_alibi_identity():
    """phi = identity, gamma = exp(-m): the weight on key j is exp(-m (i - j)) times the raw score q_i . k_j."""
    heads, n = 4, 30
    q, k, v = qkv(b=2, h=heads, n=n, d=6, e=3)
    w = D.decayed_attention_weights(q, k, pe.decay_rates("alibi", heads, dtype=torch.float64))
    m = pe.alibi_slopes(heads, dtype=torch.float64)
    explicit = torch.zeros(2, heads, n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1):
            explicit[:, :, i, j] = torch.exp(-m * (i - j)) * (q[:, :, i] * k[:, :, j]).sum(-1)
    assert torch.allclose(w, explicit, rtol=1e-12, atol=1e-13)
    bias = pe.alibi_bias(heads, n, dtype=torch.float64)  # -m (i - j): its exp is the decay
    assert torch.allclose(w, ((q @ k.transpose(-2, -1)) * bias.exp()).tril(), rtol=1e-12, atol=1e-13)
    out = D.decayed_linear_attention(q, k, v, pe.decay_rates("alibi", heads, dtype=torch.float64), chunk=7,
                                     normalize=False)
    assert torch.allclose(out, explicit @ v, atol=1e-10)


def test_gate_decay():
    z = torch.linspace(-8, 8, 33, dtype=torch.float64)
    assert torch.allclose(pe.gate_decay(z, 16.0), torch.sigmoid(z) ** (1 / 16), atol=1e-15)
    assert torch.allclose(pe.gate_decay(z, 4, log=True), torch.log(torch.sigmoid(z)) / 4, atol=1e-13)
    assert (pe.gate_decay(z) > 0).all() and (pe.gate_decay(z) < 1).all()
    assert abs(pe.gate_decay(torch.zeros(1), 16).item() - 0.5 ** (1 / 16)) < 1e-7


# ---------------------------------------------------------------------------
# Clear errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("decay,match", [
    ("xpos", "one of"), ([0.5], r"\(2,\)"), ([0.5, 0.0], r"\(0, 1\]"), ([0.5, 1.5], r"\(0, 1\]"),
    ([0.5, float("nan")], r"\(0, 1\]"), (torch.ones(2, 2), r"\(2,\)"), (None, "decay"), (0.5, "decay"),
    (torch.ones(2, dtype=torch.bool), "decay"),
])
def test_bad_decays(decay, match):
    with pytest.raises(ValueError, match=match):
        pe.decay_rates(decay, 2)
    with pytest.raises(ValueError, match=match):
        pe.TinyLM(8, 16, 1, 2, attention="decay", decay=decay)


def test_bad_arguments_of_the_functions():
    q, k, v = qkv(b=1, h=2, n=6)
    cases = [
        (dict(gamma=torch.full((2,), 0.0)), r"\(0, 1\]"),
        (dict(gamma=torch.full((2,), 1.01)), r"\(0, 1\]"),
        (dict(gamma=torch.tensor([0.5, float("nan")])), "NaN"),
        (dict(gamma=torch.full((1, 2, 6), -0.5)), r"\(0, 1\]"),
        (dict(gamma=torch.full((3,), 0.5)), r"\(2,\)"),
        (dict(gamma=torch.full((1, 2, 5), 0.5)), r"\(1, 2, 6\)"),
        (dict(gamma=torch.full((1, 6, 2), 0.5)), "batch, heads, seq"),
        (dict(gamma="retnet"), "tensor"),
        (dict(gamma=torch.full((2,), 0.5), log_space=True), "<= 0"),
        (dict(gamma=torch.full((2,), -math.inf), log_space=True), "finite"),
        (dict(gamma=torch.full((2,), 0.5), chunk=0), "chunk"),
        (dict(gamma=torch.full((2,), 0.5), eps=-1.0), "eps"),
        (dict(gamma=torch.full((2,), 0.5), state=torch.zeros(1, 2, 4, 4)), "state"),
        (dict(gamma=torch.full((2,), 0.5), normalize="yes"), "normalize"),
    ]
    for kwargs, match in cases:
        for fn in (D.decayed_linear_attention, D.decayed_linear_attention_recurrent):
            if fn is D.decayed_linear_attention_recurrent and "chunk" in kwargs:
                continue  # the recurrence has no chunks
            with pytest.raises(ValueError, match=match):
                fn(q, k, v, **kwargs)
    with pytest.raises(ValueError, match="same shape"):
        D.decayed_linear_attention(q, k[:, :, :5], v, torch.full((2,), 0.5))
    with pytest.raises(ValueError, match="temperature"):
        pe.gate_decay(torch.zeros(3), 0.0)
    with pytest.raises(ValueError, match="logits"):
        pe.gate_decay([0.0], 16.0)


def test_empty_and_meta():
    q, k, v = qkv(n=0)
    gamma = torch.full((3,), 0.5)
    for fn in (D.decayed_linear_attention, D.decayed_linear_attention_recurrent):
        out, state = fn(q, k, v, gamma, return_state=True)
        assert out.shape == (2, 3, 0, 5) and torch.equal(state, torch.zeros(2, 3, 4, 5, dtype=torch.float64))
    q, k, v = (x.to("meta") for x in qkv(n=9))
    assert D.decayed_linear_attention(q, k, v, gamma, chunk=4).shape == (2, 3, 9, 5)


# ---------------------------------------------------------------------------
# Layers and TinyLM
# ---------------------------------------------------------------------------


def _heads(layer, x):
    b, t, _ = x.shape
    return (u.reshape(b, t, layer.n_heads, layer.head_dim).transpose(1, 2) for u in layer.qkv(x).chunk(3, -1))


def test_layers_compute_the_functions():
    torch.manual_seed(0)
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    for rope in (False, True):
        layer = Y.DecayAttention(16, 4, decay="alibi", rope=rope, chunk_size=4).double()
        q, k, v = _heads(layer, x)
        if rope:
            q, k = pe.apply_rope(q), pe.apply_rope(k)
        y = D.decayed_linear_attention(q, k, v, pe.decay_rates("alibi", 4, dtype=torch.float64))
        assert torch.allclose(layer(x), layer.proj(y.transpose(1, 2).reshape(2, 13, 16)), atol=1e-12)
        w = layer.attention_weights(x)
        assert torch.allclose(w, D.decayed_attention_weights(q, k, pe.decay_rates("alibi", 4, dtype=torch.float64)))
        gated = Y.GatedDecayAttention(16, 4, gate_temperature=4.0, rope=rope).double()
        q, k, v = _heads(gated, x)
        if rope:
            q, k = pe.apply_rope(q), pe.apply_rope(k)
        g = torch.sigmoid(gated.gate(x)).transpose(1, 2) ** (1 / 4)  # (batch, heads, seq)
        y = D.decayed_linear_attention_recurrent(q, k, v, g)
        assert torch.allclose(gated(x), gated.proj(y.transpose(1, 2).reshape(2, 13, 16)), atol=1e-12)
        assert gated.attention_weights(x).shape == (2, 4, 13, 13)
    assert isinstance(pe.attention_layer("gated", 16, 4), Y.GatedDecayAttention)
    assert pe.attention_layer("decay", 16, 4).decay == "retnet"
    assert {"decay", "gated"} <= set(pe.ATTENTION_KINDS)


def test_layer_errors():
    with pytest.raises(ValueError, match="causal"):
        Y.DecayAttention(16, 4, causal=False)
    with pytest.raises(ValueError, match="gate_temperature"):
        Y.GatedDecayAttention(16, 4, gate_temperature=0)
    with pytest.raises(ValueError, match="rotation only"):
        Y.DecayAttention(16, 4)(torch.randn(1, 5, 16), Y.Positions(slopes=pe.alibi_slopes(4)))
    with pytest.raises(ValueError, match="softmax"):
        pe.TinyLM(8, 16, 1, 2, position="alibi", attention="decay")
    with pytest.raises(ValueError, match="gate_temperature"):
        pe.TinyLM(8, 16, 1, 2, attention="gated", gate_temperature=float("nan"))


DATA = pe.MarkovChain(8, order=1, seed=0)


@pytest.mark.parametrize("attention", ["decay", "gated", ["decay", "softmax"], ["gated", "decay"]])
def test_tiny_lm_trains_short_and_runs_long(attention, tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    model = pe.TinyLM(8, 16, 2, 2, position="rope", attention=attention)
    result = pe.train(model, DATA, steps=3, seq_len=TRAIN_LEN, batch_size=2, progress=False, device="cpu")
    assert len(result.losses) == 3 and all(math.isfinite(x) for x in result.losses)
    model = result.model.eval()
    n, t = 16 * TRAIN_LEN, 100
    idx = torch.randint(8, (2, n), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 3) % 8
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, n, 8) and torch.isfinite(a).all()
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:], atol=1e-4)
    again = pe.train(pe.TinyLM(8, 16, 2, 2, position="rope", attention=attention), DATA, steps=3,
                     seq_len=TRAIN_LEN, batch_size=2, progress=False, device="cpu")
    assert again.from_cache  # the config (the decay's buffer included) rebuilds the model


def test_gate_projection_is_drawn_from_the_seed():
    a, b = (pe.TinyLM(8, 16, 2, 2, attention="gated") for _ in range(2))
    for model in (a, b):
        model.reset_parameters(torch.Generator().manual_seed(3))
    gate = a.blocks[0].attn.gate
    assert torch.equal(gate.weight, b.blocks[0].attn.gate.weight) and (gate.bias == 0).all()
    assert 0.01 < gate.weight.std().item() < 0.03
    assert not torch.equal(gate.weight, a.blocks[1].attn.gate.weight)


def _config(**kw):
    return json.dumps(pe.TinyLM(8, 16, 2, 2, **kw).config, sort_keys=True)


def test_config_of_decay_and_gated_models():
    retnet = pe.TinyLM(8, 16, 2, 2, attention="decay").config
    assert retnet["decay"] == "retnet" and "gate_temperature" not in retnet
    gated = pe.TinyLM(8, 16, 2, 2, attention="gated").config
    assert gated["gate_temperature"] == 16.0 and "decay" not in gated
    mixed = pe.TinyLM(8, 16, 2, 2, attention=["decay", "gated"], decay="alibi", gate_temperature=8).config
    assert (mixed["decay"], mixed["gate_temperature"]) == ("alibi", 8.0)
    assert "decay" not in pe.TinyLM(8, 16, 2, 2, decay="alibi").config  # no decay layer: not in the config
    own = pe.TinyLM(8, 16, 2, 2, attention="decay", decay=torch.tensor([0.5, 0.25], dtype=torch.float64)).config
    assert own["decay"] == [0.5, 0.25]
    kinds = [_config(attention="decay"), _config(attention="decay", decay="alibi"),
             _config(attention="decay", decay=[0.5, 0.25]), _config(attention="decay", decay=[0.5, 0.5]),
             _config(attention="gated"), _config(attention="gated", gate_temperature=4),
             _config(attention=["decay", "softmax"])]
    assert len(set(kinds)) == len(kinds)


@pytest.mark.parametrize("spell", [list, tuple, np.array, lambda x: torch.tensor(x, dtype=torch.float64),
                                   lambda x: np.array(x, dtype=np.float64)])
def test_config_is_equal_for_equal_values_in_any_spelling(spell):
    assert _config(attention="decay", decay=spell([0.5, 0.25])) == _config(attention="decay", decay=[0.5, 0.25])
    assert _config(attention="decay", decay="RetNet") == _config(attention="decay")
    for temperature in (16, np.int64(16), np.float32(16), torch.tensor(16.0)):
        assert _config(attention="gated", gate_temperature=temperature) == _config(attention="gated")


def test_return_attention_of_decay_layers():
    model = pe.TinyLM(8, 16, 2, 2, position="none", attention=["decay", "gated"]).eval()
    idx = torch.randint(8, (1, 12))
    logits, weights = model(idx, return_attention=True)
    inputs = model.attention_inputs(idx)
    for layer, w, x in zip(model.blocks, weights, inputs):
        assert w.shape == (1, 2, 12, 12) and (w.triu(1) == 0).all()
        assert torch.allclose(w, layer.attn.attention_weights(x, Y.Positions()), atol=1e-6)
    assert torch.allclose(logits, model(idx), atol=1e-6)


# ---------------------------------------------------------------------------
# Gates per key channel (GLA): S_t = diag(gamma_t) S_{t-1} + k_t v_t^T
# ---------------------------------------------------------------------------


def channel_gates(b=2, h=3, n=37, d=4, low=0.3, high=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(b, h, n, d, generator=g, dtype=torch.float64)


def channel_reference(q, k, v, gamma):
    """out_i = sum_{j<=i} sum_c q_ic k_jc (prod_{s=j+1}^{i} gamma_sc) v_j, by loops over the definition."""
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1):
            factor = torch.prod(gamma[:, :, j + 1:i + 1], dim=2)  # (b, h, d): 1 for j = i
            out[:, :, i] += (q[:, :, i] * k[:, :, j] * factor).sum(-1)[..., None] * v[:, :, j]
    return out


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 64])
def test_channel_gates_three_forms_equal_the_definition(chunk):
    q, k, v = qkv(n=23)
    gamma = channel_gates(n=23)
    want = channel_reference(q, k, v, gamma)
    got = pe.decayed_linear_attention(q, k, v, gamma, chunk=chunk, normalize=False)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pe.decayed_linear_attention_recurrent(q, k, v, gamma, normalize=False), want,
                               rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pe.decayed_attention_weights(q, k, gamma) @ v, want, rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), n=st.integers(1, 50), d=st.integers(1, 6), e=st.integers(1, 4),
       chunk=st.integers(1, 70), low=st.floats(1e-3, 0.99), seed=st.integers(0, 2**16))
def test_channel_gates_forms_agree_for_any_shape_and_chunk(b, h, n, d, e, chunk, low, seed):
    q, k, v = qkv(b, h, n, d, e, seed=seed)
    gamma = channel_gates(b, h, n, d, low=low, seed=seed + 1)
    chunked = pe.decayed_linear_attention(q, k, v, gamma, chunk=chunk, normalize=False)
    torch.testing.assert_close(chunked, pe.decayed_linear_attention_recurrent(q, k, v, gamma, normalize=False),
                               rtol=1e-9, atol=1e-9)


def test_equal_channel_gates_are_one_gate_per_head():
    q, k, v = qkv()
    per_head = gates()
    same = per_head[..., None].expand(*per_head.shape, q.shape[-1])
    torch.testing.assert_close(pe.decayed_linear_attention(q, k, v, same, chunk=8),
                               pe.decayed_linear_attention(q, k, v, per_head, chunk=8))


def test_channel_gates_carry_a_state_fed_in_pieces():
    q, k, v = qkv(n=40)
    gamma = channel_gates(n=40, d=4)
    whole, s_whole = pe.decayed_linear_attention(q, k, v, gamma, return_state=True, normalize=False)
    first, s = pe.decayed_linear_attention(q[:, :, :17], k[:, :, :17], v[:, :, :17], gamma[:, :, :17],
                                           return_state=True, normalize=False)
    second, s_end = pe.decayed_linear_attention_recurrent(q[:, :, 17:], k[:, :, 17:], v[:, :, 17:], gamma[:, :, 17:],
                                                          state=s, return_state=True, normalize=False)
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole)
    torch.testing.assert_close(s_end, s_whole)


def test_channel_gates_finite_and_causal_at_length_1024():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1024, 8, generator=g) for _ in range(3))
    log_gates = pe.gate_decay(200 * torch.randn(1, 2, 1024, 8, generator=g), log=True)  # gates near 0 and near 1
    out = pe.decayed_linear_attention(q, k, v, log_gates, log_space=True)
    assert out.isfinite().all()
    changed = v.clone()
    changed[:, :, 600:] = 1e3
    later = pe.decayed_linear_attention(q, k, changed, log_gates, log_space=True)
    torch.testing.assert_close(later[:, :, :600], out[:, :, :600])


def test_channel_gates_gradcheck():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 9, 3, 2))
    log_gates = torch.log(channel_gates(1, 2, 9, 3)).requires_grad_()
    assert torch.autograd.gradcheck(lambda *x: pe.decayed_linear_attention(*x, log_space=True, chunk=4),
                                    (q, k, v, log_gates))


def test_channel_gates_match_fla_naive_reference():
    """flash-linear-attention's naive_recurrent_gla: (B, T, H, K) inputs, log gates gk, q scaled by K^-1/2, no norm."""
    fla = pytest.importorskip("fla.ops.gla.naive")
    q, k, v = qkv(2, 3, 33, 8, 8, dtype=torch.float32)
    log_gates = torch.log(channel_gates(2, 3, 33, 8)).float()
    ref, _ = fla.naive_recurrent_gla(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), log_gates.transpose(1, 2))
    ours = pe.decayed_linear_attention(q * 8 ** -0.5, k, v, log_gates, log_space=True, normalize=False)
    torch.testing.assert_close(ours.transpose(1, 2), ref.to(ours.dtype), rtol=1e-4, atol=1e-5)


def test_channel_gates_of_a_wrong_shape_are_refused():
    q, k, v = qkv(d=4)
    with pytest.raises(ValueError, match="per key channel"):
        pe.decayed_linear_attention(q, k, v, channel_gates(d=5))
    with pytest.raises(ValueError, match=r"decays in \(0, 1\]"):
        pe.decayed_linear_attention(q, k, v, channel_gates(d=4) * 2)


def test_gated_model_with_a_gate_per_channel():
    model = pe.TinyLM(8, 16, 2, 2, position="none", attention="gated", gate="channel")
    layer = model.blocks[0].attn
    assert layer.gate.out_features == 16 and model.config["gate"] == "channel"
    assert "gate" not in pe.TinyLM(8, 16, 2, 2, position="none", attention="gated").config   # one per head: as before
    x = torch.randint(0, 8, (2, 5))
    _, log_gates = layer._qkv(torch.randn(2, 5, 16))
    assert log_gates.shape == (2, 2, 5, 8) and bool((log_gates <= 0).all())
    assert model(torch.randint(0, 8, (1, 1024))).isfinite().all() and model(x).shape == (2, 5, 8)
    with pytest.raises(ValueError, match="gate must be one of"):
        pe.TinyLM(8, 16, 2, 2, position="none", attention="gated", gate="key")
    with pytest.raises(ValueError, match="gate must be one of"):
        pe.attention_layer("gated", 16, 2, gate="row")
