"""Tests for the bias kernels: posenc.kerple, posenc.sandwich and posenc.t5."""

import math

import numpy as np
import pytest
import torch

import posenc as pe
from posenc.kerple import KerpleBias, kerple_log_bias, kerple_power_bias
from posenc.sandwich import sandwich_bias, sandwich_qk
from posenc.t5 import T5RelativeBias, t5_relative_buckets


# --------------------------------------------------------------------------- T5


def _mesh_tf_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Scalar transcription of Mesh TensorFlow's _relative_position_bucket (float64 log)."""
    ret = 0
    n = -rel
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (8, 20), (16, 1000)])
def test_t5_buckets_match_reference(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-600, 601)
    ours = t5_relative_buckets(rel, bidirectional, num_buckets, max_distance)
    ref = torch.tensor([_mesh_tf_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel])
    assert torch.equal(ours, ref)


def test_t5_causal_buckets():
    dist = torch.arange(0, 2000)
    b = t5_relative_buckets(-dist, bidirectional=False)  # keys in the past: rel = -distance
    assert b.dtype == torch.int64
    assert torch.equal(b[:16], torch.arange(16))  # distances 0..15: one exact bucket each
    assert bool((b[1:] >= b[:-1]).all())  # monotone non-decreasing
    assert bool((b[128:] == 31).all())  # max bucket at and beyond max_distance
    assert int(b.max()) == 31 and int(b.min()) == 0
    assert set(b[:129].tolist()) == set(range(32))  # every bucket used up to 128
    # future keys (rel > 0) fold onto bucket 0 in the causal scheme
    assert bool((t5_relative_buckets(torch.arange(1, 50), False) == 0).all())


def test_t5_bidirectional_buckets():
    rel = torch.arange(-1000, 1001)
    b = t5_relative_buckets(rel, bidirectional=True)
    assert bool((b[rel <= 0] < 16).all())  # past and self: lower half
    assert bool((b[rel > 0] >= 16).all())  # future: upper half
    for r in range(1, 1001):  # the two sides are bucketed alike
        assert int(b[rel == r]) == int(b[rel == -r]) + 16
    assert torch.equal(b[(rel <= 0) & (rel > -8)].flip(0), torch.arange(8))  # 8 exact per side
    assert bool((b[rel <= -128] == 15).all()) and bool((b[rel >= 128] == 31).all())


def test_t5_module_bias():
    torch.manual_seed(0)
    m = T5RelativeBias(4)
    b = m(10, 300)
    assert b.shape == (4, 10, 300)
    rel = pe.relative_positions(10, 300)
    idx = t5_relative_buckets(rel, False)
    assert torch.equal(b, m.relative_attention_bias.weight[idx].permute(2, 0, 1))
    # beyond max_distance every offset shares one value (per head)
    far = b[:, -1, : 300 - 128]
    assert torch.equal(far, far[:, :1].expand_as(far))
    # bottom-right alignment: a single query is the last row of the full square
    assert torch.equal(m(1, 50)[:, 0], m(50)[:, -1])
    b.sum().backward()
    assert m.relative_attention_bias.weight.grad.abs().sum() > 0


def test_t5_bad_input():
    with pytest.raises(ValueError):
        t5_relative_buckets(torch.tensor([0.5]), False)
    with pytest.raises(ValueError):
        t5_relative_buckets(torch.tensor([1]), True, num_buckets=2)
    with pytest.raises(ValueError):
        t5_relative_buckets(torch.tensor([1]), False, num_buckets=32, max_distance=16)
    with pytest.raises(ValueError):
        T5RelativeBias(0)
    with pytest.raises(ValueError):
        T5RelativeBias(2)(5, 4)


# --------------------------------------------------------------------- Sandwich


def test_sandwich_bias_zero_at_diagonal_and_nonpositive():
    b = sandwich_bias(8, 64, 200)
    assert b.shape == (8, 64, 200)
    rel = pe.relative_positions(64, 200)
    assert bool((b[:, rel == 0] == 0).all())
    assert bool((b <= 0).all())
    assert bool((b[:, rel != 0] < 0).all())


def test_sandwich_bias_formula_and_head_scales():
    H, d = 4, 16
    b = sandwich_bias(H, 1, 50, dim=d, dtype=torch.float64)[:, 0]  # (H, 50), rel = -49 .. 0
    rel = torch.arange(-49, 1, dtype=torch.float64)
    # the paper's sum runs over i = 1 .. d/2; sinusoidal_similarity over i = 0 .. d/2 - 1
    total = pe.sinusoidal_similarity(rel, d) - torch.cos(rel) + torch.cos(rel / 10000.0)
    for h in range(1, H + 1):
        assert torch.allclose(b[h - 1], (total - d / 2) / (8 * h / H), atol=1e-12)


