"""Property-based tests (hypothesis) of the context-extension rules, ReRoPE / Self-Extend and attention sinks."""

import math

import pytest

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe

halves = st.integers(2, 64)  # dim = 2 * half >= 4
bases = st.one_of(st.floats(2.0, 1e6), st.sampled_from([10000.0, 500000.0]))
factors = st.floats(1.0, 64.0)
originals = st.integers(2, 10**5)
seeds = st.integers(0, 2**32 - 1)


@given(halves, bases, factors, st.floats(0.1, 8.0), st.floats(1.01, 8.0), originals)
def test_llama3_fast_pairs_plain_slow_pairs_divided_and_between_in_between(half, base, factor, low, ratio, length):
    dim, high = 2 * half, low * ratio
    plain = pe.rope_frequencies(dim, base)
    got = pe.rope_frequencies_llama3(dim, base, factor, low, high, length)
    wavelength = 2 * math.pi / plain
    fast, slow = wavelength < length / high, wavelength > length / low
    assert got.shape == plain.shape and torch.isfinite(got).all()
    assert torch.equal(got[fast], plain[fast])
    assert torch.allclose(got[slow], plain[slow] / factor, rtol=1e-12, atol=0)
    assert ((got <= plain * (1 + 1e-12)) & (got >= plain / factor * (1 - 1e-12))).all()
    # the scaled wavelengths still grow with the pair index (a monotone rule)
    assert (got[1:] <= got[:-1] * (1 + 1e-12)).all()


@given(halves, bases, factors, originals, st.integers(1, 10**6))
def test_dynamic_is_plain_up_to_the_original_length_and_ntk_beyond(half, base, factor, length, n):
    dim = 2 * half
    plain = pe.rope_frequencies(dim, base)
    got = pe.rope_frequencies_dynamic_ntk(dim, n, length, base, factor)
    if n <= length:
        assert torch.equal(got, plain)
    else:
        s = factor * n / length - (factor - 1)
        assert torch.allclose(got, pe.rope_frequencies_ntk(dim, base, s), rtol=1e-10)
        assert got[0] == 1.0 and torch.isclose(got[-1], plain[-1] / s, rtol=1e-10)
        assert (got <= plain * (1 + 1e-12)).all()


@given(seeds, st.integers(2, 8), st.sampled_from(["linear", "ntk", "dynamic", "yarn", "llama3"]), factors,
       st.integers(2, 40), st.integers(1, 24), st.integers(0, 10**4))
def test_scaled_rotations_keep_the_relative_property(seed, half, method, factor, original, n, shift):
    """Any frequency rule is still RoPE: scores depend on the offset only (up to YaRN's constant factor)."""
    dim = 2 * half
    scaling = pe.RopeScaling(method, factor, original if method in ("dynamic", "yarn", "llama3") else None)
    inv = scaling.inv_freq(dim, 10000.0, n)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, n, dim, generator=g, dtype=torch.float64)
    pos = torch.arange(n, dtype=torch.float64)
    scores = pe.apply_rope(q, pos, inv_freq=inv) @ pe.apply_rope(k, pos, inv_freq=inv).T
    moved = pe.apply_rope(q, pos + shift, inv_freq=inv) @ pe.apply_rope(k, pos + shift, inv_freq=inv).T
    assert torch.allclose(scores, moved, atol=1e-8 * (1 + shift))


@given(st.integers(1, 40), st.integers(0, 20), st.integers(1, 50))
def test_rerope_positions_are_clipped_and_self_extend_grows_slower(q_len, extra, window):
    k_len = q_len + extra
    r = pe.rerope_positions(q_len, window, k_len)
    exact = pe.relative_positions(q_len, k_len).neg()
    assert torch.equal(r, exact.clamp(max=window))
    for group in (1, 2, 5):
        s = pe.self_extend_positions(q_len, group, window, k_len)
        past = exact >= 0
        # grouped positions never outgrow the exact ones by more than the floor's rounding (one)
        assert (s[past] <= exact[past] + 1).all() and (s[past] >= 0).all()
        assert int(s[past].max()) <= (k_len - 1) // group + window
        assert torch.equal(s[exact < window], exact[exact < window])
        if group == 1:
            assert torch.equal(s, exact)


@given(seeds, st.integers(1, 30), st.integers(0, 12), st.integers(1, 20), st.integers(0, 40))
def test_sink_attention_equals_the_masked_reference(seed, q_len, extra, window, sinks):
    k_len = q_len + extra
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, q_len, 4, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, k_len, 4, generator=g, dtype=torch.float64)
    mask = pe.sliding_window_mask(q_len, k_len, window=window, sinks=sinks)
    ref = pe.attention(q, k, v, mask=mask)
    assert torch.allclose(pe.sink_attention(q, k, v, window=window, sinks=sinks), ref, atol=1e-10)


