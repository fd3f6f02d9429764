"""Property-based tests (hypothesis) of attention, biases, masks and linear attention.

Every path of relative_attention equals the explicit float64 reference; the
biases depend on i - j only; the linear-attention forms agree; and every public
function answers random bad arguments with a result or a ValueError / TypeError.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc._fused_alibi import key_bias_available

LOW = {torch.bfloat16: 0.03, torch.float16: 0.004, torch.float32: 2e-5}  # error / (1 + |float64 value|)


def _qkv(seed, b, h, q_len, k_len, d, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, q_len, d, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(b, h, k_len, d, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(b, h, k_len, d, generator=g, dtype=torch.float64).to(dtype))


def _run(path, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is not compiled
        return pe.relative_attention(*args, path=path, **kw)


def _explicit(q, k, v, bias=None, mask=None, scale=None):
    """softmax(scale q k^T + bias, masked) v in float64; a query allowed no key gives 0."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)).double() * scale + (0 if bias is None else bias.double())
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    dead = torch.isinf(scores).all(-1, keepdim=True)
    weights = torch.where(dead, 0.0, scores.masked_fill(dead, 0).softmax(-1))
    return weights @ v.double()


lengths = st.sampled_from([1, 2, 7, 33, 128, 129, 200, 257, 300])


@st.composite
def relative_case(draw):
    q_len = draw(lengths)
    k_len = q_len + draw(st.sampled_from([0, 1, 5, 40, 0]))
    heads = draw(st.integers(1, 4))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    kw = {}
    slopes, table, window, dead = (draw(st.booleans()) for _ in range(4))
    if slopes or not (table or window or dead):
        kw["slopes"] = torch.rand(heads, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.5, 0.01, 2.0]))
    if table or dead:
        kw["distance_bias"] = torch.randn(heads, k_len + draw(st.integers(0, 3)), generator=g, dtype=torch.float64)
        if dead:  # the nearest distances forbidden: the first queries see no key at all
            kw["distance_bias"][:, : draw(st.integers(1, 3))] = float("-inf")
    if window:
        kw["window"] = draw(st.sampled_from([17, 1, 2, 3, 130, 1000]))
    return dict(b=draw(st.integers(1, 2)), h=heads, q_len=q_len, k_len=k_len, d=draw(st.sampled_from([8, 1, 3])),
                seed=draw(st.integers(0, 1000)), kw=kw, scale=draw(st.sampled_from([None, 0.3, -1.0])))


@given(relative_case())
@settings(max_examples=30)
def test_every_path_equals_naive(case):
    q, k, v = _qkv(case["seed"], case["b"], case["h"], case["q_len"], case["k_len"], case["d"])
    kw = dict(case["kw"], scale=case["scale"])
    ref = _run("naive", q, k, v, **kw)
    assert ref.shape == (case["b"], case["h"], case["q_len"], case["d"]) and torch.isfinite(ref).all()
    for path in ("chunked", "bias", "auto", "flex", "fold"):
        if path == "flex" and case["k_len"] > 64:
            continue  # eager FlexAttention on CPU is slow
        if path == "fold" and (set(case["kw"]) != {"slopes"} or case["q_len"] != case["k_len"]):
            with pytest.raises(ValueError, match="fold"):
                _run(path, q, k, v, **kw)
            continue
        out = _run(path, q, k, v, **kw)
        assert out.shape == ref.shape and out.dtype == q.dtype
        assert torch.allclose(out, ref, atol=1e-10), (path, (out - ref).abs().max().item())


