"""Linear attention, NormAttention and their diagnostics (posenc.linear).

Every test compares against an independent formula: explicit loops over the
definition (Katharopoulos et al., 2020; Qin et al., 2022), softmax attention
with an explicit mask, or an algebraic identity.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc as pe
from posenc import linear as L
from posenc import transnormer as T

METHODS = ["chunked", "recurrent", "cumsum", "quadratic"]


def qkv(b=2, h=3, n=37, d=8, e=6, dtype=torch.float64):
    return (torch.randn(b, h, n, d, dtype=dtype), torch.randn(b, h, n, d, dtype=dtype),
            torch.randn(b, h, n, e, dtype=dtype))


def phi(x):
    return F.elu(x) + 1


def reference_linear(q, k, v, causal=True, normalize=True, eps=1e-6, feature=phi):
    """Loop over the definition: out_i = phi(q_i) S_i / (phi(q_i) z_i + eps)."""
    fq, fk = feature(q), feature(k)
    b, h, n, _ = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=v.dtype)
    for i in range(n):
        last = i + 1 if causal else n
        state = torch.einsum("bhjd,bhje->bhde", fk[:, :, :last], v[:, :, :last])  # S_i, inclusive
        z = fk[:, :, :last].sum(2)  # z_i, inclusive
        num = torch.einsum("bhd,bhde->bhe", fq[:, :, i], state)
        out[:, :, i] = num / ((fq[:, :, i] * z).sum(-1, keepdim=True) + eps) if normalize else num
    return out


# ---------------------------------------------------------------------------
# Feature maps
# ---------------------------------------------------------------------------


def test_feature_maps():
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    assert torch.allclose(L.elu_plus_one(x), torch.where(x < 0, torch.exp(x), x + 1))
    assert (L.elu_plus_one(x) > 0).all()
    assert torch.equal(L.relu_feature(x), x.clamp(min=0))
    assert L.feature_map("elu+1") is L.elu_plus_one and L.feature_map("relu") is L.relu_feature
    assert L.feature_map(torch.tanh) is torch.tanh
    assert torch.equal(L.feature_map(None)(x), x)
    with pytest.raises(ValueError, match="unknown feature map"):
        L.feature_map("softmax")


# ---------------------------------------------------------------------------
# Linear attention: the causal forms agree
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("feature", ["elu+1", "relu"])
def test_causal_forms_match_definition(normalize, feature):
    q, k, v = qkv()
    ref = reference_linear(q, k, v, normalize=normalize, feature=L.feature_map(feature))
    for method in METHODS:
        out = L.linear_attention(q, k, v, method=method, normalize=normalize, feature=feature)
        assert torch.allclose(out, ref, rtol=0, atol=1e-10), method


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 8, 16, 36, 37, 38, 64, 1000])
@pytest.mark.parametrize("normalize", [True, False])
def test_chunked_equals_quadratic_for_any_chunk(chunk_size, normalize):
    q, k, v = qkv(n=37)  # 37 is prime: never a multiple of the chunk (except 1 and 37)
    quad = L.linear_attention(q, k, v, method="quadratic", normalize=normalize)
    chunked = L.linear_attention(q, k, v, method="chunked", chunk_size=chunk_size, normalize=normalize)
    assert torch.allclose(chunked, quad, rtol=0, atol=1e-10)


def test_recurrent_matches_at_other_lengths():
    for n in (1, 2, 65):
        q, k, v = qkv(n=n)
        ref = L.linear_attention(q, k, v, method="quadratic")
        for method in ("recurrent", "cumsum", "chunked"):
            assert torch.allclose(L.linear_attention(q, k, v, method=method, chunk_size=16), ref, atol=1e-10)


def test_non_causal_equals_unmasked_quadratic():
    q, k, v = qkv()
    ref = reference_linear(q, k, v, causal=False)
    fq, fk = phi(q), phi(k)
    scores = fq @ fk.transpose(-2, -1)  # unmasked
    explicit = scores @ v / (scores.sum(-1, keepdim=True) + 1e-6)
    for method in METHODS:
        out = L.linear_attention(q, k, v, causal=False, method=method)
        assert torch.allclose(out, ref, atol=1e-10) and torch.allclose(out, explicit, atol=1e-10)


def test_weights_reproduce_output():
    q, k, v = qkv()
    for causal in (True, False):
        w = L.linear_attention_weights(q, k, causal=causal)
        assert torch.allclose(w @ v, L.linear_attention(q, k, v, causal=causal), atol=1e-10)
        if causal:
            assert (w.triu(1) == 0).all()


def test_float32_chunked_close_to_float64():
    q, k, v = qkv(b=1, h=2, n=1000, d=16, e=16)
    ref = L.linear_attention(q, k, v, method="quadratic")
    out = L.linear_attention(q.float(), k.float(), v.float(), method="chunked")
    assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-5)


def _check_causal(fn, n=20, t=11):
    q, k, v = qkv(n=n)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, t:] += torch.randn_like(q2[:, :, t:])
    k2[:, :, t:] += torch.randn_like(k2[:, :, t:])
    v2[:, :, t:] += torch.randn_like(v2[:, :, t:])
    a, b = fn(q, k, v), fn(q2, k2, v2)
    assert torch.allclose(a[:, :, :t], b[:, :, :t], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, :, t:], b[:, :, t:])


@pytest.mark.parametrize("method", METHODS)
def test_causality_linear(method):
    _check_causal(lambda q, k, v: L.linear_attention(q, k, v, method=method, chunk_size=4))
    _check_causal(lambda q, k, v: L.linear_attention(q, k, v, method=method, chunk_size=4, normalize=False))
    _check_causal(lambda q, k, v: T.norm_attention(q, k, v, method=method, chunk_size=4))
    _check_causal(lambda q, k, v: L.rope_linear_attention(q, k, v, method=method, chunk_size=4))


@pytest.mark.parametrize("kind", ["softmax", "relu"])
def test_causality_diag(kind):
    _check_causal(lambda q, k, v: pe.diag_attention(q, k, v, block_size=16, kind=kind), n=20, t=18)


def test_shapes_and_dtype():
    q, k, v = qkv(b=2, h=3, n=10, d=8, e=5, dtype=torch.float32)
    for out in (L.linear_attention(q, k, v), T.norm_attention(q, k, v), pe.diag_attention(q, k, v, block_size=4),
                L.rope_linear_attention(q, k, v), L.linear_attention(q, k, v, causal=False)):
        assert out.shape == (2, 3, 10, 5) and out.dtype == torch.float32


# ---------------------------------------------------------------------------
# NormAttention and Prop. 3.1
# ---------------------------------------------------------------------------


def test_norm_attention_is_rmsnorm_of_numerator_over_concatenated_heads():
    q, k, v = qkv(b=2, h=3, n=12, d=8, e=6)
    out = T.norm_attention(q, k, v, eps=0.0)
    num = reference_linear(q, k, v, normalize=False)  # (b, h, n, e)
    merged = num.transpose(1, 2).reshape(2, 12, 18)
    expected = merged / merged.pow(2).mean(-1, keepdim=True).sqrt()
    assert torch.allclose(out.transpose(1, 2).reshape(2, 12, 18), expected, atol=1e-10)
    rms = out.transpose(1, 2).reshape(2, 12, 18).pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-12)  # no gain: RMS exactly 1


def test_norm_attention_per_head_and_gain():
    q, k, v = qkv(b=1, h=2, n=9, d=4, e=4)
    out = T.norm_attention(q, k, v, eps=0.0, per_head=True)
    assert torch.allclose(out.pow(2).mean(-1).sqrt(), torch.ones(1, 2, 9, dtype=torch.float64), atol=1e-12)
    gain = torch.arange(1.0, 9.0, dtype=torch.float64)
    with_gain = T.norm_attention(q, k, v, eps=0.0, weight=gain)
    plain = T.norm_attention(q, k, v, eps=0.0)
    assert torch.allclose(with_gain, plain * gain.reshape(2, 4)[None, :, None, :], atol=1e-12)


def test_rms_norm_jacobian_bounded_by_inverse_sqrt_eps():
    # d RMSNorm / dx has spectral norm <= 1 / sqrt(eps) for every x: NormAttention's bound (App. D.2.3)
    eps = 1e-4
    for scale in (1e-6, 1e-2, 1.0, 1e3):
        x = torch.randn(16, dtype=torch.float64) * scale
        jac = torch.autograd.functional.jacobian(lambda t: T.rms_norm(t, eps), x)
        assert torch.linalg.matrix_norm(jac, ord=2) <= 1 / math.sqrt(eps) + 1e-9


def test_prop_3_1_gradient_grows_as_denominator_shrinks():
    # Normalised linear attention is invariant to rescaling phi(q_i), so its gradient with
    # respect to phi(q_i) scales like 1 / |phi(q_i)|: it is unbounded as the denominator -> 0.
    q, k, v = qkv(b=1, h=1, n=8, d=4, e=4)
    k = k.abs()  # relu features of the keys are the keys themselves
    g = torch.randn(1, 1, 8, 4, dtype=torch.float64)
    norms = []
    for c in (1.0, 1e-3, 1e-6):
        qc = (q.abs() * c).requires_grad_()
        (L.linear_attention(qc, k, v, feature="relu", eps=0.0) * g).sum().backward()
        norms.append(qc.grad.norm().item())
    assert math.isclose(norms[1] / norms[0], 1e3, rel_tol=1e-6)
    assert math.isclose(norms[2] / norms[0], 1e6, rel_tol=1e-6)


# ---------------------------------------------------------------------------
# RoPE in linear attention
# ---------------------------------------------------------------------------


def test_rope_linear_matches_explicit_numerator_only_formula():
    q, k, v = qkv(b=1, h=2, n=10, d=8, e=3)
    fq, fk = phi(q), phi(k)
    out = L.rope_linear_attention(q, k, v)
    expected = torch.zeros_like(out)
    for i in range(10):
        for j in range(i + 1):
            rel = pe.rope_rotation_matrix(j - i, 8)  # R_i^T R_j = R_{j-i}
            score = torch.einsum("bhd,de,bhe->bh", fq[:, :, i], rel, fk[:, :, j])
            expected[:, :, i] += score[..., None] * v[:, :, j]
        expected[:, :, i] /= (fq[:, :, i] * fk[:, :, : i + 1].sum(2)).sum(-1, keepdim=True) + 1e-6
    assert torch.allclose(out, expected, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_rope_linear_numerator_depends_on_relative_positions_only(causal):
    q, k, v = qkv(n=24)
    pos = torch.arange(24)
    base = L.rope_linear_attention(q, k, v, pos, causal=causal, normalize=False)
    for shift in (1, 1000, 123456):
        shifted = L.rope_linear_attention(q, k, v, pos + shift, causal=causal, normalize=False)
        assert torch.allclose(shifted, base, atol=1e-8)
    # with RoPE at position 0 everywhere nothing rotates: plain linear attention
    zero = torch.zeros(24)
    assert torch.allclose(L.rope_linear_attention(q, k, v, zero, causal=causal),
                          L.linear_attention(q, k, v, causal=causal), atol=1e-10)


def test_rope_linear_methods_agree():
    q, k, v = qkv(n=29)
    ref = L.rope_linear_attention(q, k, v, method="quadratic")
    for method in ("chunked", "recurrent", "cumsum"):
        assert torch.allclose(L.rope_linear_attention(q, k, v, method=method, chunk_size=8), ref, atol=1e-10)


# ---------------------------------------------------------------------------
# Locally accumulated attention score
# ---------------------------------------------------------------------------


def brute_force_locality(w, r):
    """Grow a window around each query, alternately left and right (Qin et al., App. F)."""
    n = w.shape[-1]
    size = math.floor(r * n + 0.5)
    total = 0.0
    for i in range(w.shape[-2]):
        chosen = [i] if size >= 1 else []
        left, right, turn = i - 1, i + 1, 0
        while len(chosen) < size:
            if turn == 0 and left >= 0:
                chosen.append(left)
                left -= 1
            elif turn == 1 and right < n:
                chosen.append(right)
                right += 1
            elif left < 0:  # only the right side is left
                chosen.append(right)
                right += 1
            else:
                chosen.append(left)
                left -= 1
            turn = 1 - turn
        total += w[i, chosen].sum().item() / w[i].sum().item()
    return total / w.shape[-2]


def test_locality_matches_brute_force():
    w = torch.rand(23, 23, dtype=torch.float64).tril()
    ratios = [0.0, 0.04, 0.1, 0.25, 0.5, 0.77, 1.0]
    curve = T.locally_accumulated_attention(w, ratios)
    for r, value in zip(ratios, curve):
        assert math.isclose(value.item(), brute_force_locality(w, r), rel_tol=1e-12, abs_tol=1e-12)


def test_locality_reference_cases():
    n = 40
    ratios = torch.linspace(0, 1, 11)
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    sizes = torch.floor(ratios.double() * n + 0.5)
    assert torch.allclose(T.locally_accumulated_attention(uniform, ratios), sizes / n)
    identity = torch.eye(n, dtype=torch.float64)
    assert torch.allclose(T.locally_accumulated_attention(identity, ratios[1:]), torch.ones(10, dtype=torch.float64))
    assert T.locally_accumulated_attention(identity, 0.0).item() == 0.0
    w = torch.rand(2, 3, n, n).tril()
    curve = T.locally_accumulated_attention(w, ratios)
    assert (curve.diff() >= -1e-12).all() and math.isclose(curve[-1].item(), 1.0)
    assert T.locally_accumulated_attention(w, ratios, per_query=True).shape == (2, 3, n, 11)


def test_locality_softmax_with_local_bias_beats_uniform():
    # ALiBi-like local bias concentrates attention: its curve dominates the causal-uniform one
    n = 64
    rel = pe.relative_positions(n).double()
    local = torch.softmax((rel * 0.5).masked_fill(rel > 0, float("-inf")), -1)
    flat = torch.ones(n, n, dtype=torch.float64).tril()
    r = torch.linspace(0.05, 0.95, 19)
    assert (T.locally_accumulated_attention(local, r) > T.locally_accumulated_attention(flat, r)).all()


# ---------------------------------------------------------------------------
# Other helpers
# ---------------------------------------------------------------------------


def test_gradient_relative_std():
    assert T.gradient_relative_std([1.0, 3.0]) == 0.5
    assert T.gradient_relative_std(torch.full((10,), 2.0)) == 0.0
    x = torch.rand(100, dtype=torch.float64) + 1
    assert math.isclose(T.gradient_relative_std(x), (x.std(unbiased=False) / x.mean()).item())
    with pytest.raises(ValueError):
        T.gradient_relative_std([1.0])
    with pytest.raises(ValueError):
        T.gradient_relative_std([-1.0, -2.0])


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_value_errors():
    q, k, v = qkv(n=8, d=6)
    with pytest.raises(ValueError, match="method"):
        L.linear_attention(q, k, v, method="fast")
    with pytest.raises(ValueError, match="chunk_size"):
        L.linear_attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="eps"):
        L.linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="even"):
        L.rope_linear_attention(q[..., :5], k[..., :5], v)
    with pytest.raises(ValueError, match="same shape"):
        L.linear_attention(q, k[:, :, :7], v)
    with pytest.raises(ValueError, match="v must be"):
        T.norm_attention(q, k, v[:, :, :7])
    with pytest.raises(ValueError, match="ratios"):
        T.locally_accumulated_attention(torch.eye(4), 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        T.locally_accumulated_attention(-torch.eye(4), 0.5)


def test_chunked_gradients_equal_quadratic():
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, n=23, d=4, e=3))
    grads = []
    for method in ("chunked", "quadratic"):
        out = L.linear_attention(q, k, v, method=method, chunk_size=5)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10)
    assert torch.autograd.gradcheck(lambda a, b, c: T.norm_attention(a, b, c, chunk_size=5), (q, k, v))


@pytest.mark.parametrize("chunk_size", [16, 64, 100])
def test_chunked_across_segments(chunk_size):
    # long enough for the chunked form to carry its state across several segments of ~1024 tokens
    q, k, v = qkv(b=1, h=2, n=2100, d=4, e=3)
    for normalize in (True, False):
        quad = L.linear_attention(q, k, v, method="quadratic", normalize=normalize)
        chunked = L.linear_attention(q, k, v, chunk_size=chunk_size, normalize=normalize)
        assert torch.allclose(chunked, quad, rtol=1e-12, atol=1e-9)


# ---------------------------------------------------------------------------
# Reliability
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_empty_sequences_give_empty_outputs(method):
    q, k, v = qkv(n=0)
    for fn in (L.linear_attention, T.norm_attention, L.rope_linear_attention):
        assert fn(q, k, v, method=method).shape == (2, 3, 0, 6)
    assert L.linear_attention(q[:0], k[:0], v[:0], method=method).shape == (0, 3, 0, 6)
    assert pe.diag_attention(q, k, v).shape == (2, 3, 0, 6)


def test_meta_tensors_give_shapes():
    q, k, v = (t.to("meta") for t in qkv(n=9))
    for out in (L.linear_attention(q, k, v), T.norm_attention(q, k, v), L.rope_linear_attention(q, k, v),
                pe.diag_attention(q, k, v, block_size=4)):
        assert out.shape == (2, 3, 9, 6) and out.is_meta
    with pytest.raises(ValueError, match="meta"):
        T.locally_accumulated_attention(torch.eye(4, device="meta"), 0.5)


def test_clear_errors_for_tensors_of_the_wrong_kind():
    q, k, v = qkv(n=8)
    cases = [
        ((q.numpy(), k, v), TypeError, "torch.Tensor"),
        ((q.long(), k.long(), v.long()), ValueError, "floating-point"),
        ((q, k.float(), v), ValueError, "one dtype and device"),
        ((q, k, v.to("meta")), ValueError, "one dtype and device"),
        ((q, k, v.transpose(1, 2)), ValueError, "batch, seq, heads"),
    ]
    for fn in (L.linear_attention, T.norm_attention, L.rope_linear_attention, pe.diag_attention):
        for args, error, match in cases:
            with pytest.raises(error, match=match):
                fn(*args)
    with pytest.raises(TypeError, match="causal"):
        L.linear_attention(q, k, v, causal=None)
    with pytest.raises(ValueError, match="floating-point"):
        T.rms_norm(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="dim"):
        T.rms_norm(torch.ones(3), dim=1)
    with pytest.raises(TypeError, match="weight"):
        T.rms_norm(torch.ones(3), weight=[1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match="values"):
        T.gradient_relative_std("ab")
    with pytest.raises(TypeError, match="ratios"):
        T.locally_accumulated_attention(torch.eye(4), "half")
