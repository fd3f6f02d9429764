import math

import pytest
import torch

import posenc as pe


def test_table_matches_vaswani_definition():
    n, d, base = 50, 16, 10000.0
    p = pe.sinusoidal_embedding(n, d, base, dtype=torch.float64)
    assert p.shape == (n, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / base ** (2 * i / d)
            assert p[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert p[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_frequencies_span_base():
    theta = pe.sinusoidal_frequencies(8, base=10000.0)
    assert theta[0] == 1.0
    assert theta[-1].item() == pytest.approx(10000.0 ** (-6 / 8))
    assert torch.all(theta[1:] < theta[:-1])


def test_dot_product_depends_only_on_offset():
    d = 32
    p = pe.sinusoidal_embedding(200, d, dtype=torch.float64)
    gram = p @ p.T
    sim = pe.sinusoidal_similarity(torch.arange(-199, 200), d)
    rel = pe.relative_positions(200)
    assert torch.allclose(gram, sim[rel + 199], atol=1e-10)


def test_similarity_properties():
    d = 64
    s = pe.sinusoidal_similarity(torch.arange(-50, 51), d)
    assert s[50].item() == pytest.approx(d / 2)  # offset 0: sum of cos 0
    assert torch.allclose(s, s.flip(0))  # even in m - n
    assert s.max() == s[50]
    assert pe.sinusoidal_similarity(torch.tensor([0.0]), d, normalized=True).item() == pytest.approx(1.0)


def test_tensor_positions_and_norm():
    pos = torch.tensor([[0.5, 3.0], [1e5, 2.0]])
    p = pe.sinusoidal_embedding(pos, 8)
    assert p.shape == (2, 2, 8)
    assert torch.allclose(p.norm(dim=-1), torch.full((2, 2), 2.0))  # sqrt(d/2)


@pytest.mark.parametrize("dim", [0, 3, 7])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match="even"):
        pe.sinusoidal_embedding(4, dim)


def test_bad_base_and_count():
    with pytest.raises(ValueError, match="base"):
        pe.sinusoidal_embedding(4, 8, base=1.0)
    with pytest.raises(ValueError, match=">= 1"):
        pe.sinusoidal_embedding(0, 8)


# --- input rules -----------------------------------------------------------------------------------

def test_a_float_count_says_it_wanted_an_integer():
    with pytest.raises(ValueError, match="n_positions must be an integer count"):
        pe.sinusoidal_embedding(4.0, 8)
    with pytest.raises(ValueError, match="distances must be an integer count"):
        pe.sinusoidal_similarity(2.5, 8)
    for bad in (True, None, "4"):
        with pytest.raises(ValueError, match="integer count"):
            pe.sinusoidal_embedding(bad, 8)
    # NumPy integers count; NumPy arrays and 0-d tensors are positions
    import numpy as np
    assert torch.equal(pe.sinusoidal_embedding(np.int64(3), 8), pe.sinusoidal_embedding(3, 8))
    assert torch.equal(pe.sinusoidal_embedding(np.arange(3), 8), pe.sinusoidal_embedding(3, 8))
    assert pe.sinusoidal_embedding(torch.tensor(2.5), 8).shape == (8,)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, "float32"])
def test_non_float_table_dtype_raises(dtype):
    with pytest.raises(ValueError, match="dtype"):
        pe.sinusoidal_embedding(4, 8, dtype=dtype)


def test_non_finite_or_boolean_positions_and_bases_raise():
    for bad in (torch.tensor([0.0, float("nan")]), torch.tensor([float("-inf")]), torch.tensor([True, False])):
        with pytest.raises(ValueError, match="positions"):
            pe.sinusoidal_embedding(bad, 8)
        with pytest.raises(ValueError, match="distances"):
            pe.sinusoidal_similarity(bad, 8)
    for base in (float("inf"), float("nan"), "100", None):
        with pytest.raises(ValueError, match="base"):
            pe.sinusoidal_frequencies(8, base)
        with pytest.raises(ValueError, match="base"):
            pe.SinusoidalPositions(base)


def test_empty_positions_give_empty_tables():
    assert pe.sinusoidal_embedding(torch.zeros(0), 8).shape == (0, 8)
    assert pe.sinusoidal_similarity(torch.zeros(0, 3), 8).shape == (0, 3)
    assert pe.sinusoidal_nearest_distance(torch.zeros(0), 4, 8).shape == (0,)
