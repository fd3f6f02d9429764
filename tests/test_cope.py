"""CoPE: the efficient form (q.e at integer positions, interpolated) against the paper's equations, and the scheme."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe


def _reference(q, k, v, e, scale=None, window=None):
    """Golovneva et al. (2024)'s equations, one pair at a time: gates, counted positions, interpolated e[p]."""
    b, h, n, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    cap = e.shape[0] - 1
    out = torch.zeros(b, h, n, v.shape[-1], dtype=q.dtype)
    for i in range(n):
        keys = [j for j in range(i + 1) if window is None or i - j < window]
        z = {j: scale * (q[:, :, i] * k[:, :, j]).sum(-1) for j in keys}  # (b, h) each
        logits = []
        for j in keys:
            p = sum(torch.sigmoid(z[m]) for m in keys if m >= j).clamp(max=cap)  # p_ij = sum_{k=j..i} g_ik
            low, high = p.floor().long(), p.ceil().long()
            w = (p - p.floor())[..., None]
            e_p = (1 - w) * e[low] + w * e[high]  # (b, h, d): the interpolated embedding
            logits.append(z[j] + (q[:, :, i] * e_p).sum(-1))
        weights = torch.softmax(torch.stack(logits, -1), -1)
        out[:, :, i] = (weights[..., None] * v[:, :, keys]).sum(-2)
    return out


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 2), n=st.integers(1, 8), d=st.sampled_from([2, 4]),
       n_positions=st.integers(2, 10), window=st.one_of(st.none(), st.integers(1, 4)), seed=st.integers(0, 1000))
def test_equals_the_equations_of_the_paper(b, h, n, d, n_positions, window, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64, generator=g) * 2 for _ in range(3))
    e = torch.randn(n_positions, d, dtype=torch.float64, generator=g)
    out, weights = pe.cope_attention(q, k, v, e, window=window, return_weights=True)
    torch.testing.assert_close(out, _reference(q, k, v, e, window=window), rtol=1e-10, atol=1e-12)
    assert bool((weights.triu(1) == 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(b, h, n, dtype=torch.float64))


def test_efficient_position_logits_equal_the_direct_interpolation():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 7, 4, dtype=torch.float64, generator=g)
    e = torch.randn(6, 4, dtype=torch.float64, generator=g)
    p = torch.rand(2, 3, 7, 7, dtype=torch.float64, generator=g) * 5
    p[0, 0, 0, :3] = torch.tensor([0.0, 2.0, 5.0], dtype=torch.float64)  # integers: floor = ceil
    low, high = p.floor().long(), p.ceil().long()
    w = (p - p.floor())[..., None]
    direct = (q[:, :, :, None, :] * ((1 - w) * e[low] + w * e[high])).sum(-1)  # (b, h, n, n) from e[p]
    torch.testing.assert_close(pe.cope_position_logits(q, e, p), direct, rtol=1e-12, atol=1e-12)


def test_positions_count_the_open_gates_and_cap():
    gates = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])  # a gate shut at key 1 for query 2
    assert pe.cope_positions(gates).tolist() == [[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [2.0, 1.0, 1.0]]
    assert pe.cope_positions(gates, 2).max().item() == 1.0


def test_gradcheck():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=torch.float64, generator=g).requires_grad_() for _ in range(3))
    e = torch.randn(16, 3, dtype=torch.float64, generator=g).requires_grad_()  # no position reaches the cap
    assert torch.autograd.gradcheck(lambda *a: pe.cope_attention(*a), (q, k, v, e))


def test_finite_at_sixteen_times_the_training_length_and_causal():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 1024, 16, generator=g) * 3 for _ in range(3))
    e = torch.randn(64, 16, generator=g)
    out = pe.cope_attention(q, k, v, e)
    assert bool(torch.isfinite(out).all())
    short = pe.cope_attention(q[:, :, :100], k[:, :, :100], v[:, :, :100], e)
    torch.testing.assert_close(short, out[:, :, :100], rtol=1e-5, atol=1e-6)  # later tokens change nothing
    half = pe.cope_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), e.bfloat16())
    assert half.dtype == torch.bfloat16 and bool(torch.isfinite(half).all())


def test_scheme_in_a_model():
    model = pe.TinyLM(10, 16, 2, 2, position="cope", n_positions=8)
    scheme = model.position
    assert isinstance(scheme, pe.CoPE) and tuple(scheme.embeddings.shape) == (2, 8, 8)
    assert model.config["position"] == {"scheme": "cope", "n_positions": 8}
    assert bool((scheme.embeddings == 0).all())  # zeros at first: NoPE
    idx = torch.randint(0, 10, (2, 12))
    nope = pe.TinyLM(10, 16, 2, 2, position="none")
    nope.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("position.")})
    torch.testing.assert_close(model(idx), nope(idx), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        scheme.embeddings.normal_()
    logits, weights = model(idx, return_attention=True)
    assert len(weights) == 2 and not torch.allclose(weights[0], weights[1])  # one table per layer
    torch.testing.assert_close(logits, model(idx))
    model.window = 4
    assert bool(torch.isfinite(model(idx)).all())


def test_errors():
    with pytest.raises(ValueError, match="n_positions"):
        pe.TinyLM(10, 16, 1, 2, position="cope", n_positions=1)
    with pytest.raises(ValueError, match="n_positions"):
        pe.CoPE(n_positions=2.5)
    with pytest.raises(ValueError, match="softmax"):
        pe.TinyLM(10, 16, 1, 2, position="cope", attention="linear")
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="n_positions >= 2"):
        pe.cope_attention(q, q, q, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="head_dim=4"):
        pe.cope_attention(q, q, q, torch.zeros(6, 3))
    with pytest.raises(ValueError, match="one length"):
        pe.cope_attention(q[:, :, :2], q, q, torch.zeros(6, 4))
    with pytest.raises(ValueError, match=r"\[0, n_positions - 1\]"):
        pe.cope_position_logits(q, torch.zeros(3, 4), torch.full((1, 2, 5, 5), 2.5))
    model = pe.TinyLM(10, 16, 1, 2, position="cope")
    model.window, model.sinks = 4, 1
    with pytest.raises(ValueError, match="kept first tokens"):
        model(torch.randint(0, 10, (1, 8)))
    idx, model = torch.randint(0, 10, (1, 4)), pe.TinyLM(10, 16, 1, 2, position="cope")
    assert torch.equal(model(idx, positions=torch.arange(4) * 3), model(idx))  # ids ignored: positions from content