def test_sandwich_concatenation_identity():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64)
    for lam in (0.7, torch.tensor([0.1, 1.0, 2.5], dtype=torch.float64)):
        q2, k2 = sandwich_qk(q, k, lam, dim=16)
        assert q2.shape == (2, 3, 5, 24) and k2.shape == (2, 3, 9, 24)
        lhs = q2 @ k2.transpose(-1, -2)
        sim = pe.sinusoidal_similarity(pe.relative_positions(5, 9), 16)  # (5, 9), even in m - n
        lam_h = torch.as_tensor(lam, dtype=torch.float64).reshape(1, -1, 1, 1)
        rhs = q @ k.transpose(-1, -2) + lam_h * sim
        assert torch.allclose(lhs, rhs, atol=1e-10)


def test_sandwich_bad_input():
    with pytest.raises(ValueError):
        sandwich_bias(0, 4)
    with pytest.raises(ValueError):
        sandwich_bias(4, 4, dim=7)
    with pytest.raises(ValueError):
        sandwich_bias(4, 5, 4)
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError):
        sandwich_qk(q, q, -1.0, 8)
    with pytest.raises(ValueError):
        sandwich_qk(q, torch.zeros(1, 2, 3, 6), 1.0, 8)
    with pytest.raises(ValueError):
        sandwich_qk(q, q, torch.ones(3), 8)


# ----------------------------------------------------------------------- KERPLE


def test_kerple_power_r2_one_is_alibi():
    slopes = pe.alibi_slopes(8)
    b = kerple_power_bias(slopes, torch.ones(8), 20, 33)
    assert torch.allclose(b, pe.alibi_bias(slopes, 20, 33))
    # r2 = 2: a quadratic penalty
    d = pe.relative_positions(6).abs().double()
    assert torch.allclose(kerple_power_bias(torch.tensor([0.5], dtype=torch.float64), 2.0, 6)[0], -0.5 * d**2)


def test_kerple_log_formula_and_small_distance_slope():
    r1, r2 = torch.tensor([2.0, 0.5]), torch.tensor([0.01, 1.0])
    b = kerple_log_bias(r1, r2, 10)
    d = pe.relative_positions(10).abs().float()
    assert torch.allclose(b, -r1[:, None, None] * torch.log(1 + r2[:, None, None] * d))
    # log(1 + x) ~ x: for small r2 the log kernel is ALiBi with slope r1 * r2
    assert torch.allclose(b[0], -0.02 * d, rtol=0.05)
    assert bool((b.diagonal(dim1=-2, dim2=-1) == 0).all()) and bool((b <= 0).all())


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5, 2.0])
def test_kerple_power_kernel_is_conditionally_positive_definite(p):
    # c^T K c >= 0 whenever sum(c) = 0, for K = -|m - n|^p and 0 < p <= 2
    n = 40
    k = kerple_power_bias(torch.tensor([1.0], dtype=torch.float64), p, n)[0]
    proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
    eig = torch.linalg.eigvalsh(proj @ k @ proj)
    assert float(eig.min()) > -1e-8 * float(eig.abs().max())


def test_kerple_power_above_two_is_not_cpd():
    n = 40
    k = -(pe.relative_positions(n).abs().double() ** 3)  # p = 3 is outside KERPLE's range
    proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
    assert float(torch.linalg.eigvalsh(proj @ k @ proj).min()) < -1.0


@pytest.mark.parametrize("fn", [kerple_power_bias, kerple_log_bias])
def test_kerple_gradients_flow(fn):
    r1 = torch.tensor([0.5, 1.0], requires_grad=True)
    r2 = torch.tensor([0.7, 1.3], requires_grad=True)
    b = fn(r1, r2, 12, 16)
    assert b.shape == (2, 12, 16)
    b.sum().backward()
    for g in (r1.grad, r2.grad):
        assert g is not None and bool(torch.isfinite(g).all()) and bool((g != 0).all())
    assert bool((r1.grad < 0).all())  # a larger r1 means a larger penalty


