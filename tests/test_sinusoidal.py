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
