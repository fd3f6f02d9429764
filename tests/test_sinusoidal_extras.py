"""Tests for the chapter-2 helpers in posenc.sinusoidal.

Every check is an identity of the sinusoidal table (Vaswani et al., 2017,
Sec. 3.5) or of trigonometry, never a stored output of the code under test.
"""

import math

import pytest
import torch

import posenc as pe


# --- wavelengths -------------------------------------------------------------

@pytest.mark.parametrize("dim,base", [(2, 10000.0), (64, 10000.0), (128, 500.0), (512, 10000.0)])
def test_wavelengths_geometric_from_two_pi(dim, base):
    lam = pe.sinusoidal_wavelengths(dim, base)
    assert lam.shape == (dim // 2,)
    # the paper: "wavelengths form a geometric progression from 2 pi to 10000 * 2 pi"
    assert lam[0].item() == pytest.approx(2 * math.pi)
    assert lam[-1].item() == pytest.approx(2 * math.pi * base ** ((dim - 2) / dim))
    assert lam[-1].item() < 2 * math.pi * base
    if dim > 2:
        ratios = lam[1:] / lam[:-1]
        assert torch.allclose(ratios, torch.full_like(ratios, base ** (2 / dim)))


def test_wavelength_is_a_period_of_the_channel():
    dim, base = 16, 100.0
    lam = pe.sinusoidal_wavelengths(dim, base)
    m = torch.linspace(0, 50, 11, dtype=torch.float64)
    for i in range(dim // 2):
        p0 = pe.sinusoidal_embedding(m, dim, base, dtype=torch.float64)[..., 2 * i: 2 * i + 2]
        p1 = pe.sinusoidal_embedding(m + lam[i], dim, base, dtype=torch.float64)[..., 2 * i: 2 * i + 2]
        assert torch.allclose(p0, p1, atol=1e-9)


# --- shift matrix ------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, 7, -3, 2.5, 1000])
def test_shift_matrix_maps_p_m_to_p_m_plus_k(k):
    dim, base = 32, 10000.0
    m = torch.arange(-20, 200, dtype=torch.float64)
    rot = pe.sinusoidal_shift_matrix(k, dim, base)
    p_m = pe.sinusoidal_embedding(m, dim, base, dtype=torch.float64)
    p_mk = pe.sinusoidal_embedding(m + k, dim, base, dtype=torch.float64)
    assert torch.allclose(p_m @ rot.T, p_mk, atol=1e-10)


def test_shift_matrix_is_orthogonal_rotation_and_composes():
    dim = 24
    r3, r5 = pe.sinusoidal_shift_matrix(3, dim), pe.sinusoidal_shift_matrix(5, dim)
    eye = torch.eye(dim, dtype=torch.float64)
    assert torch.allclose(r3 @ r3.T, eye, atol=1e-12)
    assert torch.linalg.det(r3).item() == pytest.approx(1.0)
    assert torch.allclose(r3 @ r5, pe.sinusoidal_shift_matrix(8, dim), atol=1e-12)
    assert torch.allclose(pe.sinusoidal_shift_matrix(-3, dim), r3.T, atol=1e-12)
    assert torch.allclose(pe.sinusoidal_shift_matrix(0, dim), eye)


def test_shift_matrix_quadratic_form_is_similarity():
    # p_m . p_{m+k} = p_m^T R_k p_m = sum_i cos(k theta_i), for every m
    dim, k = 40, 11
    rot = pe.sinusoidal_shift_matrix(k, dim)
    p = pe.sinusoidal_embedding(100, dim, dtype=torch.float64)
    quad = torch.einsum("md,de,me->m", p, rot, p)
    assert torch.allclose(quad, pe.sinusoidal_similarity(torch.tensor([float(k)]), dim).expand(100))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "3", None])
def test_shift_matrix_rejects_bad_shift(bad):
    with pytest.raises(ValueError, match="shift"):
        pe.sinusoidal_shift_matrix(bad, 8)