@pytest.mark.parametrize("kind", ["power", "log"])
def test_kerple_module_clamps_and_learns(kind):
    m = KerpleBias(3, kind, generator=torch.Generator().manual_seed(0))
    # the authors' initial ranges
    hi1, hi2 = (1.0, 2.0) if kind == "power" else (2.0, 1.0)
    assert bool((m.r1 >= 0.01).all() & (m.r1 <= hi1).all() & (m.r2 >= 0.01).all() & (m.r2 <= hi2).all())
    with torch.no_grad():
        m.r1.copy_(torch.tensor([-1.0, 0.0, 0.5]))
        m.r2.copy_(torch.tensor([5.0, -2.0, 0.3]))
    b = m(8, 10)
    assert b.shape == (3, 8, 10) and bool(torch.isfinite(b).all()) and bool((b <= 0).all())
    assert torch.allclose(m.r1, torch.tensor([0.01, 0.01, 0.5]))
    assert float(m.r2.detach()[1]) == pytest.approx(0.01)
    assert float(m.r2.detach()[0]) == pytest.approx(2.0 if kind == "power" else 5.0)
    b.sum().backward()
    assert m.r1.grad is not None and bool((m.r1.grad != 0).all())
    assert m.r2.grad is not None and bool(torch.isfinite(m.r2.grad).all())
    # a gradient step on the positive penalty sum decreases r1, the clamp keeps it >= eps
    opt = torch.optim.SGD(m.parameters(), lr=100.0)
    opt.zero_grad()
    (-m(8, 10)).sum().backward()
    opt.step()
    m(8, 10)
    assert bool((m.r1 >= 0.01).all() & (m.r2 >= 0.01).all())


def test_kerple_module_explicit_init_matches_function():
    m = KerpleBias(2, "power", r1=torch.tensor([0.5, 0.25]), r2=1.0)
    assert torch.allclose(m(6), pe.alibi_bias(torch.tensor([0.5, 0.25]), 6))


def test_kerple_bad_input():
    with pytest.raises(ValueError):
        kerple_power_bias(torch.tensor([0.0]), 1.0, 4)
    with pytest.raises(ValueError):
        kerple_power_bias(1.0, torch.tensor([2.5]), 4)
    with pytest.raises(ValueError):
        kerple_power_bias(1.0, 0.0, 4)
    with pytest.raises(ValueError):
        kerple_log_bias(1.0, -0.1, 4)
    with pytest.raises(ValueError):
        kerple_log_bias(-1.0, 0.5, 4)
    with pytest.raises(ValueError):
        kerple_log_bias(torch.ones(3), torch.ones(2), 4)
    with pytest.raises(ValueError):
        kerple_power_bias(torch.ones(2, 2), 1.0, 4)
    with pytest.raises(ValueError):
        kerple_power_bias(1.0, 1.0, 5, 4)
    with pytest.raises(ValueError):
        KerpleBias(4, "cubic")
    with pytest.raises(ValueError):
        KerpleBias(0)
    with pytest.raises(ValueError):
        KerpleBias(3, r1=torch.ones(2))
    # values of tensors that require grad are not checked (KerpleBias clamps them)
    r2 = torch.tensor([3.0], requires_grad=True)
    assert kerple_power_bias(torch.tensor([1.0]), r2, 3).shape == (1, 3, 3)


# ------------------------------------------------------------------ reliability


def _bound(scheme, n_heads=4):
    scheme.bind(d_model=16, n_heads=n_heads, n_layers=2)
    return scheme


def test_sandwich_cache_filled_in_inference_mode_serves_a_later_backward():
    """A table cached inside torch.inference_mode() is a normal tensor: forward + backward work outside."""
    scheme = _bound(pe.Sandwich(dim=16))
    with torch.inference_mode():
        first = scheme.distance_bias(40, device=torch.device("cpu"), dtype=torch.float32)
    table = scheme.distance_bias(40, device=torch.device("cpu"), dtype=torch.float32)
    assert table is first and not table.is_inference()
    lam = torch.tensor(0.5, requires_grad=True)  # a learned scale saves the table for its backward
    q, k, v = (torch.randn(1, 4, 40, 8, requires_grad=True) for _ in range(3))
    out = pe.relative_attention(q, k, v, distance_bias=lam * table)
    out.sum().backward()
    assert lam.grad is not None and torch.isfinite(q.grad).all()
    table.add_(0.0)  # in-place use outside inference mode is allowed too


def test_learned_biases_after_inference_mode():
    """KERPLE and T5 modules called in inference mode then trained: parameters stay normal tensors."""
    for module in (KerpleBias(4, "log"), T5RelativeBias(4)):
        with torch.inference_mode():
            module(8)
        module(8).sum().backward()
        assert all(p.grad is not None and not p.is_inference() for p in module.parameters())