@given(relative_case(), st.sampled_from([torch.bfloat16, torch.float16, torch.float32]))
@settings(max_examples=15)
def test_low_precision_paths_are_close_to_float64(case, dtype):
    """Every path in bfloat16, float16 and float32 against float64 (the fold with ALiBi slopes, q_len == k_len)."""
    kw = {k: v for k, v in case["kw"].items() if k != "distance_bias" or not torch.isinf(v).any()}
    q, k, v = _qkv(case["seed"], case["b"], case["h"], case["q_len"], case["k_len"], case["d"])
    for path in ("chunked", "bias", "naive", "fold"):
        if path == "fold":
            kw = dict(slopes=pe.alibi_slopes(case["h"], dtype=torch.float64))
            k, v = k[:, :, -case["q_len"]:], v[:, :, -case["q_len"]:]
        ref = _run("naive", q, k, v, **kw)
        low = {key: (t.to(dtype) if isinstance(t, torch.Tensor) else t) for key, t in kw.items()}
        out = _run(path, q.to(dtype), k.to(dtype), v.to(dtype), **low)
        tol = LOW[dtype] * (2 if path == "naive" else 1)  # the explicit path rounds every step to dtype
        assert out.dtype == dtype and ((out.double() - ref).abs() / (1 + ref.abs())).max() < tol, path


@given(st.integers(1, 2), st.integers(1, 3), lengths, st.integers(0, 9), st.sampled_from([1, 4, 8]),
       st.booleans(), st.booleans(), st.integers(0, 1000), st.sampled_from([None, 0.5, -1.0, 0.0]))
@settings(max_examples=40)
def test_attention_equals_explicit_softmax(b, h, q_len, extra, d, with_bias, with_mask, seed, scale):
    k_len = q_len + extra
    q, k, v = _qkv(seed, b, h, q_len, k_len, d)
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(h, q_len, k_len, generator=g, dtype=torch.float64) if with_bias else None
    mask = torch.rand(b, 1, q_len, k_len, generator=g) < 0.7 if with_mask else None  # may leave rows empty
    causal = pe.causal_mask(q_len, k_len)
    ref = _explicit(q, k, v, bias, causal if mask is None else mask & causal, scale)
    out, w = pe.attention(q, k, v, bias=bias, mask=mask, scale=scale, return_weights=True)
    assert torch.allclose(pe.attention(q, k, v, bias=bias, mask=mask, scale=scale), ref, atol=1e-10)
    assert torch.allclose(out, ref, atol=1e-10) and torch.isfinite(w).all()
    assert torch.all(w[..., ~causal] == 0)


def _authors_rule(n):
    def geometric(p):
        return [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]

    p = 2 ** math.floor(math.log2(n))
    return geometric(p) + geometric(2 * p)[0::2][: n - p]


@given(st.integers(1, 300))
def test_alibi_slopes_for_any_head_count(n):
    s = pe.alibi_slopes(n, dtype=torch.float64)
    p = 2 ** math.floor(math.log2(n))
    assert s.shape == (n,) and (s > 0).all() and (s < 1).all()
    assert (s[1:p] < s[: p - 1]).all()  # decreasing within the power-of-two block
    assert torch.allclose(s, torch.tensor(_authors_rule(n), dtype=torch.float64), rtol=1e-12)
    assert len(set(s.tolist())) == n


def _depends_on_distance_only(bias):
    """bias[h, i, j] is constant along diagonals and, on the causal side, a function of the distance i - j."""
    q_len, k_len = bias.shape[-2:]
    same = dict(rtol=1e-12, atol=0)  # vectorised and scalar CPU loops may differ in the last bit
    assert torch.allclose(bias[:, 1:, 1:], bias[:, :-1, :-1], **same)
    rel = pe.relative_positions(q_len, k_len)  # queries are the last q_len key positions
    by_distance, past = bias[:, -1].flip(-1), rel <= 0  # the last query: distances 0 .. k_len - 1
    assert torch.allclose(bias[:, past], by_distance[:, -rel[past]], **same)


