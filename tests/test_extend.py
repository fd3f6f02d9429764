"""Context extension of RoPE models: frequency rules, scaling objects, partial rotation, model.rope_scaling."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


# --------------------------------------------------------------------------- frequency rules


def llama3_by_definition(dim, base, factor, low, high, length):
    """Meta's apply_scaling, written out pair by pair."""
    out = []
    for theta in pe.rope_frequencies(dim, base).tolist():
        wavelength = 2 * math.pi / theta
        if wavelength < length / high:
            out.append(theta)
        elif wavelength > length / low:
            out.append(theta / factor)
        else:
            smooth = (length / wavelength - low) / (high - low)
            out.append((1 - smooth) * theta / factor + smooth * theta)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dim,base,factor,low,high,length", [
    (128, 500000.0, 8.0, 1.0, 4.0, 8192),   # Llama 3.1
    (64, 10000.0, 4.0, 1.0, 4.0, 64),
    (16, 10000.0, 2.0, 0.5, 8.0, 256),
])
def test_llama3_matches_its_definition(dim, base, factor, low, high, length):
    got = pe.rope_frequencies_llama3(dim, base, factor, low, high, length)
    assert got.dtype == torch.float64 and got.shape == (dim // 2,)
    assert torch.allclose(got, llama3_by_definition(dim, base, factor, low, high, length), rtol=1e-12, atol=0)


def test_llama3_keeps_fast_pairs_and_divides_slow_ones():
    plain = pe.rope_frequencies(128, 500000.0)
    got = pe.rope_frequencies_llama3(128)
    wavelength = 2 * math.pi / plain
    fast, slow = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    assert torch.equal(got[fast], plain[fast])
    assert torch.allclose(got[slow], plain[slow] / 8, rtol=1e-14)
    assert ((got <= plain) & (got >= plain / 8)).all()
    assert torch.allclose(pe.rope_frequencies_llama3(128, factor=1.0), plain, rtol=1e-14, atol=0)


def test_dynamic_ntk_is_plain_up_to_the_original_length_and_hf_formula_beyond():
    plain = pe.rope_frequencies(32, 10000.0)
    for n in (1, 50, 64):
        assert torch.equal(pe.rope_frequencies_dynamic_ntk(32, n, 64), plain)
    for n, a in ((128, 1.0), (200, 2.0), (1000, 3.5)):
        base = 10000.0 * (a * n / 64 - (a - 1)) ** (32 / 30)
        assert torch.allclose(pe.rope_frequencies_dynamic_ntk(32, n, 64, factor=a), pe.rope_frequencies(32, base),
                              rtol=1e-13)
    # with a = 1 it is NTK-aware scaling with s = n / L
    assert torch.allclose(pe.rope_frequencies_dynamic_ntk(32, 256, 64), pe.rope_frequencies_ntk(32, 10000.0, 4.0),
                          rtol=1e-13)
    # the fastest pair never changes; the slowest is divided by exactly s = a n / L - (a - 1)
    f = pe.rope_frequencies_dynamic_ntk(32, 300, 100, factor=2.0)
    assert f[0] == 1.0 and torch.isclose(f[-1], plain[-1] / 5.0, rtol=1e-12)


@pytest.mark.parametrize("call", [
    lambda: pe.rope_frequencies_llama3(7),
    lambda: pe.rope_frequencies_llama3(8, factor=0.5),
    lambda: pe.rope_frequencies_llama3(8, low_freq_factor=4.0, high_freq_factor=4.0),
    lambda: pe.rope_frequencies_llama3(8, low_freq_factor=0.0),
    lambda: pe.rope_frequencies_llama3(8, original_max_position=0),
    lambda: pe.rope_frequencies_llama3(8, base=1.0),
    lambda: pe.rope_frequencies_dynamic_ntk(2, 10, 5),
    lambda: pe.rope_frequencies_dynamic_ntk(8, 0, 5),
    lambda: pe.rope_frequencies_dynamic_ntk(8, 10, 5, factor=0.9),
    lambda: pe.rope_frequencies_dynamic_ntk(8, 10, 5.5),
    lambda: pe.rope_frequencies_dynamic_ntk(8, True, 5),
])
def test_frequency_rules_reject_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


# --------------------------------------------------------------------------- scaling objects


def test_rope_scaling_parses_the_short_forms():
    assert pe.rope_scaling(None) is None
    assert pe.rope_scaling(("yarn", 4)) == pe.RopeScaling("yarn", 4.0)
    assert pe.rope_scaling(["linear", 2]).factor == 2.0
    assert pe.rope_scaling("dynamic") == pe.RopeScaling("dynamic")
    assert pe.rope_scaling(("rerope", 16)).window == 16
    s = pe.rope_scaling(("self_extend", 4, 32))
    assert (s.group, s.window, s.two_pass) == (4, 32, True)
    hf = pe.rope_scaling({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                          "beta_fast": 16})
    assert hf == pe.RopeScaling("yarn", 8.0, 64, beta_fast=16)
    obj = pe.RopeScaling("llama3", 8.0)
    assert pe.rope_scaling(obj) is obj
    assert set(pe.ROPE_SCALING_METHODS) == {"linear", "ntk", "dynamic", "yarn", "llama3", "rerope", "self_extend"}


@pytest.mark.parametrize("bad", [
    ("unknown", 2), ("yarn", 0.5), ("linear", -1), ("linear", 2, 3), ("rerope",), ("rerope", 0),
    ("self_extend", 0, 8), ("self_extend", 2), 3, ("yarn", "4"), {"factor": 2}, {"method": "yarn", "speed": 2},
    (), (4, "yarn"),
])
def test_bad_scalings_raise_value_error(bad):
    with pytest.raises(ValueError):
        pe.rope_scaling(bad)


def test_bad_scaling_fields_raise_value_error():
    for kwargs in (dict(beta_fast=1.0, beta_slow=2.0), dict(original_max_position=1), dict(attention_factor=0.0)):
        with pytest.raises(ValueError):
            pe.RopeScaling("yarn", 2.0, **kwargs)
    with pytest.raises(ValueError):
        pe.RopeScaling("llama3", 2.0, low_freq_factor=5.0)


def test_scaling_frequencies_are_the_rules():
    dim, base = 16, 10000.0
    assert torch.equal(pe.RopeScaling("linear", 4).inv_freq(dim, base), pe.rope_frequencies_interpolated(dim, base, 4))
    assert torch.equal(pe.RopeScaling("ntk", 4).inv_freq(dim, base), pe.rope_frequencies_ntk(dim, base, 4))
    assert torch.equal(pe.RopeScaling("yarn", 4, 64).inv_freq(dim, base), pe.rope_frequencies_yarn(dim, base, 4, 64))
    assert torch.equal(pe.RopeScaling("llama3", 4, 64).inv_freq(dim, base),
                       pe.rope_frequencies_llama3(dim, base, 4, 1, 4, 64))
    assert torch.equal(pe.RopeScaling("dynamic", 2, 64).inv_freq(dim, base, 300),
                       pe.rope_frequencies_dynamic_ntk(dim, 300, 64, base, 2))
    assert torch.equal(pe.RopeScaling("rerope", window=4).inv_freq(dim, base), pe.rope_frequencies(dim, base))
    with pytest.raises(ValueError, match="training length"):
        pe.RopeScaling("yarn", 4).inv_freq(dim, base)
    with pytest.raises(ValueError, match="seq_len"):
        pe.RopeScaling("dynamic", 2, 64).inv_freq(dim, base)
    assert pe.RopeScaling("yarn", 4).attention_scale() == pe.yarn_attention_factor(4)
    assert pe.RopeScaling("yarn", 4, attention_factor=1.0).attention_scale() == 1.0
    assert pe.RopeScaling("linear", 4).attention_scale() == 1.0
    assert pe.RopeScaling("yarn", 4, 64).config() == {"method": "yarn", "factor": 4.0, "original_max_position": 64}


# --------------------------------------------------------------------------- the scheme and the model


def model(**kw):
    torch.manual_seed(0)
    kw.setdefault("train_len", 16)
    return pe.TinyLM(23, d_model=32, n_layers=2, n_heads=2, position="rope", **kw)


def test_rope_scaling_is_evaluation_time_and_restorable():
    m = model()
    x = torch.randint(23, (2, 48))
    key = m.config
    with torch.no_grad():
        plain = m(x)
        for spec in [("linear", 3), ("ntk", 3), ("yarn", 3), ("llama3", 3), ("rerope", 8), ("self_extend", 2, 8)]:
            m.rope_scaling = spec
            assert m.rope_scaling == pe.rope_scaling(spec).with_original(16) or not m.rope_scaling.needs_original
            out = m(x)
            assert out.shape == plain.shape and torch.isfinite(out).all()
            assert not torch.allclose(out, plain), spec
            assert m.config == key, "rope_scaling must not change the cache key of the architecture"
            assert "rope_scaling" in repr(m)
        m.rope_scaling = None
        assert m.rope_scaling is None
        assert torch.equal(m(x), plain)


def test_dynamic_scaling_is_plain_rope_up_to_the_training_length():
    m = model()
    x = torch.randint(23, (2, 40))
    with torch.no_grad():
        plain = m(x)
        m.rope_scaling = ("dynamic", 2.0)
        assert torch.equal(m(x[:, :16]), plain[:, :16])
        assert not torch.allclose(m(x)[:, 16:], plain[:, 16:])


def test_scaling_reads_the_training_length_or_raises():
    m = model(train_len=None)
    with pytest.raises(ValueError, match="train_len"):
        m.rope_scaling = ("yarn", 2)
    m.rope_scaling = ("linear", 2)  # needs no length
    m.train_len = 32
    m.rope_scaling = ("yarn", 2)
    assert m.rope_scaling.original_max_position == 32
    m.rope_scaling = pe.RopeScaling("yarn", 2, original_max_position=8)
    assert m.rope_scaling.original_max_position == 8
    own = pe.TinyLM(23, 32, 1, 2, position="rope", original_max_position=12, train_len=99)
    own.rope_scaling = ("llama3", 2)
    assert own.rope_scaling.original_max_position == 12
    assert own.config == pe.TinyLM(23, 32, 1, 2, position="rope").config


def test_scaled_rotation_equals_apply_rope_with_the_rule_and_yarn_temperature_squares_the_logits():
    scheme = pe.RoPE()
    scheme.bind(d_model=16, n_heads=2, n_layers=1)
    qk = torch.randn(2, 1, 2, 20, 8, dtype=torch.float64)
    scheme.set_scaling(("yarn", 4.0), train_len=10)
    got = scheme.rotate(qk)
    inv = pe.rope_frequencies_yarn(8, 10000.0, 4.0, 10)
    t = pe.yarn_attention_factor(4.0)
    assert torch.allclose(got, t * pe.apply_rope(qk, inv_freq=inv), atol=1e-12)
    plain_logits = pe.apply_rope(qk[0], inv_freq=inv) @ pe.apply_rope(qk[1], inv_freq=inv).transpose(-2, -1)
    assert torch.allclose(got[0] @ got[1].transpose(-2, -1), t ** 2 * plain_logits, atol=1e-10)
    for spec in (("dynamic", 1.0), ("llama3", 2.0)):
        with pytest.raises(ValueError, match="training length"):  # no training length known to the scheme alone
            scheme.scaling = spec
    scheme.scaling = ("ntk", 2.0)  # needs none
    assert scheme.scaling == pe.RopeScaling("ntk", 2.0)


def test_rope_scaling_needs_a_rope_model():
    m = pe.TinyLM(23, 32, 1, 2, position="alibi", train_len=16)
    m.rope_scaling = None  # nothing to undo
    assert m.rope_scaling is None
    with pytest.raises(ValueError, match="RoPE"):
        m.rope_scaling = ("yarn", 2)
    lin = pe.TinyLM(23, 32, 1, 2, position="rope", attention="linear", train_len=16)
    lin.rope_scaling = ("linear", 2)  # a rotation: linear attention takes it
    with pytest.raises(ValueError, match="softmax"):
        lin.rope_scaling = ("rerope", 4)
    assert lin.rope_scaling == pe.RopeScaling("linear", 2)  # a refused value changes nothing
    m = model(train_len=None)
    m.rope_scaling = ("ntk", 2)
    with pytest.raises(ValueError):
        m.rope_scaling = ("yarn", 2)
    assert m.rope_scaling == pe.RopeScaling("ntk", 2)


# --------------------------------------------------------------------------- partial rotation


def test_partial_rotation_rotates_the_first_channels_only_and_enters_the_config():
    scheme = pe.RoPE(partial=0.25)
    scheme.bind(d_model=32, n_heads=2, n_layers=1)  # head_dim 16: 4 channels rotated
    assert scheme.rotary_dim == 4 and scheme.partial == 0.25
    qk = torch.randn(2, 1, 2, 9, 16)
    out = scheme.rotate(qk)
    assert torch.equal(out[..., 4:], qk[..., 4:])
    assert torch.allclose(out[..., :4], pe.apply_rope(qk[..., :4]), atol=1e-6)
    full, part = model(), model(partial=0.5)
    assert full.config["position"] == {"scheme": "rope", "base": 10000.0, "interleaved": False}
    assert part.config["position"]["partial"] == 0.5 and part.config != full.config
    x = torch.randint(23, (1, 30))
    with torch.no_grad():
        for spec in (("yarn", 2), ("rerope", 4), ("self_extend", 2, 4), ("dynamic", 2)):
            part.rope_scaling = spec
            assert torch.isfinite(part(x)).all()


def test_partial_rotation_with_yarn_scales_every_channel():
    scheme = pe.RoPE(partial=0.5)
    scheme.bind(d_model=16, n_heads=1, n_layers=1)
    scheme.set_scaling(("yarn", 4.0), train_len=8)
    qk = torch.randn(2, 1, 1, 5, 16)
    assert torch.allclose(scheme.rotate(qk)[..., 8:], pe.yarn_attention_factor(4.0) * qk[..., 8:])


@pytest.mark.parametrize("partial", [0.0, -0.5, 1.5, float("nan"), "half", True])
def test_partial_outside_the_unit_interval_raises(partial):
    with pytest.raises(ValueError, match="partial"):
        pe.RoPE(partial=partial)


def test_partial_that_leaves_no_even_pair_raises():
    with pytest.raises(ValueError, match="even"):
        pe.TinyLM(23, 32, 1, 2, position="rope", partial=0.1)  # int(0.1 * 16) = 1 channel
    with pytest.raises(ValueError, match="even"):
        pe.TinyLM(23, 32, 1, 2, position="rope", partial=0.2)  # int(3.2) = 3 channels: odd
    assert pe.TinyLM(23, 32, 1, 2, position="rope", partial=0.3).position.rotary_dim == 4  # int(4.8)


def test_the_scheme_lives_in_its_topic_module_and_the_rotation_is_found_there_too():
    import posenc.rope
    import posenc.rotary

    assert posenc.rope.RoPE is pe.RoPE and pe.RoPE.__module__ == "posenc.rope"
    assert all(getattr(posenc.rope, name) is getattr(posenc.rotary, name) for name in posenc.rotary.__all__)
    assert isinstance(pe.position_scheme("rope"), pe.RoPE) and "rope" in pe.POSITION_SCHEMES
    assert isinstance(pe.TinyLM(5, 16, 1, 2).position, pe.RoPE)


# --- the smallest base for a context length (Men et al., 2024) -------------------------------------------------

def _cos_sums(context_length, dim, base):
    theta = torch.tensor(float(base), dtype=torch.float64) ** (-2 * torch.arange(dim // 2, dtype=torch.float64) / dim)
    m = torch.arange(context_length + 1, dtype=torch.float64)
    return torch.cos(m[:, None] * theta).sum(1)                     # B(m), m = 0 .. context_length


@pytest.mark.parametrize("context_length, published", [(1024, 4.3e3), (8192, 8.4e4), (32768, 6.3e5)])
def test_rope_min_base_matches_the_published_lower_bounds(context_length, published):
    base = pe.rope_min_base(context_length, 128)
    assert abs(base / published - 1) < 0.02                          # Men et al.'s values for head_dim 128
    assert _cos_sums(context_length, 128, base).min() >= 0            # the definition holds at the base ...
    assert _cos_sums(context_length, 128, base * (1 - 2e-4)).min() < 0   # ... and fails just below it


@settings(max_examples=15, deadline=None)
@given(short=st.integers(1, 600), extra=st.integers(0, 600), dim=st.sampled_from([8, 16, 32, 64]))
def test_rope_min_base_grows_with_the_context(short, extra, dim):
    """A base that serves a context serves every shorter one, so the smallest base cannot shrink as it grows."""
    a, b = pe.rope_min_base(short, dim), pe.rope_min_base(short + extra, dim)
    assert a <= b * (1 + 1e-3)
    assert _cos_sums(short + extra, dim, b).min() >= 0


def test_rope_min_base_refuses_bad_input():
    for kwargs, match in [(dict(context_length=0, dim=128), "context_length"), (dict(context_length=10, dim=7), "even"),
                          (dict(context_length=10, dim=8, rel_tol=1.5), "rel_tol"),
                          (dict(context_length=10.5, dim=8), "context_length")]:
        with pytest.raises(ValueError, match=match):
            pe.rope_min_base(**kwargs)
