"""Context extension (PI, NTK-aware, YaRN), the Abel-summation decay curve and
the RotaryEmbedding module: identities from the papers, not stored outputs."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe

DIM, BASE = 64, 10000.0


# --- position interpolation -------------------------------------------------

@pytest.mark.parametrize("scale", [1, 2, 3.5, 8])
def test_pi_position_s_m_has_the_angles_of_m(scale):
    m = torch.arange(0, 4096, 7, dtype=torch.float64)
    inv = pe.rope_frequencies_interpolated(DIM, BASE, scale)
    stretched = pe.rope_angles(scale * m, DIM, inv_freq=inv)
    original = pe.rope_angles(m, DIM, BASE)
    assert torch.allclose(stretched, original, rtol=1e-12, atol=0)


def test_pi_is_plain_division():
    inv = pe.rope_frequencies_interpolated(DIM, BASE, 4)
    assert inv.dtype == torch.float64 and inv.shape == (DIM // 2,)
    assert torch.equal(inv * 4, pe.rope_frequencies(DIM, BASE))


# --- NTK-aware ---------------------------------------------------------------

@pytest.mark.parametrize("dim", [4, 64, 128])
@pytest.mark.parametrize("scale", [1, 2, 8, 16.5])
def test_ntk_keeps_highest_and_divides_lowest_by_s(dim, scale):
    orig = pe.rope_frequencies(dim, BASE)
    ntk = pe.rope_frequencies_ntk(dim, BASE, scale)
    assert ntk[0].item() == 1.0 == orig[0].item()
    assert math.isclose(ntk[-1].item(), orig[-1].item() / scale, rel_tol=1e-12)
    # in between: theta_i / s^(2i/(d-2)), a geometric blend
    i = torch.arange(dim // 2, dtype=torch.float64)
    assert torch.allclose(ntk, orig / scale ** (2 * i / (dim - 2)), rtol=1e-12, atol=0)


def test_ntk_equals_the_bigger_base():
    s = 4.0
    assert torch.allclose(
        pe.rope_frequencies_ntk(128, BASE, s),
        pe.rope_frequencies(128, BASE * s ** (128 / 126)), rtol=1e-14, atol=0)


# --- YaRN --------------------------------------------------------------------

def _rotations(inv_freq, length):
    return length * inv_freq / (2 * math.pi)


@pytest.mark.parametrize("dim,base,length,scale", [
    (128, 10000.0, 4096, 16), (128, 10000.0, 2048, 4), (64, 500000.0, 8192, 8), (96, 10000.0, 1024, 2.5)])
def test_yarn_by_parts_limits(dim, base, length, scale):
    orig = pe.rope_frequencies(dim, base)
    yarn = pe.rope_frequencies_yarn(dim, base, scale, length)
    rot = _rotations(orig, length)
    untouched = torch.isclose(yarn, orig, rtol=1e-12, atol=0)
    interpolated = torch.isclose(yarn, orig / scale, rtol=1e-12, atol=0)
    # every pair that turns more than beta_fast = 32 times is left alone,
    # every pair that turns less than beta_slow = 1 time is interpolated like PI
    assert untouched[rot > 32].all()
    assert interpolated[rot < 1].all()
    # conversely, only such pairs sit at the two ends of the ramp
    assert (rot[untouched] >= 32 - 1e-9).all()
    assert (rot[interpolated] <= 1 + 1e-9).all()
    # in between, the frequency lies between the two
    assert ((yarn <= orig * (1 + 1e-12)) & (yarn >= orig / scale * (1 - 1e-12))).all()
    # and the ratio yarn / orig decreases monotonically with the pair index
    ratio = yarn / orig
    assert (ratio[1:] <= ratio[:-1] + 1e-12).all()


def test_yarn_scale_one_is_identity():
    assert torch.allclose(pe.rope_frequencies_yarn(128, BASE, 1, 4096), pe.rope_frequencies(128, BASE),
                          rtol=1e-15, atol=0)


def test_yarn_extreme_lengths():
    # a tiny trained length: every pair turns less than 32 times -> ramp starts at 0;
    # an enormous one: every pair turns more than once -> nothing fully interpolated
    short = pe.rope_frequencies_yarn(64, BASE, 4, 8)
    assert torch.isclose(short[0], torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(short[-5:], pe.rope_frequencies(64, BASE)[-5:] / 4, rtol=1e-12, atol=0)
    huge = pe.rope_frequencies_yarn(64, BASE, 4, 10**9)
    assert torch.allclose(huge, pe.rope_frequencies(64, BASE), rtol=1e-12, atol=0)


def test_yarn_truncate_false_uses_fractional_ends():
    a = pe.rope_frequencies_yarn(128, BASE, 16, 4096, truncate=False)
    b = pe.rope_frequencies_yarn(128, BASE, 16, 4096)
    assert not torch.allclose(a, b)
    orig = pe.rope_frequencies(128, BASE)
    assert ((a <= orig * (1 + 1e-12)) & (a >= orig / 16 * (1 - 1e-12))).all()


def test_yarn_attention_factor():
    assert pe.yarn_attention_factor(1) == 1.0
    assert pe.yarn_attention_factor(0.5) == 1.0
    assert math.isclose(pe.yarn_attention_factor(math.e), 1.1)
    assert math.isclose(pe.yarn_attention_factor(16), 0.1 * math.log(16) + 1)


@pytest.mark.parametrize("fn", [pe.rope_frequencies_interpolated, pe.rope_frequencies_ntk])
@pytest.mark.parametrize("scale", [0.5, 0, -2, float("nan"), float("inf"), True, "2"])
def test_bad_scale_raises(fn, scale):
    with pytest.raises(ValueError):
        fn(DIM, BASE, scale)


@pytest.mark.parametrize("scale", [0.5, 0, -2, float("nan")])
def test_bad_scale_raises_yarn(scale):
    with pytest.raises(ValueError):
        pe.rope_frequencies_yarn(DIM, BASE, scale, 4096)


@pytest.mark.parametrize("scale", [0, -1, float("nan"), float("inf")])
def test_bad_scale_raises_attention_factor(scale):
    with pytest.raises(ValueError):
        pe.yarn_attention_factor(scale)


@pytest.mark.parametrize("kwargs", [
    dict(original_max_len=0), dict(original_max_len=4096.0), dict(original_max_len=4096, beta_fast=1, beta_slow=32),
    dict(original_max_len=4096, beta_slow=0)])
def test_yarn_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        pe.rope_frequencies_yarn(DIM, BASE, 4, **kwargs)


@pytest.mark.parametrize("dim", [0, 2, 7])
def test_bad_dim_raises(dim):
    with pytest.raises(ValueError):
        pe.rope_frequencies_ntk(dim, BASE, 2)
    if dim != 2:
        with pytest.raises(ValueError):
            pe.rope_frequencies_interpolated(dim, BASE, 2)
        with pytest.raises(ValueError):
            pe.rope_frequencies_yarn(dim, BASE, 2, 4096)


def test_extended_frequencies_work_in_apply_rope():
    x = torch.randn(1, 2, 16, DIM, generator=torch.Generator().manual_seed(0))
    for inv in (pe.rope_frequencies_interpolated(DIM, BASE, 4), pe.rope_frequencies_ntk(DIM, BASE, 4),
                pe.rope_frequencies_yarn(DIM, BASE, 4, 512)):
        y = pe.apply_rope(x, inv_freq=inv)
        assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


# --- the Abel-summation decay curve -----------------------------------------

@pytest.mark.parametrize("dim", [2, 16, 128])
def test_decay_bound_at_zero(dim):
    assert math.isclose(pe.rope_decay_bound(torch.tensor(0.0), dim).item(), (dim // 2 + 1) / 2)
    assert math.isclose(pe.rope_decay_bound(torch.tensor([0.0]), dim, normalize=True).item(), 1.0)


def test_decay_bound_matches_direct_partial_sums():
    dim, r = 16, 37.0
    theta = pe.rope_frequencies(dim, BASE)
    partial = [abs(sum(complex(math.cos(r * t), math.sin(r * t)) for t in theta[:j].tolist()))
               for j in range(1, dim // 2 + 1)]
    assert math.isclose(pe.rope_decay_bound(torch.tensor(r), dim).item(), sum(partial) / (dim // 2))


def test_abel_bound_holds_for_random_q_k():
    # |sum_i h_i e^{i r theta_i}| <= max_i |h_{i+1} - h_i| * sum_j |S_j|, with h_{d/2} = 0
    g = torch.Generator().manual_seed(1)
    dim = 32
    theta = pe.rope_frequencies(dim, BASE)
    for _ in range(20):
        q, k = torch.randn(dim, dtype=torch.float64, generator=g), torch.randn(dim, dtype=torch.float64, generator=g)
        h = torch.complex(q[0::2], q[1::2]) * torch.complex(k[0::2], k[1::2]).conj()
        r = float(torch.randint(0, 500, (1,), generator=g))
        lhs = (h * torch.polar(torch.ones_like(theta), r * theta)).sum().abs()
        dh = torch.cat((h, h.new_zeros(1))).diff().abs().max()
        rhs = dh * pe.rope_decay_bound(torch.tensor(r), dim) * (dim // 2)
        assert lhs <= rhs + 1e-9
        # the left side is also the RoPE score's magnitude bound: score = Re(sum ...)
        qm = pe.apply_rope(q[None], torch.tensor([r]), interleaved=True)
        k0 = pe.apply_rope(k[None], torch.tensor([0.0]), interleaved=True)
        assert abs((qm @ k0.T).item()) <= lhs + 1e-9


def test_decay_bound_shape_and_custom_freq():
    d = torch.arange(12.0).reshape(3, 4)
    assert pe.rope_decay_bound(d, 8).shape == (3, 4)
    # one frequency shared by every pair: the phases add up coherently, |S_j| = j
    # at every distance, so the curve stays at (d/2 + 1)/2: no decay at all
    same = torch.full((4,), 0.5, dtype=torch.float64)
    flat = pe.rope_decay_bound(torch.tensor([0.0, 1.3, 50.0]), 8, inv_freq=same)
    assert torch.allclose(flat, torch.full((3,), 2.5, dtype=torch.float64), rtol=1e-12, atol=0)


# --- RotaryEmbedding ---------------------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotary_embedding_equals_apply_rope(interleaved, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 10, 16, generator=g).to(dtype)
    k = torch.randn(2, 3, 10, 16, generator=g).to(dtype)
    rope = pe.RotaryEmbedding(16, base=500.0, interleaved=interleaved)
    rq, rk = rope(q, k)
    assert rq.dtype == dtype and rk.shape == k.shape
    assert torch.equal(rq, pe.apply_rope(q, base=500.0, interleaved=interleaved))
    assert torch.equal(rk, pe.apply_rope(k, base=500.0, interleaved=interleaved))
    # a shorter call reuses the cached table and still agrees
    rq5, _ = rope(q[..., :5, :], k[..., :5, :])
    assert torch.equal(rq5, pe.apply_rope(q[..., :5, :], base=500.0, interleaved=interleaved))


def test_rotary_embedding_positions_and_decoding():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 12, 8, generator=g)
    q = torch.randn(1, 2, 3, 8, generator=g)
    rope = pe.RotaryEmbedding(8)
    rq, rk = rope(q, k)  # queries are the last 3 of 12 positions
    assert torch.equal(rq, pe.apply_rope(q, torch.arange(9, 12)))
    assert torch.equal(rk, pe.apply_rope(k))
    pos = torch.arange(100, 112)
    rq, rk = rope(q, k, positions=pos)
    assert torch.equal(rq, pe.apply_rope(q, pos[-3:]))
    assert torch.equal(rk, pe.apply_rope(k, pos))


def test_rotary_embedding_inv_freq_and_attention_factor():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 20, 32, generator=g, dtype=torch.float64), torch.randn(1, 1, 20, 32, generator=g, dtype=torch.float64)
    inv = pe.rope_frequencies_yarn(32, BASE, 8, 16)
    factor = pe.yarn_attention_factor(8)
    rope = pe.RotaryEmbedding(32, inv_freq=inv, attention_factor=factor)
    rq, rk = rope(q, k)
    plain_q, plain_k = pe.apply_rope(q, inv_freq=inv), pe.apply_rope(k, inv_freq=inv)
    assert torch.allclose(rq, factor * plain_q, atol=1e-12)
    # logits scale by the factor squared
    assert torch.allclose(rq @ rk.transpose(-1, -2), factor ** 2 * plain_q @ plain_k.transpose(-1, -2), atol=1e-10)


def test_rotary_embedding_cache_is_per_device_and_dtype():
    rope = pe.RotaryEmbedding(8)
    c32, _ = rope.cos_sin(10, dtype=torch.float32)
    c64, _ = rope.cos_sin(10, dtype=torch.float64)
    assert c32.dtype == torch.float32 and c64.dtype == torch.float64
    assert len(rope._cache) == 2
    rope.half()  # must not round the float64 frequencies
    assert rope.inv_freq.dtype == torch.float64


@pytest.mark.parametrize("args,kwargs", [((7,), {}), ((8,), dict(inv_freq=torch.ones(3))),
                                         ((8,), dict(attention_factor=0.0))])
def test_rotary_embedding_bad_construction(args, kwargs):
    with pytest.raises(ValueError):
        pe.RotaryEmbedding(*args, **kwargs)


def test_rotary_embedding_bad_inputs():
    rope = pe.RotaryEmbedding(8)
    with pytest.raises(ValueError):
        rope(torch.randn(1, 1, 4, 6), torch.randn(1, 1, 4, 6))
    with pytest.raises(ValueError):
        rope(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 4, 8))
    with pytest.raises(ValueError):
        rope(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), positions=torch.arange(5))


def test_rotate_stacked_equals_forward():
    """Rotating q and k stacked in one pass equals rotating them one by one (RoPE and xPos)."""
    g = torch.Generator().manual_seed(3)
    qk = torch.randn(2, 2, 3, 40, 16, generator=g)
    for module in (pe.RotaryEmbedding(16), pe.XPos(16, scale_base=32)):
        stacked = module.rotate_stacked(qk)
        q, k = module(qk[0], qk[1])
        assert torch.allclose(stacked[0], q, atol=1e-6) and torch.allclose(stacked[1], k, atol=1e-6)
        with pytest.raises(ValueError, match="qk must be"):
            module.rotate_stacked(qk[:1])


def _turned(x, interleaved):
    """The direct form's "90-degree turn" of each channel pair, (a, b) -> (-b, a): the reference."""
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)  # rotate_half