@given(st.integers(1, 4), st.integers(1, 40), st.integers(0, 40), st.integers(0, 1000))
def test_biases_depend_on_distance_only(heads, q_len, extra, seed):
    k_len = q_len + extra
    g = torch.Generator().manual_seed(seed)
    r1 = torch.rand(heads, generator=g, dtype=torch.float64) + 0.01
    r2 = torch.rand(heads, generator=g, dtype=torch.float64) * 1.9 + 0.05
    biases = [pe.kerple_power_bias(r1, r2, q_len, k_len), pe.kerple_log_bias(r1, r2, q_len, k_len),
              pe.sandwich_bias(heads, q_len, k_len, dim=16, dtype=torch.float64),
              pe.T5RelativeBias(heads, 8, 20)(q_len, k_len).detach(), pe.alibi_bias(r1, q_len, k_len)]
    for bias in biases:
        assert bias.shape == (heads, q_len, k_len) and torch.isfinite(bias).all()
        _depends_on_distance_only(bias)
    rel = pe.relative_positions(q_len, k_len).abs().double()
    assert torch.allclose(biases[0], -r1[:, None, None] * rel ** r2[:, None, None])
    assert torch.allclose(biases[1], -r1[:, None, None] * torch.log1p(r2[:, None, None] * rel))


@given(st.integers(1, 2), st.integers(1, 3), st.sampled_from([0, 1, 2, 7, 31, 64, 65]), st.integers(1, 40),
       st.booleans(), st.booleans(), st.sampled_from(["elu+1", "relu"]), st.integers(0, 1000))
def test_linear_attention_forms_agree(b, h, n, chunk, causal, normalize, feature, seed):
    q, k, v = _qkv(seed, b, h, n, n, 4)
    kw = dict(causal=causal, normalize=normalize, feature=feature, chunk_size=chunk)
    ref = pe.linear_attention(q, k, v, method="quadratic", **kw)
    w = pe.linear_attention_weights(q, k, causal=causal, feature=feature, normalize=normalize)
    assert ref.shape == (b, h, n, 4) and torch.allclose(w @ v, ref, atol=1e-9)
    for method in ("chunked", "cumsum", "recurrent"):
        assert torch.allclose(pe.linear_attention(q, k, v, method=method, **kw), ref, atol=1e-9), method
    assert torch.allclose(pe.norm_attention(q, k, v, causal, method="quadratic", chunk_size=chunk),
                          pe.norm_attention(q, k, v, causal, chunk_size=chunk), atol=1e-9)


# --------------------------------------------------------------------------- bad arguments

_G = torch.Generator().manual_seed(0)
BAD = [None, True, 0, -1, 3, 2.5, float("nan"), float("inf"), "x", [], [0.5, 0.25], np.ones(2), np.int64(3),
       torch.tensor(2), torch.tensor(0.5), torch.ones(2, dtype=torch.long), torch.ones(2, dtype=torch.bool),
       torch.tensor([float("nan"), 1.0]), torch.zeros(0), torch.ones(2, 3), torch.randn(2, 5, 5),
       torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4).double(), torch.randn(1, 5, 2, 4), torch.randn(1, 2, 0, 4),
       torch.randn(1, 2, 5, 4).bool(), torch.randn(1, 2, 5, 4, device="meta"), torch.randn(3, 2, 5, 5),
       torch.int64, torch.bool, torch.float16, "meta", "chunked", "fold", "log", "naive"]


def _finite_outputs(result):
    items = result if isinstance(result, tuple) else (result,)
    for t in items:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_meta:
            assert torch.isfinite(t).all(), "finite inputs gave a non-finite output"
        elif isinstance(t, float):
            assert math.isfinite(t)


def _no_neginf(t):  # a combined bias holds -inf by design
    return t if t is None or t.dtype == torch.bool else t.masked_fill(t == float("-inf"), 0)


def _bound(name, n_heads=2):
    scheme = pe.position_scheme(name)
    scheme.bind(d_model=8, n_heads=n_heads, n_layers=2)
    return scheme


def _q():
    return torch.randn(1, 2, 5, 4, generator=_G)