# --------------------------------------------------------------------------- random arguments, good and bad

from test_properties_encodings import _real, even_dim, number  # noqa: E402  (the shared argument strategies)


def integer(low):
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low  # noqa: E731
    return st.one_of(st.integers(low, 10**5), st.sampled_from([low - 1, -3, 2.5, True, "8", None, float("nan")])), ok


CASES = {
    "llama3": (lambda a: pe.rope_frequencies_llama3(a["dim"], a["base"], a["factor"], a["low"], 100.0,
                                                    a["length"]),
               {"dim": even_dim(), "base": number(1, 1e6), "factor": number(1, 64, closed=True),
                "low": number(0, 8), "length": integer(1)}),
    "llama3 bounds": (lambda a: pe.rope_frequencies_llama3(8, 10000.0, 2.0, 1.0, a["high"], 64),
                      {"high": number(1, 8)}),
    "dynamic": (lambda a: pe.rope_frequencies_dynamic_ntk(a["dim"], a["n"], a["length"], a["base"], a["factor"]),
                {"dim": even_dim(4), "n": integer(1), "length": integer(1), "base": number(1, 1e6),
                 "factor": number(1, 64, closed=True)}),
    "RopeScaling yarn": (lambda a: pe.RopeScaling("yarn", a["factor"], a["length"]).inv_freq(a["dim"]),
                         {"factor": number(1, 64, closed=True), "length": integer(2), "dim": even_dim()}),
    "RopeScaling rerope": (lambda a: pe.rope_scaling(("rerope", a["window"])).inv_freq(8), {"window": integer(1)}),
    "RoPE partial": (lambda a: pe.TinyLM(5, 32, 1, 2, position="rope", partial=a["partial"]),
                     {"partial": (st.one_of(st.floats(0.125, 1.0), st.sampled_from([0.0, -0.5, 1.5, True, None])),
                                  lambda v: _real(v) is not None and 0.125 <= _real(v) <= 1.0
                                  and int(16 * _real(v)) % 2 == 0)}),  # an even number of rotated channels
}


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=40)
@given(data=st.data())
def test_random_arguments_give_finite_values_or_value_error(name, data):
    call, arguments = CASES[name]
    args = {key: data.draw(strategy, label=key) for key, (strategy, _) in arguments.items()}
    if not all(check(args[key]) for key, (_, check) in arguments.items()):
        with pytest.raises(ValueError):
            call(args)
        return
    out = call(args)
    if isinstance(out, torch.Tensor):
        assert out.dtype == torch.float64 and torch.isfinite(out).all() and (out > 0).all()


@given(seeds, st.integers(1, 24), st.integers(0, 6), st.integers(1, 30), st.integers(1, 4),
       st.sampled_from([None, 3, 12]), st.integers(0, 5), st.booleans())
def test_two_pass_attention_equals_the_reference_with_explicit_relative_positions(seed, q_len, extra, window, group,
                                                                                   mask_window, sinks, interleaved):
    k_len = q_len + extra
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, q_len, 6, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, k_len, 6, generator=g, dtype=torch.float64)
    allowed = (pe.sliding_window_mask(q_len, k_len, window=mask_window, sinks=sinks) if mask_window
               else pe.causal_mask(q_len, k_len))
    kw = dict(interleaved=interleaved, mask_window=mask_window, sinks=sinks)
    for out, rel in ((pe.rerope_attention(q, k, v, window, **kw), pe.rerope_positions(q_len, window, k_len)),
                     (pe.self_extend_attention(q, k, v, group, window, **kw),
                      pe.self_extend_positions(q_len, group, window, k_len))):
        kk = pe.apply_rope(k[:, :, None].expand(-1, -1, q_len, -1, -1), -rel.double(), interleaved=interleaved)
        scores = torch.einsum("bhid,bhijd->bhij", q, kk) / math.sqrt(6)
        ref = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
        assert torch.allclose(out, ref, atol=1e-10)


@given(seeds, st.integers(1, 30), st.integers(1, 12), st.integers(0, 6))
def test_streaming_attention_equals_token_by_token_decoding(seed, n, window, sinks):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, n, 4, generator=g, dtype=torch.float64)
    out = pe.streaming_attention(q, k, v, window, sinks)
    for i in range(n):
        kept = sorted(set(range(min(sinks, i + 1))) | set(range(max(0, i - window + 1), i + 1)))
        pos = torch.arange(len(kept), dtype=torch.float64)  # positions inside the rolling cache
        ref = pe.attention(pe.apply_rope(q[:, :, i:i + 1], pos[-1:]), pe.apply_rope(k[:, :, kept], pos),
                           v[:, :, kept], causal=False)
        assert torch.allclose(out[:, :, i:i + 1], ref, atol=1e-10)