@pytest.mark.parametrize("interleaved", [False, True])
def test_fused_rotation_equals_the_reference_form_with_gradients(interleaved):
    # posenc's rotation adds the sine terms in place; it must equal x cos + turn(x) sin, gradients of
    # x and of trainable tables included.
    from posenc.rotary import _rotate

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    cos, sin = pe.rope_cos_sin(torch.arange(7), 8, interleaved=interleaved, dtype=torch.float64)
    cos, sin = cos.requires_grad_(), sin.requires_grad_()
    fused = _rotate(x, cos, sin, interleaved)
    reference = x * cos + _turned(x, interleaved) * sin
    assert fused.shape == reference.shape == x.shape
    assert torch.allclose(fused, reference, atol=1e-14)
    dy = torch.randn(fused.shape, dtype=torch.float64, generator=g)
    grads = torch.autograd.grad(fused, (x, cos, sin), dy)
    expected = torch.autograd.grad(reference, (x, cos, sin), dy)
    for got, want in zip(grads, expected):
        assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_with_fixed_and_broadcast_tables(interleaved):
    # Values and gradient against the reference form and finite differences, also with tables broadcast
    # over a batch of position rows: (2, 1, seq, dim) against x (1, heads, seq, dim), gradient summed back.
    from posenc.rotary import _rotate

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    for positions in (torch.arange(5), torch.arange(10).view(2, 1, 5)):
        cos, sin = pe.rope_cos_sin(positions, 6, interleaved=interleaved, dtype=torch.float64)
        assert torch.autograd.gradcheck(lambda t: _rotate(t, cos, sin, interleaved), (x,))
        inputs = x[:1] if positions.ndim == 3 else x
        fused, reference = _rotate(inputs, cos, sin, interleaved), inputs * cos + _turned(inputs, interleaved) * sin
        assert fused.shape == reference.shape == torch.broadcast_shapes(inputs.shape, cos.shape)
        assert torch.allclose(fused, reference, atol=1e-14)
        dy = torch.randn(fused.shape, dtype=torch.float64, generator=g)
        got, = torch.autograd.grad(fused, x, dy)
        want, = torch.autograd.grad(reference, x, dy)
        assert torch.allclose(got, want, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(lead=st.lists(st.integers(1, 3), min_size=0, max_size=3), seq=st.integers(1, 9), half=st.integers(1, 5),
       interleaved=st.booleans(), per_row=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_rotation_backward_is_the_transposed_rotation(lead, seq, half, interleaved, per_row, seed):
    # With fixed tables the rotation's backward is its own transpose (posenc.rotary._Rotation), not autograd
    # through the in-place form: the gradient must equal the reference form's, over shapes, layouts and tables
    # with a row of positions per leading index; its inverse undoes it (R^T R = I); and double backward works.
    from posenc.rotary import _rotate

    g = torch.Generator().manual_seed(seed)
    dim = 2 * half
    x = torch.randn(*lead, seq, dim, dtype=torch.float64, generator=g, requires_grad=True)
    rows = (*lead[:1], *([1] * (len(lead) - 1))) if per_row and lead else ()
    positions = torch.rand(*rows, seq, dtype=torch.float64, generator=g).mul(50).cumsum(-1)
    cos, sin = pe.rope_cos_sin(positions, dim, interleaved=interleaved, dtype=torch.float64)
    fast = _rotate(x, cos, sin, interleaved)
    assert type(fast.grad_fn).__name__ == "_RotationBackward"
    reference = x * cos + _turned(x, interleaved) * sin
    assert torch.allclose(fast, reference, atol=1e-13)
    dy = torch.randn(fast.shape, dtype=torch.float64, generator=g, requires_grad=True)
    got, = torch.autograd.grad(fast, x, dy, create_graph=True)
    want, = torch.autograd.grad(reference, x, dy, create_graph=True)
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(_rotate(fast.detach(), cos, -sin, interleaved), x.detach(), atol=1e-12)   # R(-m) R(m) = I
    second, = torch.autograd.grad(got.square().sum(), dy)            # the backward is differentiable too
    assert torch.allclose(second, torch.autograd.grad(want.square().sum(), dy)[0], atol=1e-10)
    with torch.no_grad():                                             # no graph: the plain in-place form
        assert _rotate(x, cos, sin, interleaved).grad_fn is None


# --- RotaryEmbedding / RoPE scheme: cache safety, inference mode, input rules ---------------------


def test_cos_sin_copies_cannot_corrupt_the_cache():
    rope = pe.RotaryEmbedding(8)
    q, k = torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    before = rope(q, k)
    cos, sin = rope.cos_sin(6)
    cos.fill_(7.0)
    sin.zero_()
    for got, want in zip(rope(q, k), before):
        assert torch.equal(got, want)
    assert torch.equal(rope.rotate_stacked(torch.stack((q, k)))[0], before[0])
    assert torch.equal(rope.cos_sin(6)[0], pe.rope_cos_sin(torch.arange(6), 8)[0])


@pytest.mark.parametrize("make", ["module", "scheme"])
def test_cache_filled_under_inference_mode_still_trains(make):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    if make == "module":
        rope = pe.RotaryEmbedding(8)
        rotate = lambda a, b: rope(a, b)  # noqa: E731
    else:
        rope = pe.RoPE()
        rope.bind(d_model=16, n_heads=2, n_layers=1)
        rotate = lambda a, b: tuple(rope.rotate(torch.stack((a, b))))  # noqa: E731
    with torch.inference_mode():
        served = rotate(q, k)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    rq, rk = rotate(qg, kg)
    (rq * rk).sum().backward()
    assert torch.equal(rq.detach(), served[0])
    # the gradient of sum(R q * R k) w.r.t. q is R^T R k = k for the same rotation at each position
    assert torch.allclose(qg.grad, k, atol=1e-5) and torch.allclose(kg.grad, q, atol=1e-5)


def test_module_built_under_inference_mode_trains():
    with torch.inference_mode():
        rope = pe.RotaryEmbedding(8, inv_freq=pe.rope_frequencies_ntk(8, 10000, 2))
        rope(torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    q = torch.randn(1, 3, 8, requires_grad=True)
    rope(q, q)[0].sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_rotary_embedding_batch_positions_equal_heads():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 8, generator=g, dtype=torch.float64), torch.randn(2, 2, 5, 8, generator=g,
                                                                                   dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4], [50, 60, 70, 80, 90]])
    rq, rk = pe.RotaryEmbedding(8)(q, k, positions=pos)
    for b in range(2):
        for h in range(2):
            assert torch.allclose(rq[b, h], pe.apply_rope(q[b, h], pos[b, 2:]), atol=1e-12)
            assert torch.allclose(rk[b, h], pe.apply_rope(k[b, h], pos[b]), atol=1e-12)
    with pytest.raises(ValueError, match="do not fit"):
        pe.RotaryEmbedding(8)(q, k, positions=torch.zeros(3, 5))