CALLS = {  # a valid call, as (function, args, kwargs); the test replaces arguments by bad values
    "attention": (pe.attention, [_q(), _q(), _q()], dict(bias=torch.zeros(2, 5, 5), mask=None, scale=None,
                                                         causal=True, return_weights=False)),
    "combine_bias_and_mask": (lambda *a: _no_neginf(pe.combine_bias_and_mask(*a)),
                              [torch.zeros(2, 5, 5), pe.causal_mask(5), torch.float32], {}),
    "relative_attention": (pe.relative_attention, [_q(), _q(), _q()],
                           dict(slopes=pe.alibi_slopes(2), distance_bias=torch.zeros(2, 5), window=3, scale=None,
                                path="auto", return_weights=False)),
    "attention_entropy": (pe.attention_entropy, [torch.full((3, 4), 0.25)], dict(dim=-1)),
    "log_length_scale": (pe.log_length_scale, [100, 10], {}),
    "alibi_slopes": (pe.alibi_slopes, [4], dict(dtype=torch.float32)),
    "alibi_bias": (pe.alibi_bias, [4, 5, 7], dict(dtype=torch.float32)),
    "kerple_power_bias": (pe.kerple_power_bias, [torch.ones(2), 1.5, 4, 6], {}),
    "kerple_log_bias": (pe.kerple_log_bias, [0.5, torch.ones(2), 4, 6], {}),
    "KerpleBias": (lambda *a, **kw: pe.KerpleBias(*a, **kw)(4, 6), [2, "log"], dict(r1=None, eps=0.01)),
    "sandwich_bias": (pe.sandwich_bias, [2, 4, 6], dict(dim=8, base=100.0, dtype=torch.float32)),
    "sandwich_qk": (pe.sandwich_qk, [_q(), _q(), 0.5, 8], dict(base=100.0)),
    "t5_relative_buckets": (pe.t5_relative_buckets, [pe.relative_positions(4, 6), False, 8, 20], {}),
    "T5RelativeBias": (lambda *a, **kw: pe.T5RelativeBias(*a, **kw)(4, 6), [2, 8, 20], dict(init_std=0.1)),
    "sliding_window_mask": (pe.sliding_window_mask, [4, 6], dict(window=2)),
    "causal_mask": (pe.causal_mask, [4, 6], {}),
    "linear_attention": (pe.linear_attention, [_q(), _q(), _q()],
                         dict(method="chunked", chunk_size=2, eps=1e-6, feature="elu+1")),
    "linear_attention_weights": (pe.linear_attention_weights, [_q(), _q()], dict(eps=1e-6)),
    "rms_norm": (pe.rms_norm, [_q()], dict(eps=1e-6, weight=None, dim=-1)),
    "norm_attention": (pe.norm_attention, [_q(), _q(), _q()], dict(weight=None, method="cumsum")),
    "rope_linear_attention": (pe.rope_linear_attention, [_q(), _q(), _q()], dict(positions=None, base=100.0)),
    "locally_accumulated_attention": (pe.locally_accumulated_attention, [torch.eye(5)], dict(ratios=0.5)),
    "gradient_relative_std": (pe.gradient_relative_std, [[1.0, 2.0]], {}),
    "diag_attention": (pe.diag_attention, [_q(), _q(), _q()], dict(block_size=2, kind="softmax", eps=1e-6)),
    "block_diagonal_mask": (pe.block_diagonal_mask, [5, 2], {}),
    "attention_layer": (lambda kind, *a, **kw: pe.attention_layer(kind, *a, **kw)(torch.randn(1, 5, 8)),
                        ["softmax", 8, 2], dict(dropout=0.0)),
    "scheme_distance_bias": (lambda name, length, dtype, **kw: _bound(name, **kw).distance_bias(
        length, device=torch.device("cpu"), dtype=dtype), ["sandwich", 6, torch.float32], dict(n_heads=2)),
    "Sandwich": (lambda *a, **kw: pe.Sandwich(*a, **kw), [8, 100.0], {}),
    "Kerple": (lambda *a: pe.Kerple(*a), ["log"], {}),
    "T5Bias": (lambda *a: pe.T5Bias(*a), [8, 20], {}),
    "layer_options": (lambda *a, **kw: pe.attention_layer(*a, **kw)(torch.randn(1, 5, 8)), ["linear", 8, 2],
                      dict(causal=True, rope=False, bias=False, eps=1e-6, chunk_size=2)),
    "layer_positions": (lambda *a, **kw: pe.SoftmaxAttention(8, 2)(torch.randn(1, 5, 8), pe.Positions(*a, **kw)),
                        [None], dict(slopes=None, table=None, window=None, q_scale=None)),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_valid_calls_work(name):
    fn, args, kwargs = CALLS[name]
    _finite_outputs(fn(*args, **kwargs))


@pytest.mark.parametrize("name", sorted(CALLS))
@given(data=st.data())
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_bad_arguments_raise_value_or_type_errors(name, data):
    fn, args, kwargs = CALLS[name]
    args, kwargs = list(args), dict(kwargs)
    slots = [("a", i) for i in range(len(args))] + [("k", key) for key in kwargs]
    for kind, key in data.draw(st.lists(st.sampled_from(slots), min_size=1, max_size=2, unique=True)):
        value = data.draw(st.sampled_from(BAD))
        if kind == "a":
            args[key] = value
        else:
            kwargs[key] = value
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = fn(*args, **kwargs)
    except (ValueError, TypeError):
        return
    inputs = [*args, *kwargs.values()]
    if all(torch.isfinite(t).all() for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()
           and not t.is_meta):
        _finite_outputs(result)


@pytest.mark.parametrize("call", [
    lambda: pe.relative_attention(_q(), _q(), _q(), slopes=[0.5, float("nan")]),
    lambda: pe.relative_attention(_q(), _q(), _q(), slopes=[0.5, float("inf")], path="fold"),
    lambda: pe.relative_attention(_q(), _q(), _q(), scale=float("nan")),
    lambda: pe.attention(_q(), _q(), _q(), scale=float("inf")),
    lambda: pe.alibi_bias([0.5, float("nan")], 4),
    lambda: pe.kerple_power_bias(float("nan"), 1.0, 4),
    lambda: pe.kerple_log_bias(1.0, torch.tensor([float("inf")], requires_grad=True), 4),
    lambda: pe.KerpleBias(2, r2=float("nan")),
    lambda: pe.sandwich_qk(_q(), _q(), float("nan")),
    lambda: pe.sandwich_bias(2, 4, base=float("inf")),
    lambda: pe.Sandwich(base=float("nan")),
    lambda: pe.T5RelativeBias(2, init_std=float("inf")),
    lambda: pe.sliding_window_mask(4, window=float("nan")),
    lambda: pe.causal_mask(float("nan")),
    lambda: pe.log_length_scale(float("inf"), 8),
    lambda: pe.linear_attention(_q(), _q(), _q(), eps=float("nan")),
    lambda: pe.SoftmaxAttention(8, 2, dropout=float("nan")),
    lambda: pe.SoftmaxAttention(8, 2, rope=True, rope_base=float("inf")),
])
def test_non_finite_parameters_raise_value_errors(call):
    with pytest.raises(ValueError, match="finite|must be|integer|needs"):
        call()


# --- Memory layouts: a user's own projections give q, k, v of any strides ------------------------------------------

LAYOUTS = ("contiguous", "column_major", "bshd", "expanded", "strided_seq", "strided_dim", "offset")


def _laid_out(t, layout):
    """``t`` (or, for "expanded", its first batch and head broadcast) in the memory layout ``layout``."""
    b, h, n, d = t.shape
    if layout == "column_major":  # the last two dims in column-major order
        return t.transpose(-2, -1).contiguous().transpose(-2, -1)
    if layout == "bshd":  # (batch, seq, heads, dim) memory viewed as (batch, heads, seq, dim)
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "expanded":  # stride 0 along batch and heads
        return t[:1, :1].expand(b, h, n, d)
    if layout == "strided_seq":  # every other row of a larger tensor
        big = t.new_zeros(b, h, 2 * n, d)
        big[:, :, ::2] = t
        return big[:, :, ::2]
    if layout == "strided_dim":  # every other channel of a larger tensor
        big = t.new_zeros(b, h, n, 2 * d)
        big[..., ::2] = t
        return big[..., ::2]
    if layout == "offset":  # a slice that starts inside its storage
        big = t.new_zeros(b, h, n, d + 3)
        big[..., 1:d + 1] = t
        return big[..., 1:d + 1]
    return t


def _relative_reference(q, k, v, scale=None, slopes=None, distance_bias=None, window=None):
    """The formula of relative_attention, explicitly: -m (i - j) + b(i - j) on 0 <= i - j < window, in float64."""
    q_len, k_len = q.shape[2], k.shape[2]
    dist = torch.arange(q_len)[:, None] + (k_len - q_len) - torch.arange(k_len)  # i - j, queries at the last keys
    allowed = (dist >= 0) & (dist < (window if window is not None else k_len + 1))
    bias = torch.zeros(q.shape[1], q_len, k_len, dtype=torch.float64)
    if slopes is not None:
        bias = bias - slopes.double()[:, None, None] * dist.clamp(min=0)
    if distance_bias is not None:
        bias = bias + distance_bias.double()[:, dist.clamp(min=0)]
    return _explicit(q, k, v, bias=bias, mask=allowed, scale=scale)


@given(relative_case(), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS))
@settings(max_examples=40, deadline=None)
def test_every_path_takes_any_memory_layout(case, lq, lk, lv):
    """q, k, v column-major, transposed, expanded, sliced: every path equals the formula (none assumes strides)."""
    kw = dict(case["kw"])
    if case["q_len"] == case["k_len"] and case["h"] > 1 and case["seed"] % 2:
        kw = dict(slopes=kw.get("slopes", torch.linspace(0.1, 1, case["h"], dtype=torch.float64)))  # ALiBi only
    q, k, v = _qkv(case["seed"], case["b"], case["h"], case["q_len"], case["k_len"], case["d"])
    q, k, v = _laid_out(q, lq), _laid_out(k, lk), _laid_out(v, lv)
    ref = _relative_reference(q, k, v, scale=case["scale"], **kw)
    alibi_only = set(kw) == {"slopes"} and case["q_len"] == case["k_len"]
    paths = ["naive", "chunked", "bias", "auto"] + (["flex"] if case["k_len"] <= 64 else []) \
        + (["fold"] + (["key_bias"] if key_bias_available() else []) if alibi_only else [])
    for path in paths:
        out = _run(path, q, k, v, scale=case["scale"], **kw)
        assert out.shape == ref.shape and torch.allclose(out, ref, atol=1e-10), \
            (path, lq, lk, lv, (out - ref).abs().max().item())