def test_shift_matrix_rejects_odd_dim():
    with pytest.raises(ValueError, match="even"):
        pe.sinusoidal_shift_matrix(1, 7)


# --- coverage ----------------------------------------------------------------

def test_period_coverage_matches_definition():
    dim, base, L = 64, 10000.0, 512
    cov = pe.sinusoidal_period_coverage(L, dim, base)
    theta = pe.sinusoidal_frequencies(dim, base)
    assert cov.shape == (dim // 2,)
    assert ((cov >= 0) & (cov <= 1)).all()
    full = (L - 1) * theta >= 2 * math.pi
    assert torch.equal(cov == 1, full)
    # a pair covers a full turn iff some training position repeats its start:
    # for those pairs the positions 0..L-1 reach angle >= 2 pi
    assert torch.allclose(cov[~full], (L - 1) * theta[~full] / (2 * math.pi))
    # one training position covers nothing
    assert torch.equal(pe.sinusoidal_period_coverage(1, dim, base), torch.zeros(dim // 2, dtype=torch.float64))


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_period_coverage_rejects_bad_length(bad):
    with pytest.raises(ValueError, match="train_length"):
        pe.sinusoidal_period_coverage(bad, 8)


# --- nearest training encoding ----------------------------------------------

def test_nearest_distance_zero_inside_positive_outside():
    dim, L = 32, 50
    dist, idx = pe.sinusoidal_nearest_distance(4 * L, L, dim, return_index=True)
    assert dist.shape == (4 * L,)
    assert torch.allclose(dist[:L], torch.zeros(L, dtype=torch.float64), atol=1e-6)
    assert torch.equal(idx[:L], torch.arange(L))
    assert (dist[L:] > 1e-3).all()
    # the first unseen position is one step away from the last seen one
    step = (pe.sinusoidal_embedding(2, dim, dtype=torch.float64).diff(dim=0)).norm()
    assert dist[L].item() == pytest.approx(step.item())
    assert idx[L].item() == L - 1


def test_nearest_distance_equals_similarity_formula():
    # ||p_n - p_m||^2 = d - 2 p_n . p_m = d - 2 s(n - m)
    dim, base, L = 16, 1000.0, 30
    n = torch.arange(-40, 200)
    dist = pe.sinusoidal_nearest_distance(n, L, dim, base)
    offsets = (n[:, None] - torch.arange(L)[None, :]).double()
    sim = pe.sinusoidal_similarity(offsets, dim, base)
    expected = (dim - 2 * sim.max(dim=-1).values).clamp(min=0).sqrt()
    assert torch.allclose(dist, expected, atol=1e-6)


def test_nearest_distance_chunking_and_shapes():
    dim, L = 8, 10
    pos = torch.arange(60).reshape(3, 20)
    full = pe.sinusoidal_nearest_distance(pos, L, dim)
    small = pe.sinusoidal_nearest_distance(pos, L, dim, chunk=7)
    assert full.shape == (3, 20)
    assert torch.allclose(full, small)


def test_nearest_distance_rejects_bad_input():
    with pytest.raises(ValueError, match="train_length"):
        pe.sinusoidal_nearest_distance(10, 0, 8)
    with pytest.raises(ValueError, match="even"):
        pe.sinusoidal_nearest_distance(10, 5, 9)
    with pytest.raises(ValueError, match="chunk"):
        pe.sinusoidal_nearest_distance(10, 5, 8, chunk=0)


# --- nn.Module ---------------------------------------------------------------

def test_module_adds_the_table():
    dim = 12
    module = pe.SinusoidalPositionalEmbedding(dim, base=100.0)
    x = torch.randn(2, 3, 7, dim, generator=torch.Generator().manual_seed(0))
    out = module(x)
    table = pe.sinusoidal_embedding(7, dim, 100.0)
    assert out.shape == x.shape
    assert torch.allclose(out - x, table.expand_as(x), atol=1e-6)
    assert list(module.parameters()) == []


def test_module_positions_beyond_any_length_and_offset():
    dim = 8
    module = pe.SinusoidalPositionalEmbedding(dim, scale=0.5)
    x = torch.zeros(1, 4, dim, dtype=torch.float64)
    pos = torch.arange(100_000, 100_004)
    out = module(x, pos)
    assert out.dtype == torch.float64
    assert torch.allclose(out[0], 0.5 * pe.sinusoidal_embedding(pos, dim, dtype=torch.float64))


def test_module_rejects_bad_input():
    with pytest.raises(ValueError, match="even"):
        pe.SinusoidalPositionalEmbedding(5)
    with pytest.raises(ValueError, match="base"):
        pe.SinusoidalPositionalEmbedding(8, base=1.0)
    module = pe.SinusoidalPositionalEmbedding(8)
    with pytest.raises(ValueError, match="seq"):
        module(torch.zeros(2, 5, 6))
    with pytest.raises(ValueError, match="sequence length"):
        module(torch.zeros(2, 5, 8), torch.arange(4))


# --- the module and the schemes: input rules -------------------------------------------------------

def test_module_batch_positions_apply_to_every_head_when_batch_equals_heads():
    module = pe.SinusoidalPositionalEmbedding(8)
    x = torch.zeros(2, 2, 3, 8, dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2], [10, 20, 30]])
    out = module(x, pos)
    for b in range(2):
        for h in range(2):
            assert torch.allclose(out[b, h], pe.sinusoidal_embedding(pos[b], 8, dtype=torch.float64))
    for bad in (torch.zeros(3, 3), torch.zeros(1, 2, 2, 3), torch.zeros(2, 3, 3)):
        with pytest.raises(ValueError, match="positions"):
            module(x, bad)


def test_module_kinds_of_input():
    import numpy as np

    module = pe.SinusoidalPositionalEmbedding(8)
    x = np.zeros((2, 3, 8))
    assert torch.equal(module(x), module(torch.zeros(2, 3, 8, dtype=torch.float64)))
    for bad in (torch.zeros(2, 3, 8, dtype=torch.long), torch.zeros(2, 3, 8, dtype=torch.bool)):
        with pytest.raises(ValueError, match="floating-point"):
            module(bad)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        module([[0.0] * 8])
    with pytest.raises(ValueError, match="positions must be finite"):
        module(torch.zeros(1, 2, 8), torch.tensor([0.0, float("nan")]))
    assert module(torch.zeros(2, 0, 8)).shape == (2, 0, 8)
    meta = module(torch.empty(2, 3, 8, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (2, 3, 8)


@pytest.mark.parametrize("kwargs,match", [(dict(scale=float("nan")), "scale"), (dict(scale="1"), "scale"),
                                          (dict(scale=float("inf")), "scale"), (dict(base=float("inf")), "base")])
def test_module_validates_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pe.SinusoidalPositionalEmbedding(8, **kwargs)


@pytest.mark.parametrize("name,options", [("learned", dict(max_len=8)), ("sinusoidal", {})])
def test_schemes_check_their_input(name, options):
    scheme = pe.position_scheme(name, **options)
    with pytest.raises(ValueError, match="not bound"):
        scheme.embed(torch.zeros(1, 3, 8))
    scheme.bind(d_model=8, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match=r"\(batch, seq, 8\)"):
        scheme.embed(torch.zeros(1, 3, 6))
    with pytest.raises(ValueError, match="floating-point"):
        scheme.embed(torch.zeros(1, 3, 8, dtype=torch.long))
    empty = scheme.embed(torch.zeros(2, 0, 8))
    assert empty.shape == (2, 0, 8)
    out = scheme.embed(torch.zeros(2, 3, 8, dtype=torch.float64))
    assert out.shape == (2, 3, 8) and out.dtype == torch.float64
    if name == "sinusoidal":
        assert torch.allclose(out[0], pe.sinusoidal_embedding(3, 8, dtype=torch.float64), atol=1e-7)
    else:
        assert torch.equal(out[1], scheme.table[:3].double())
    with pytest.raises(ValueError, match="max_len"):
        pe.LearnedPositions(max_len=2.5)
