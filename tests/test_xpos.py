"""Tests for posenc.xpos: xPos (Sun et al., 2023) and blockwise causal attention."""

import math

import pytest
import torch

from posenc import masks, rope
from posenc import xpos as xp


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


# --------------------------------------------------------------------------- zeta


def test_zeta_matches_paper_constants():
    d = 64
    zeta = xp.xpos_zeta(d)
    assert zeta.dtype == torch.float64 and zeta.shape == (d // 2,)
    # torchscale: (arange(0, d, 2) + 0.4 d) / (1.4 d)
    expected = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    assert torch.allclose(zeta, expected, rtol=0, atol=1e-15)
    assert zeta[0].item() == pytest.approx(0.4 / 1.4)
    assert zeta[-1].item() == pytest.approx((1 - 2 / d + 0.4) / 1.4)
    assert bool((zeta > 0).all() and (zeta < 1).all() and (zeta.diff() > 0).all())


@pytest.mark.parametrize("gamma", [0, -0.1, float("inf"), float("nan"), True, "0.4"])
def test_zeta_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError):
        xp.xpos_zeta(8, gamma)


@pytest.mark.parametrize("dim", [0, 1, 7, 2.0, True])
def test_zeta_rejects_bad_dim(dim):
    with pytest.raises(ValueError):
        xp.xpos_zeta(dim)


# --------------------------------------------------------------------------- scales


