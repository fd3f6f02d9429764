import pytest
import torch

import posenc as pe

CONVENTIONS = [False, True]  # half-split, interleaved


def test_frequencies_published_formula():
    d, base = 64, 10000.0
    theta = pe.rope_frequencies(d, base)
    assert theta.shape == (32,)
    assert theta.dtype == torch.float64
    expected = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert torch.allclose(theta, expected, rtol=1e-14)
    assert theta[0] == 1.0  # negative exponent: the first pair turns fastest


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_norm_preserved(interleaved):
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    y = pe.apply_rope(x, interleaved=interleaved)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12)


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_scores_depend_only_on_offset(interleaved):
    d = 32
    q = torch.randn(d, dtype=torch.float64)
    k = torch.randn(d, dtype=torch.float64)
    positions = torch.tensor([0.0, 3.0, 17.0, 100.0, 1000.0, 12345.0])
    rq = pe.apply_rope(q.expand(6, d), positions, interleaved=interleaved)
    rk = pe.apply_rope(k.expand(6, d), positions, interleaved=interleaved)
    scores = rq @ rk.T  # [a, b] = <R_{m_a} q, R_{m_b} k>
    for shift in (1.0, 250.0, 99999.0):
        sq = pe.apply_rope(q.expand(6, d), positions + shift, interleaved=interleaved)
        sk = pe.apply_rope(k.expand(6, d), positions + shift, interleaved=interleaved)
        assert torch.allclose(sq @ sk.T, scores, atol=1e-8)
    # and equals <q, R_{n-m} k>
    for a in range(6):
        for b in range(6):
            rel = pe.apply_rope(k[None], (positions[b] - positions[a])[None], interleaved=interleaved)
            assert torch.allclose(q @ rel[0], scores[a, b], atol=1e-8)


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_elementwise_equals_block_diagonal_matrix(interleaved):
    d = 12
    x = torch.randn(5, d, dtype=torch.float64)
    for m in (0, 1, 7, 1000):
        r = pe.rope_rotation_matrix(m, d, interleaved=interleaved)
        assert torch.allclose(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-12)
        got = pe.apply_rope(x, torch.full((5,), float(m)), interleaved=interleaved)
        assert torch.allclose(got, x @ r.T, atol=1e-12)


def test_interleaved_matrix_is_block_diagonal_2x2():
    r = pe.rope_rotation_matrix(3, 8, interleaved=True)
    block = torch.block_diag(*[r[2 * i:2 * i + 2, 2 * i:2 * i + 2] for i in range(4)])
    assert torch.equal(r, block)


def test_position_zero_is_identity_and_composition():
    x = torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(pe.apply_rope(x, torch.zeros(4)), x)
    twice = pe.apply_rope(pe.apply_rope(x, torch.full((4,), 3.0)), torch.full((4,), 4.0))
    assert torch.allclose(twice, pe.apply_rope(x, torch.full((4,), 7.0)), atol=1e-12)


def test_conventions_agree_after_channel_permutation():
    d = 16
    q, k = torch.randn(2, 10, d, dtype=torch.float64)
    inter = pe.apply_rope(q, interleaved=True) @ pe.apply_rope(k, interleaved=True).T
    q_h, k_h = pe.interleaved_to_half_split(q), pe.interleaved_to_half_split(k)
    half = pe.apply_rope(q_h, interleaved=False) @ pe.apply_rope(k_h, interleaved=False).T
    assert torch.allclose(inter, half, atol=1e-10)
    assert torch.equal(pe.half_split_to_interleaved(q_h), q)


def test_mixed_conventions_break_relative_property():
    # half-split cos/sin layout with the interleaved rotation: a known source of bugs
    d = 16
    q, k = torch.randn(2, d, dtype=torch.float64)

    def wrong(x, m):
        cos, sin = pe.rope_cos_sin(torch.tensor([float(m)]), d, interleaved=False, dtype=torch.float64)
        even, odd = x[0::2], x[1::2]
        rotated = torch.stack((-odd, even), -1).flatten()
        return x * cos[0] + rotated * sin[0]

    s1 = wrong(q, 5) @ wrong(k, 2)
    s2 = wrong(q, 105) @ wrong(k, 102)
    assert not torch.allclose(s1, s2, atol=1e-3)


def test_precision_at_a_million_positions():
    x = torch.randn(1, 8, 64)
    pos = torch.tensor([1_000_000.0, 999_999.0] + [0.0] * 6)
    y = pe.apply_rope(x, pos)
    ref = pe.apply_rope(x.double(), pos.double())
    assert torch.allclose(y.double(), ref, atol=1e-5)
    # the same angles multiplied out in float32 would be off by hundredths of a radian
    theta = pe.rope_frequencies(64)
    naive = torch.cos(torch.tensor(999_999.0) * theta.float()).double()
    exact = torch.cos(999_999.0 * theta)
    assert (naive - exact).abs().max() > 1e-3
    assert y.dtype == torch.float32


def test_shapes_and_dtype_preserved():
    x = torch.randn(2, 4, 7, 8, dtype=torch.bfloat16)
    y = pe.apply_rope(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16


def test_broadcast_positions_per_batch():
    x = torch.randn(2, 1, 5, 8, dtype=torch.float64)
    pos = torch.stack([torch.arange(5), torch.arange(5) + 10]).double()[:, None, :]  # (2, 1, 5)
    y = pe.apply_rope(x, pos)
    assert torch.allclose(y[1], pe.apply_rope(x[1], torch.arange(10, 15).double()))


@pytest.mark.parametrize("dim", [1, 7, 15])
def test_odd_dim_raises(dim):
    with pytest.raises(ValueError, match="even"):
        pe.apply_rope(torch.randn(3, dim))


def test_bad_positions_and_base():
    with pytest.raises(ValueError, match="sequence length"):
        pe.apply_rope(torch.randn(3, 8), torch.arange(4))
    with pytest.raises(ValueError, match="base"):
        pe.rope_frequencies(8, base=0.5)