def test_rotary_embedding_empty_and_meta():
    rope = pe.RotaryEmbedding(8)
    rq, rk = rope(torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8))
    assert rq.shape == rk.shape == (1, 2, 0, 8)
    k = torch.randn(1, 2, 4, 8)
    rq, rk = rope(torch.randn(1, 2, 0, 8), k)  # no queries, four keys
    assert rq.shape == (1, 2, 0, 8) and torch.equal(rk, pe.apply_rope(k))
    assert rope.cos_sin(0)[0].shape == (0, 8)
    assert rope.rotate_stacked(torch.randn(2, 1, 1, 0, 8)).shape == (2, 1, 1, 0, 8)
    m = torch.empty(2, 2, 5, 8, device="meta")
    assert all(t.shape == m.shape and t.device.type == "meta" for t in rope(m, m))


@pytest.mark.parametrize("kwargs,match", [
    (dict(dim=8, attention_factor=float("inf")), "attention_factor"),
    (dict(dim=8, attention_factor=float("nan")), "attention_factor"),
    (dict(dim=8, inv_freq=torch.tensor([1.0, 2.0, float("nan"), 1.0])), "inv_freq"),
    (dict(dim=8, base=float("inf")), "base"),
    (dict(dim=8.0), "even"),
])
def test_rotary_embedding_validates_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pe.RotaryEmbedding(**kwargs)