@pytest.mark.parametrize("interleaved", [False, True])
def test_scales_layout_and_values(interleaved):
    d, base_scale = 8, 512
    pos = torch.arange(10)
    s = xp.xpos_scales(pos, d, scale_base=base_scale, centered=False, interleaved=interleaved)
    assert s.shape == (10, d) and s.dtype == torch.float64
    zeta = xp.xpos_zeta(d)
    pair = zeta[None, :] ** (pos[:, None].double() / base_scale)  # (10, d/2)
    if interleaved:
        assert torch.allclose(s[:, 0::2], pair) and torch.allclose(s[:, 1::2], pair)
    else:
        assert torch.allclose(s[:, : d // 2], pair) and torch.allclose(s[:, d // 2 :], pair)
    assert torch.equal(s[0], torch.ones(d, dtype=torch.float64))  # zeta ** 0


def test_centering_halves_the_largest_exponent():
    d, L = 16, 4097
    pos = torch.arange(L)
    plain = xp.xpos_scales(pos, d, centered=False)
    cent = xp.xpos_scales(pos, d, centered=True)
    # log of the largest factor: |exponent| * |log zeta_0|; halved by centring
    assert (-cent.log()).abs().max().item() == pytest.approx((-plain.log()).abs().max().item() / 2)
    # the midpoint gets factor 1
    assert torch.allclose(cent[L // 2], torch.ones(d, dtype=torch.float64))
    # an explicit centre overrides
    assert torch.allclose(xp.xpos_scales(pos, d, center=0.0), plain)


def test_infinite_scale_base_is_no_scaling():
    s = xp.xpos_scales(torch.arange(100), 8, scale_base=math.inf)
    assert torch.equal(s, torch.ones_like(s))


@pytest.mark.parametrize("scale_base", [0, -512, float("nan"), None])
def test_scales_reject_bad_scale_base(scale_base):
    with pytest.raises(ValueError):
        xp.xpos_scales(torch.arange(4), 8, scale_base=scale_base)


# --------------------------------------------------------------------------- apply_xpos


@pytest.mark.parametrize("interleaved", [False, True])
def test_relative_property(interleaved):
    """Same content at every position: the score matrix is Toeplitz (depends on m - n only)."""
    torch.manual_seed(0)
    L, d = 300, 32
    x = torch.randn(d, dtype=torch.float64)
    tokens = x.expand(1, 2, L, d)
    q, k = xp.apply_xpos(tokens, tokens, interleaved=interleaved, scale_base=64)
    s = _scores(q, k)[0, 0]
    assert torch.allclose(s[1:, 1:], s[:-1, :-1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("interleaved", [False, True])
def test_score_is_rope_pair_scores_times_zeta(interleaved):
    """q'_m . k'_n = sum_i zeta_i^((m-n)/B) * (pair-i part of the RoPE score)."""
    torch.manual_seed(1)
    L, d, B = 50, 16, 20.0
    q = torch.randn(2, 3, L, d, dtype=torch.float64)
    k = torch.randn(2, 3, L, d, dtype=torch.float64)
    qx, kx = xp.apply_xpos(q, k, scale_base=B, interleaved=interleaved)
    qr, kr = rope.apply_rope(q, interleaved=interleaved), rope.apply_rope(k, interleaved=interleaved)
    prod = qr[..., :, None, :] * kr[..., None, :, :]  # (b, h, m, n, d)
    if interleaved:
        pair = prod[..., 0::2] + prod[..., 1::2]
    else:
        pair = prod[..., : d // 2] + prod[..., d // 2 :]  # (b, h, m, n, d/2)
    delta = torch.arange(L, dtype=torch.float64)
    delta = delta[:, None] - delta[None, :]  # m - n
    factor = xp.xpos_zeta(d) ** (delta[..., None] / B)  # (m, n, d/2)
    expected = (pair * factor).sum(-1)
    assert torch.allclose(_scores(qx, kx), expected, rtol=1e-10, atol=1e-10)


def test_identical_q_k_closed_form():
    """For q = k = x: score(delta) = sum_i |x_pair_i|^2 cos(delta theta_i) zeta_i^(delta/B)."""
    torch.manual_seed(2)
    L, d = 600, 32
    x = torch.randn(d, dtype=torch.float64)
    tokens = x.expand(1, 1, L, d)
    qx, kx = xp.apply_xpos(tokens, tokens)  # half-split layout
    last = _scores(qx, kx)[0, 0, -1]  # query at L-1 against keys 0..L-1
    delta = (L - 1 - torch.arange(L)).double()
    norms = x[: d // 2] ** 2 + x[d // 2 :] ** 2
    theta, zeta = rope.rope_frequencies(d), xp.xpos_zeta(d)
    expected = (norms * torch.cos(delta[:, None] * theta) * zeta ** (delta[:, None] / 512)).sum(-1)
    assert torch.allclose(last, expected, rtol=1e-10, atol=1e-10)
    # and it is the RoPE score times factors < 1 pair by pair: smaller envelope far away
    assert last[0].abs() < norms.sum() * xp.xpos_zeta(d)[-1] ** ((L - 1) / 512)


def test_infinite_scale_base_is_rope():
    torch.manual_seed(3)
    q, k = torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
    for interleaved in (False, True):
        qx, kx = xp.apply_xpos(q, k, scale_base=math.inf, interleaved=interleaved)
        assert torch.allclose(qx, rope.apply_rope(q, interleaved=interleaved), atol=1e-6)
        assert torch.allclose(kx, rope.apply_rope(k, interleaved=interleaved), atol=1e-6)


def test_matches_torchscale_style_reference():
    """An independent re-derivation of the authors' recipe: interleaved pairs,
    theta_i = 10000^(-2i/d), scale = zeta^((p - ceil(L/2)) / B), keys downscaled.
    Centres differ (ours is the midpoint), but the shift cancels in the scores."""
    torch.manual_seed(4)
    L, d, B = 37, 12, 512
    q = torch.randn(L, d, dtype=torch.float64)
    k = torch.randn(L, d, dtype=torch.float64)
    pos = torch.arange(L, dtype=torch.float64)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos[:, None] * inv).repeat_interleave(2, -1)
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
    scale = (zeta ** ((pos - math.ceil(L / 2))[:, None] / B)).repeat_interleave(2, -1)

    def rot(x):
        return torch.stack((-x[:, 1::2], x[:, 0::2]), -1).flatten(-2)

    q_ref = (q * ang.cos() + rot(q) * ang.sin()) * scale
    k_ref = (k * ang.cos() + rot(k) * ang.sin()) / scale
    qx, kx = xp.apply_xpos(q, k, interleaved=True, scale_base=B)
    assert torch.allclose(_scores(qx, kx), _scores(q_ref, k_ref), rtol=1e-10, atol=1e-12)


def test_decays_causally_and_explodes_anticausally():
    torch.manual_seed(5)
    L, d = 4097, 64
    x = torch.randn(d, dtype=torch.float64)
    tokens = x.expand(1, 1, L, d)
    qx, kx = xp.apply_xpos(tokens, tokens)
    first = _scores(qx[..., :1, :], kx)[0, 0, 0]  # query 0 against keys 0 .. L-1 (the future)
    last = _scores(qx[..., -1:, :], kx)[0, 0, 0]  # query L-1 against keys 0 .. L-1 (the past)
    norms = x[: d // 2] ** 2 + x[d // 2 :] ** 2
    zeta = xp.xpos_zeta(d)
    # past: bounded by |cos| <= 1 and zeta_i^(4096/512)
    assert last[0].abs() <= (norms * zeta ** 8).sum()
    # future: the same formula with a negative offset; the factors exceed 1
    delta = -torch.arange(L, dtype=torch.float64)
    theta = rope.rope_frequencies(d)
    expected = (norms * torch.cos(delta[:, None] * theta) * zeta ** (delta[:, None] / 512)).sum(-1)
    assert torch.allclose(first, expected, rtol=1e-10)
    # far future keys outscore the token itself by orders of magnitude
    assert first[1:].abs().max() > 100 * first[0]


def test_queries_are_the_last_key_positions():
    torch.manual_seed(6)
    q, k = torch.randn(1, 2, 50, 16), torch.randn(1, 2, 50, 16)
    qx_full, kx_full = xp.apply_xpos(q, k)
    qx_last, kx_last = xp.apply_xpos(q[..., -5:, :], k)
    assert torch.allclose(qx_last, qx_full[..., -5:, :]) and torch.allclose(kx_last, kx_full)


def test_dtype_and_shape_preserved():
    q = torch.randn(2, 3, 10, 8, dtype=torch.float16)
    k = torch.randn(2, 3, 10, 8, dtype=torch.float16)
    qx, kx = xp.apply_xpos(q, k)
    assert qx.dtype == kx.dtype == torch.float16
    assert qx.shape == q.shape and kx.shape == k.shape


def test_no_overflow_at_64k_in_float32_when_centred():
    torch.manual_seed(7)
    L, d = 65536, 64
    q, k = torch.randn(1, 1, L, d), torch.randn(1, 1, L, d)
    qx, kx = xp.apply_xpos(q, k)
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()
    # causal scores of the last queries stay finite too
    s = _scores(qx[..., -64:, :], kx)
    allowed = masks.causal_mask(64, L)
    assert torch.isfinite(s[..., allowed]).all()
    # uncentred, zeta_0^(-65535/512) ~ 1e69 does not fit in float32 (max 3.4e38)
    _, kx_plain = xp.apply_xpos(q, k, centered=False)
    assert torch.isinf(kx_plain).any()


def test_uncentred_float16_overflows_within_a_few_thousand_tokens():
    # fp16 max 65504: zeta_0^(-n/512) = 3.5^(n/512) passes it at n = 512 ln(65504) / ln(3.5)
    fp16_max = torch.finfo(torch.float16).max
    limit = 512 * math.log(fp16_max) / math.log(1.4 / 0.4)
    assert 4500 < limit < 4600
    key_factor = 1 / xp.xpos_scales(torch.arange(20000), 64, centered=False)
    first = (key_factor > fp16_max).any(-1).nonzero()[0].item()
    assert first == math.floor(limit) + 1
    # centred, a 9000-token sequence keeps every factor below the fp16 maximum
    cent = xp.xpos_scales(torch.arange(9000), 64)
    assert (cent < fp16_max).all() and (1 / cent < fp16_max).all()

    torch.manual_seed(8)
    L, d = 6144, 64
    q = torch.randn(1, 1, L, d, dtype=torch.float16)
    k = torch.randn(1, 1, L, d, dtype=torch.float16)
    _, kx_plain = xp.apply_xpos(q, k, centered=False)
    first_inf = torch.isinf(kx_plain[0, 0]).any(-1).nonzero()[0].item()
    assert limit - 1024 <= first_inf <= limit + 1024  # |rotated k| of order 1 shifts it a little
    qx, kx = xp.apply_xpos(q, k)  # centred: factors <= 3.5^6 ~ 1838
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()


def test_shift_cancels_in_scores():
    torch.manual_seed(9)
    q, k = torch.randn(1, 1, 30, 8, dtype=torch.float64), torch.randn(1, 1, 30, 8, dtype=torch.float64)
    a = _scores(*xp.apply_xpos(q, k, centered=True))
    b = _scores(*xp.apply_xpos(q, k, centered=False))
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_apply_xpos_rejects_bad_input():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError):
        xp.apply_xpos(torch.randn(1, 1, 4, 7), torch.randn(1, 1, 4, 7))  # odd dim
    with pytest.raises(ValueError):
        xp.apply_xpos(q, torch.randn(1, 1, 4, 6))  # head_dim mismatch
    with pytest.raises(ValueError):
        xp.apply_xpos(torch.randn(1, 1, 5, 8), q)  # q_len > k_len
    with pytest.raises(ValueError):
        xp.apply_xpos(q, q, torch.arange(3))  # positions length
    with pytest.raises(ValueError):
        xp.apply_xpos(q, q, gamma=0.0)
    with pytest.raises(ValueError):
        xp.apply_xpos(q, q, scale_base=-1)
    with pytest.raises(ValueError):
        xp.apply_xpos(torch.randn(8), torch.randn(8))


# --------------------------------------------------------------------------- module


def test_module_matches_function_and_caches():
    torch.manual_seed(10)
    mod = xp.XPos(16, scale_base=128, interleaved=True)
    q, k = torch.randn(2, 2, 20, 16), torch.randn(2, 2, 30, 16)
    qx, kx = mod(q, k)
    qf, kf = xp.apply_xpos(q, k, scale_base=128, interleaved=True)
    # the module folds the scales into its tables: float32 rounding, not bit equality
    assert torch.allclose(qx, qf, rtol=1e-6, atol=1e-7) and torch.allclose(kx, kf, rtol=1e-6, atol=1e-7)
    assert mod._tables(30, torch.device("cpu")) is mod._tables(30, torch.device("cpu"))  # cached
    # the public accessor hands out copies, equal to the cache (writing into them cannot corrupt it)
    copies = mod.tables(30)
    assert all(torch.equal(a, b) and a is not b for a, b in zip(copies, mod._tables(30, torch.device("cpu"))))
    pos = torch.arange(30) + 7
    assert torch.allclose(mod(q, k, pos)[0], xp.apply_xpos(q, k, pos, scale_base=128,
                                                           interleaved=True)[0])
    with pytest.raises(ValueError):
        xp.XPos(15)
    with pytest.raises(ValueError):
        mod(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))


# --------------------------------------------------------------------------- BCA


def test_blockwise_causal_mask_values():
    m = xp.blockwise_causal_mask(6, block=2)
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert m.dtype == torch.bool and torch.equal(m, expected)


@pytest.mark.parametrize("block", [1, 3, 8, 64])
def test_blockwise_causal_mask_properties(block):
    L = 50
    m = xp.blockwise_causal_mask(L, block=block)
    assert m.shape == (L, L)
    assert not (m & ~masks.causal_mask(L)).any()  # never looks ahead
    assert m.diagonal().all()  # always sees itself
    i, j = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    assert torch.equal(m, (j <= i) & (j // block >= i // block - 1))
    seen = m.sum(-1)
    full = torch.arange(L) >= block  # past the first block
    assert bool((seen[full] >= block + 1).all() and (seen[full] <= 2 * block).all())
    if block >= L:
        assert torch.equal(m, masks.causal_mask(L))


def test_blockwise_causal_mask_bottom_right():
    full = xp.blockwise_causal_mask(20, block=4)
    assert torch.equal(xp.blockwise_causal_mask(5, 20, block=4), full[-5:])


@pytest.mark.parametrize("block", [0, -1, 2.0, True])
def test_blockwise_causal_mask_rejects_bad_block(block):
    with pytest.raises(ValueError):
        xp.blockwise_causal_mask(8, block=block)


def test_blockwise_causal_mask_rejects_bad_lengths():
    with pytest.raises(ValueError):
        xp.blockwise_causal_mask(8, 4, block=2)


@pytest.mark.parametrize("n", [64, 4096, 65536])
def test_module_fast_tables_match_apply_xpos(n):
    """The module folds the scales into the rotation tables when they are safe in float32, else works in
    float64; both agree with apply_xpos, and the attention logits stay finite."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, n, 32, generator=g) for _ in range(2))
    module = xp.XPos(32)
    qm, km = module(q, k)
    qr, kr = xp.apply_xpos(q, k)
    for fast, ref in ((qm, qr), (km, kr)):  # float32 rounding relative to each row's size
        assert ((fast - ref).abs() <= 1e-6 * ref.abs().amax(-1, keepdim=True)).all()
    fused = any(key[0] == "fused" for key in module._cache)
    assert fused == (n <= 4096)  # at 64k the scales leave float32's safe range
    logits = qm[0, 0, -4:] @ km[0, 0, -8:].T
    assert torch.isfinite(logits).all()


# --------------------------------------------------------------------------- dtype range, input rules


def _causal_scores_and_scale(qx, kx, rows):
    """Scores of the last ``rows`` queries against every key (float64), and sum |q_i k_i| as their scale."""
    q, k = qx[..., -rows:, :].double(), kx.double()
    return q @ k.transpose(-2, -1), q.abs() @ k.abs().transpose(-2, -1)


def test_float16_at_65536_positions_raises_instead_of_inf_scores():
    # centred factors reach 3.5^64 ~ 1e35 at 65,536 positions: no float16 vector can hold them, so the
    # scores used to come out inf/NaN where the exact ones are small. Now every entry point says so.
    q = torch.randn(1, 2, 65536, 8).half()
    with pytest.raises(ValueError, match="float16"):
        xp.apply_xpos(q, q)
    with pytest.raises(ValueError, match="float16"):
        xp.apply_xpos(q, q, torch.arange(65536) + 10)
    with pytest.raises(ValueError, match="float16"):
        xp.XPos(8)(q, q)
    scheme = xp.XPosRotation()
    scheme.bind(d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="scale_base"):  # the message names the ways out
        scheme.rotate(torch.stack((q, q)))
    # a larger scale_base brings the factors back into range
    qx, kx = xp.apply_xpos(q[..., -64:, :], q, scale_base=8192)
    assert torch.isfinite(qx).all() and torch.isfinite(kx).all()


@pytest.mark.parametrize("dtype,length,tol", [(torch.bfloat16, 65536, 2e-2), (torch.float16, 4096, 4e-3)])
def test_low_precision_scores_match_float64(dtype, length, tol):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, length, 8, generator=g).to(dtype) for _ in range(2))
    ref = _causal_scores_and_scale(*xp.apply_xpos(q.double(), k.double()), rows=4)
    for module in (False, True):
        qx, kx = xp.XPos(8)(q, k) if module else xp.apply_xpos(q, k)
        assert qx.dtype == kx.dtype == dtype and torch.isfinite(qx).all() and torch.isfinite(kx).all()
        got, _ = _causal_scores_and_scale(qx, kx, rows=4)
        causal = masks.causal_mask(4, length)
        err = (got - ref[0]).abs()[..., causal]
        assert (err <= tol * ref[1][..., causal] + 1e-30).all()


def test_tables_copies_cannot_corrupt_the_cache():
    mod = xp.XPos(8, scale_base=16)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    before = mod(q, k)
    for t in mod.tables(6):
        t.fill_(3.0)
    assert all(torch.equal(a, b) for a, b in zip(mod(q, k), before))


@pytest.mark.parametrize("make", ["module", "scheme"])
def test_cache_filled_under_inference_mode_still_trains(make):
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    if make == "module":
        mod = xp.XPos(8, scale_base=16)
        rotate = lambda a, b: mod(a, b)  # noqa: E731
    else:
        mod = xp.XPosRotation(scale_base=16.0)
        mod.bind(d_model=16, n_heads=2, n_layers=1)
        rotate = lambda a, b: tuple(mod.rotate(torch.stack((a, b))))  # noqa: E731
    with torch.inference_mode():
        served = rotate(q, k)
    qg = q.clone().requires_grad_()
    rq, rk = rotate(qg, k)
    (rq * rk).sum().backward()
    assert torch.allclose(rq.detach(), served[0]) and torch.isfinite(qg.grad).all()
    # per pair, R q s . R k / s = q . k: the gradient w.r.t. q is k
    assert torch.allclose(qg.grad, k, atol=1e-5)


def test_batch_positions_apply_to_every_head_when_batch_equals_heads():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 8, generator=g, dtype=torch.float64), torch.randn(2, 2, 6, 8, generator=g,
                                                                                   dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [40, 45, 50, 70, 90, 100]])
    for qx, kx in (xp.apply_xpos(q, k, pos, scale_base=32), xp.XPos(8, scale_base=32)(q, k, pos)):
        for b in range(2):
            for h in range(2):
                qr, kr = xp.apply_xpos(q[b, h], k[b, h], pos[b], scale_base=32)
                assert torch.allclose(qx[b, h], qr, atol=1e-12) and torch.allclose(kx[b, h], kr, atol=1e-12)
    for bad in (torch.zeros(3, 6), torch.zeros(2, 2, 2, 6), torch.zeros(2, 5)):
        with pytest.raises(ValueError, match="positions"):
            xp.apply_xpos(q, k, bad)


def test_empty_sequences_and_meta():
    for q_len, k_len in ((0, 0), (0, 3)):
        q, k = torch.randn(1, 2, q_len, 8), torch.randn(1, 2, k_len, 8)
        for qx, kx in (xp.apply_xpos(q, k), xp.XPos(8)(q, k)):
            assert qx.shape == q.shape and kx.shape == k.shape
        assert xp.XPos(8)(q, k)[1].shape == (1, 2, k_len, 8)
    assert xp.xpos_scales(torch.zeros(0), 8).shape == (0, 8)
    assert xp.XPos(8).tables(0)[2].shape == (0, 8)
    m = torch.empty(2, 2, 5, 8, device="meta")
    for qx, kx in (xp.apply_xpos(m, m), xp.XPos(8)(m, m), xp.apply_xpos(m, m, torch.arange(5))):
        assert qx.device.type == "meta" and qx.shape == kx.shape == m.shape


def test_kinds_of_input_and_non_finite_parameters():
    q = torch.randn(1, 4, 8, dtype=torch.float64)
    qx, kx = xp.apply_xpos(q.numpy(), q.numpy())
    assert torch.equal(qx, xp.apply_xpos(q, q)[0])
    for bad in (q.long(), q > 0):
        with pytest.raises(ValueError, match="floating-point"):
            xp.apply_xpos(bad, bad)
        with pytest.raises(ValueError, match="floating-point"):
            xp.XPos(8)(bad, bad)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        xp.apply_xpos(q.tolist(), q)
    for kwargs, match in ((dict(base=float("nan")), "base"), (dict(base=float("inf")), "base"),
                          (dict(gamma=float("inf")), "gamma"), (dict(scale_base=float("nan")), "scale_base"),
                          (dict(positions=torch.tensor([0.0, 1, 2, float("inf")])), "positions")):
        with pytest.raises(ValueError, match=match):
            xp.apply_xpos(q, q, **kwargs)
    with pytest.raises(ValueError, match="center"):
        xp.xpos_scales(torch.arange(4), 8, center=float("nan"))
    with pytest.raises(ValueError, match="single number"):
        xp.xpos_scales(torch.tensor(3.0), 8)
    with pytest.raises(ValueError, match="device"):
        xp.blockwise_causal_mask(4, block=2, device="nowhere")


@pytest.mark.parametrize("kwargs,match", [
    (dict(head_dim=8, base=float("inf")), "base"), (dict(head_dim=8, base=0.5), "base"),
    (dict(head_dim=8, gamma=float("nan")), "gamma"), (dict(head_dim=8, scale_base=-1), "scale_base"),
    (dict(head_dim=8.0), "even"),
])
def test_module_and_scheme_validate_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        xp.XPos(**kwargs)
    if "head_dim" in kwargs and len(kwargs) == 2:
        kwargs = {k: v for k, v in kwargs.items() if k != "head_dim"}
        with pytest.raises(ValueError, match=match):
            xp.XPosRotation(**kwargs)
    with pytest.raises(ValueError, match="not bound"):
        xp.XPosRotation().rotate(torch.randn(2, 1, 1, 4, 8))
