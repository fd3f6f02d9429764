"""p-RoPE (Barbero et al., 2025): RoPE keeping the fraction p of its highest frequencies, the rest unrotated."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


def _p_rope_reference(x: np.ndarray, positions: np.ndarray, p: float, max_wavelength: float) -> np.ndarray:
    """The paper's definition (its appendix's apply_p_rope) in NumPy: timescales padded with infinity."""
    head_dim = x.shape[-1]
    rope_angles = int(p * head_dim // 2)
    nope_angles = head_dim // 2 - rope_angles
    fraction = 2.0 * np.arange(rope_angles) / head_dim
    timescale = np.concatenate([max_wavelength ** fraction, np.full(nope_angles, np.inf)])
    sinusoid = positions[..., None] / timescale           # (seq, head_dim / 2); 0 where the timescale is infinite
    sin, cos = np.sin(sinusoid), np.cos(sinusoid)
    first, second = np.split(x, 2, axis=-1)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


@settings(max_examples=40, deadline=None)
@given(half=st.integers(1, 32), p=st.floats(0, 1), base=st.floats(2, 1e6), seq=st.integers(1, 40))
def test_rotation_is_the_paper_s_definition(half, p, base, seq):
    dim = 2 * half
    x = torch.randn(seq, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seq))
    positions = torch.arange(seq, dtype=torch.float64)
    ours = pe.apply_rope(x, inv_freq=pe.p_rope_frequencies(dim, base, p))
    theirs = _p_rope_reference(x.numpy(), positions.numpy(), p, base)
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(half=st.integers(1, 64), p=st.floats(0, 1), base=st.floats(1.5, 1e7))
def test_frequencies_keep_the_fastest_pairs_and_zero_the_rest(half, p, base):
    dim = 2 * half
    freqs, full = pe.p_rope_frequencies(dim, base, p), pe.rope_frequencies(dim, base)
    kept = int(p * dim // 2)
    assert freqs.dtype == torch.float64 and freqs.shape == (half,)
    assert torch.equal(freqs[:kept], full[:kept]) and bool((freqs[kept:] == 0).all())


def test_p_one_is_rope_and_p_zero_is_no_rotation():
    assert torch.equal(pe.p_rope_frequencies(16, 500.0, 1.0), pe.rope_frequencies(16, 500.0))
    assert bool((pe.p_rope_frequencies(16, 500.0, 0.0) == 0).all())
    assert pe.p_rope_frequencies(16, p=0.75).count_nonzero() == 6   # int(0.75 * 16 // 2)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5", None])
def test_bad_p_is_refused(bad):
    with pytest.raises(ValueError, match=r"p \(the kept fraction"):
        pe.p_rope_frequencies(8, 100.0, bad)
    with pytest.raises(ValueError, match=r"p \(the kept fraction"):
        pe.TinyLM(10, 16, 1, 2, position="p_rope", p=bad)


def _same_weights(a: pe.TinyLM, b: pe.TinyLM) -> None:
    b.load_state_dict(a.state_dict())


@pytest.mark.parametrize("interleaved", [False, True])
def test_model_with_p_one_equals_rope_and_p_zero_equals_nope(interleaved):
    idx = torch.randint(0, 11, (2, 33), generator=torch.Generator().manual_seed(0))
    rope = pe.TinyLM(11, 32, 2, 4, position="rope", interleaved=interleaved)
    with torch.no_grad():  # sharper attention than at initialisation, so that positions show in the logits
        for block in rope.blocks:
            block.attn.qkv.weight.mul_(30)
    full = pe.TinyLM(11, 32, 2, 4, position="p_rope", p=1.0, interleaved=interleaved)
    _same_weights(rope, full)
    torch.testing.assert_close(full(idx), rope(idx), rtol=0, atol=0)
    nope = pe.TinyLM(11, 32, 2, 4, position="none")
    none = pe.TinyLM(11, 32, 2, 4, position="p-rope", p=0.0, interleaved=interleaved)   # either spelling
    _same_weights(nope, none)
    torch.testing.assert_close(none(idx), nope(idx), rtol=1e-6, atol=1e-6)
    half = pe.TinyLM(11, 32, 2, 4, position="p_rope", p=0.5, interleaved=interleaved)
    _same_weights(rope, half)
    assert not torch.allclose(half(idx), rope(idx), atol=1e-4) and not torch.allclose(half(idx), none(idx), atol=1e-4)


def test_the_slow_channels_are_left_as_they_are():
    model = pe.TinyLM(11, 32, 1, 2, position="p_rope", p=0.25)                  # head_dim 16: 2 of 8 pairs rotate
    scheme = model.position
    assert scheme.rotated_pairs == 2
    qk = torch.randn(2, 1, 2, 20, 16)
    out = scheme.rotate(qk)
    moved = [0, 1, 8, 9]                                                         # pairs (i, i + 8), i < 2
    still = [c for c in range(16) if c not in moved]
    torch.testing.assert_close(out[..., still], qk[..., still], rtol=0, atol=0)
    assert not torch.allclose(out[..., moved], qk[..., moved])


def test_scheme_config_cache_key_and_scaling():
    a = pe.TinyLM(11, 32, 1, 2, position="p_rope")
    assert a.config["position"] == dict(scheme="p_rope", base=10000.0, interleaved=False, p=0.75)
    assert "p_rope" in pe.POSITION_SCHEMES and isinstance(a.position, pe.PRoPE)
    b = pe.TinyLM(11, 32, 1, 2, position="p_rope", p=0.25)
    assert a.config != b.config                                                    # p is in the cache key
    a.rope_scaling = None
    with pytest.raises(ValueError, match="p-RoPE"):
        a.rope_scaling = ("linear", 2)
    assert a.rope_scaling is None
    with pytest.raises(ValueError, match="takes the options"):
        pe.TinyLM(11, 32, 1, 2, position="p_rope", partial=0.5)


def test_relative_scores_depend_on_distance_only():
    """Like RoPE: shifting every position leaves q.k unchanged (the unrotated channels contribute q.k as is)."""
    inv = pe.p_rope_frequencies(16, 100.0, 0.5)
    q, k = torch.randn(2, 16, dtype=torch.float64).unbind()
    pos = torch.tensor([3.0, 11.0], dtype=torch.float64)
    for shift in (0.0, 5.0, 1000.0):
        rq = pe.apply_rope(q[None], pos[:1] + shift, inv_freq=inv)
        rk = pe.apply_rope(k[None], pos[1:] + shift, inv_freq=inv)
        score = (rq * rk).sum()
        if shift == 0.0:
            first = score
        torch.testing.assert_close(score, first, rtol=1e-9, atol=1e-9)