@pytest.mark.parametrize("build,match", [
    (lambda: KerpleBias(2, dtype=torch.int64), "floating-point"),
    (lambda: KerpleBias(2, r1=float("nan")), "finite"),
    (lambda: KerpleBias(2, r2=[1.0, float("inf")]), "finite"),
    (lambda: KerpleBias(2, eps=float("nan")), "eps"),
    (lambda: KerpleBias(2.0), "n_heads"),
    (lambda: T5RelativeBias(2, dtype=torch.bool), "floating-point"),
    (lambda: T5RelativeBias(2, init_std=float("inf")), "init_std"),
    (lambda: T5RelativeBias(2, num_buckets=2.5), "num_buckets"),
    (lambda: pe.Sandwich(base=float("nan")), "base"),
    (lambda: pe.Sandwich(dim=7), "even"),
    (lambda: pe.Kerple("cubic"), "kind"),
    (lambda: pe.T5Bias(num_buckets=1), "num_buckets"),
    (lambda: KerpleBias(2, device="gpu7"), "device"),
    (lambda: T5RelativeBias(2, device=1.5), "device"),
    (lambda: pe.ALiBi().slopes(), "bind"),  # a scheme used before a model bound it
    (lambda: pe.Sandwich().distance_bias(4, device=torch.device("cpu"), dtype=torch.float32), "bind"),
    (lambda: pe.Kerple().distance_bias(4, device=torch.device("cpu"), dtype=torch.float32), "bind"),
    (lambda: pe.T5Bias().distance_bias(4, device=torch.device("cpu"), dtype=torch.float32), "bind"),
])
def test_modules_validate_at_construction_and_before_use(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("scheme", [pe.Sandwich(dim=16), pe.Kerple("power"), pe.T5Bias(), pe.ALiBi()])
def test_scheme_tables_refuse_integer_dtypes(scheme):
    scheme = _bound(scheme)
    assert scheme.distance_bias(6, device=torch.device("cpu"), dtype=torch.float64).dtype == torch.float64
    for dtype in (torch.int64, torch.bool):
        with pytest.raises(ValueError, match="floating-point"):
            scheme.distance_bias(6, device=torch.device("cpu"), dtype=dtype)


def test_parameters_of_other_types():
    r1, r2 = np.array([0.5, 1.0]), [1, 2]  # NumPy and integers are converted
    assert torch.allclose(kerple_power_bias(r1, r2, 4), kerple_power_bias(torch.tensor([0.5, 1.0]),
                                                                          torch.tensor([1.0, 2.0]), 4).double())
    assert torch.equal(kerple_log_bias(1, 2, np.int64(3)), kerple_log_bias(1.0, 2.0, 3))
    bad = [
        (lambda: kerple_power_bias(torch.tensor([True]), 1.0, 4), ValueError, "real numbers"),
        (lambda: kerple_power_bias(True, 1.0, 4), ValueError, "real numbers"),
        (lambda: kerple_power_bias("r1", 1.0, 4), TypeError, "r1"),
        (lambda: kerple_log_bias(1.0, torch.tensor([float("nan")], requires_grad=True), 4), ValueError, "finite"),
        (lambda: kerple_power_bias(1.0, 1.0, 4.0), ValueError, "q_len"),
        (lambda: sandwich_bias(2, 4, base=float("inf")), ValueError, "base"),
        (lambda: sandwich_bias(2, 4, dtype=torch.int64), ValueError, "floating-point"),
        (lambda: sandwich_qk(torch.zeros(1, 2, 3, 4).long(), torch.zeros(1, 2, 3, 4).long(), 1.0, 8), ValueError,
         "floating-point"),
        (lambda: sandwich_qk(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4).double(), 1.0, 8), ValueError,
         "one dtype"),
        (lambda: sandwich_qk(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), float("nan"), 8), ValueError,
         "finite"),
        (lambda: sandwich_qk(torch.zeros(1, 2, 3, 4).numpy(), torch.zeros(1, 2, 3, 4), 1.0, 8), TypeError, "Tensor"),
        (lambda: t5_relative_buckets(None, False), TypeError, "rel"),
        (lambda: t5_relative_buckets(torch.tensor([True]), False), ValueError, "integer"),
    ]
    for call, error, match in bad:
        with pytest.raises(error, match=match):
            call()