@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from([1, 2, 5]),
       st.integers(1, 3), st.booleans(), st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
@pytest.mark.skipif(not key_bias_available(), reason="this torch's CPU flash kernel takes no mask with the causal flag")
def test_key_bias_takes_any_memory_layout(lq, lk, lv, d, heads, longer, seed):
    """ALiBi's bias per key on the CPU flash kernel, whose rows must be dense: any layout of q, k, v gives the formula."""
    q, k, v = (_laid_out(t, lay) for t, lay in zip(_qkv(seed, 1, heads, 5 + 3 * longer, 5 + 3 * longer, d),
                                                   (lq, lk, lv)))
    slopes = torch.linspace(0.25, 1.0, heads, dtype=torch.float64)
    ref = _relative_reference(q, k, v, slopes=slopes)
    for path in ("key_bias", "fold"):
        out = _run(path, q, k, v, slopes=slopes)
        assert torch.allclose(out, ref, atol=1e-10), (path, lq, lk, lv, (out - ref).abs().max().item())


@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.booleans(), st.integers(0, 99))
@settings(max_examples=25, deadline=None)
def test_attention_takes_any_memory_layout(lq, lk, lv, with_bias, seed):
    q, k, v = (_laid_out(t, lay) for t, lay in zip(_qkv(seed, 2, 3, 6, 6, 4), (lq, lk, lv)))
    bias = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) if with_bias \
        else None
    ref = _explicit(q, k, v, bias=bias, mask=pe.causal_mask(6, 6))
    assert torch.allclose(pe.attention(q, k, v, bias=bias), ref, atol=1e-10)
    assert torch.allclose(pe.attention(q, k, v, bias=bias, return_weights=True)[0], ref, atol=1e-10)