def test_rotary_embedding_bad_calls_say_what_was_expected():
    rope = pe.RotaryEmbedding(8)
    with pytest.raises(ValueError, match="seq_len must be an integer"):
        rope.cos_sin(2.5)
    with pytest.raises(ValueError, match="dtype"):
        rope.cos_sin(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="floating-point"):
        rope(torch.ones(1, 4, 8, dtype=torch.long), torch.ones(1, 4, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="floating-point"):
        rope.rotate_stacked(torch.ones(2, 1, 4, 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="positions must be finite"):
        rope(torch.randn(1, 4, 8), torch.randn(1, 4, 8), positions=torch.tensor([0, 1, 2, float("nan")]))
    with pytest.raises(ValueError, match="not bound"):
        pe.RoPE().rotate(torch.randn(2, 1, 1, 4, 8))


def test_context_extension_rejects_non_finite_arguments():
    for kwargs in (dict(beta_fast=float("inf")), dict(beta_slow=float("nan"))):
        with pytest.raises(ValueError, match="beta"):
            pe.rope_frequencies_yarn(DIM, BASE, 4, 4096, **kwargs)
    for base in (float("nan"), float("inf"), 1.0):
        for fn in (pe.rope_frequencies_interpolated, pe.rope_frequencies_ntk):
            with pytest.raises(ValueError, match="base"):
                fn(DIM, base, 2)
        with pytest.raises(ValueError, match="base"):
            pe.rope_frequencies_yarn(DIM, base, 2, 4096)
    for bad in (torch.tensor([0.0, float("nan")]), torch.tensor([True])):
        with pytest.raises(ValueError, match="distances"):
            pe.rope_decay_bound(bad, 8)
