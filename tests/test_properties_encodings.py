"""Property-based tests (hypothesis) of RoPE, xPos and the sinusoidal encoding.

Identities from the papers over random shapes, dtypes, lengths (1 included), large
offsets, bases and parameters, checked against float64 references; and random
arguments, good and bad, for every public function and class of the three
modules: a call either returns finite values of the right shape and dtype or
raises ``ValueError`` (``TypeError`` only for a wrong kind of object).
"""

import math
from numbers import Real

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import posenc as pe

seeds = st.integers(0, 2**32 - 1)
halves = st.integers(1, 8)  # head_dim = 2 * half
bases = st.one_of(st.floats(1.01, 1e6), st.sampled_from([10000.0, 500000.0, 2]))
lengths = st.integers(1, 9)
offsets = st.one_of(st.just(0), st.integers(0, 10**6))
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def randn(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def pair_sums(prod, interleaved):
    """Sum each channel pair of ``prod (..., d)``: ``(..., d/2)``."""
    if interleaved:
        return prod[..., 0::2] + prod[..., 1::2]
    half = prod.shape[-1] // 2
    return prod[..., :half] + prod[..., half:]


# --------------------------------------------------------------------------- identities


@given(seeds, halves, bases, lengths, offsets, st.integers(-10**6, 10**6), st.booleans())
def test_rope_preserves_norms_and_scores_depend_on_the_offset_only(seed, half, base, n, offset, shift, il):
    d = 2 * half
    q, k = randn(seed, 2, n, d)
    pos = torch.arange(n, dtype=torch.float64) * 3 + offset
    rq, rk = pe.apply_rope(q, pos, base, il), pe.apply_rope(k, pos, base, il)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-12, atol=1e-12)
    scores = rq @ rk.T
    size = q.norm(dim=-1)[:, None] * k.norm(dim=-1)[None, :]
    shifted = pe.apply_rope(q, pos + shift, base, il) @ pe.apply_rope(k, pos + shift, base, il).T
    assert ((shifted - scores).abs() <= 1e-8 * size + 1e-12).all()
    # <R_m q, R_n k> = <q, R_{n-m} k>
    rel = pe.apply_rope(k[None].expand(n, n, d), pos[None, :] - pos[:, None], base, il)  # (m, n, d)
    assert (((q[:, None, :] * rel).sum(-1) - scores).abs() <= 1e-8 * size + 1e-12).all()


@given(seeds, st.integers(1, 3), st.integers(1, 3), st.integers(0, 6), st.integers(0, 6), halves, bases,
       st.booleans(), st.sampled_from(FLOATS))
def test_apply_rope_equals_module_equals_scheme(seed, batch, heads, q_len, extra, half, base, il, dtype):
    d, k_len = 2 * half, q_len + extra
    q, k = randn(seed, 2, batch, heads, k_len, d, dtype=dtype)
    q = q[..., extra:, :]
    rope = pe.RotaryEmbedding(d, base, interleaved=il)
    rope.cos_sin(k_len + 5, dtype=dtype)  # a longer cached table is cut, not recomputed
    rq, rk = rope(q, k)
    assert rq.dtype == rk.dtype == dtype and rq.shape == q.shape and rk.shape == k.shape
    assert torch.equal(rq, pe.apply_rope(q, torch.arange(extra, k_len), base, il))
    assert torch.equal(rk, pe.apply_rope(k, None, base, il))
    scheme = pe.RoPE(base, interleaved=il)
    scheme.bind(d_model=heads * d, n_heads=heads, n_layers=1)
    both = scheme.rotate(torch.stack((k, k)))
    assert torch.equal(both[0], rk) and torch.equal(both[1], rk)


def _documented_positions_shape(pos_shape, x_shape):
    """The positions rule of posenc.rope, written out: the broadcast shape, or None for a ValueError."""
    batch, seq = x_shape[:-2], x_shape[-2]
    if not pos_shape or pos_shape[-1] != seq:
        return None
    shape = (pos_shape[0], 1, seq) if len(pos_shape) == 2 and len(batch) == 2 else pos_shape
    if len(shape) > len(batch) + 1:
        return None
    if any(p not in (1, s) for p, s in zip(shape[:-1], batch[len(batch) + 1 - len(shape):])):
        return None
    return shape


@given(seeds, st.lists(st.integers(1, 3), min_size=0, max_size=3), st.integers(1, 4),
       st.lists(st.sampled_from(["x0", "x1", "x2", 1, 2, 3, "seq"]), min_size=0, max_size=5), st.booleans())
@example(0, [2, 2], 3, ["x0", "seq"], False)  # (batch, seq) positions with batch == heads
@example(0, [2, 3], 2, ["x1", "seq"], True)  # (heads, seq) is not per head: it raises (batch is 2)
def test_positions_follow_the_documented_rule(seed, batch, seq, pos_dims, il):
    """Each dimension of the positions is one of x's batch sizes ("x0" .. "x2"), 1, 2, 3 or seq."""
    x_shape = (*batch, seq, 4)
    sizes = {f"x{i}": size for i, size in enumerate(batch)}
    pos_shape = tuple(seq if p == "seq" else sizes.get(p, 1) if isinstance(p, str) else p for p in pos_dims)
    x = randn(seed, *x_shape)
    pos = torch.randint(0, 1000, pos_shape, generator=torch.Generator().manual_seed(seed)) if pos_shape \
        else torch.tensor(5)
    shape = _documented_positions_shape(pos_shape, x_shape)
    calls = [lambda: pe.apply_rope(x, pos, interleaved=il),
             lambda: pe.RotaryEmbedding(4, interleaved=il)(x, x, pos)[0],
             lambda: pe.apply_xpos(x, x, pos, interleaved=il, scale_base=4096)[1],
             lambda: pe.SinusoidalPositionalEmbedding(4)(x, pos) - x]
    for index, call in enumerate(calls):
        if shape is None:
            with pytest.raises(ValueError, match="positions"):
                call()
            continue
        out = call()
        assert out.shape == x.shape
        rows = pos.reshape(shape).expand(*x_shape[:-1]).reshape(-1, seq)
        flat_x, flat_out = x.reshape(-1, seq, 4), out.reshape(-1, seq, 4)
        for row in range(rows.shape[0]):
            if index == 3:
                want = pe.sinusoidal_embedding(rows[row], 4, dtype=torch.float64)
            elif index == 2:
                want = pe.apply_xpos(flat_x[row], flat_x[row], rows[row], interleaved=il, scale_base=4096)[1]
            else:
                want = pe.apply_rope(flat_x[row], rows[row], interleaved=il)
            assert torch.allclose(flat_out[row], want, atol=1e-9)


@given(seeds, st.lists(st.integers(0, 3), min_size=0, max_size=3), halves,
       st.sampled_from(FLOATS + [torch.int64, torch.bool]))
def test_half_split_and_interleaved_round_trip(seed, lead, half, dtype):
    x = (randn(seed, *lead, 2 * half) * 10).to(dtype)
    for there, back in ((pe.interleaved_to_half_split, pe.half_split_to_interleaved),
                        (pe.half_split_to_interleaved, pe.interleaved_to_half_split)):
        y = there(x)
        assert y.shape == x.shape and y.dtype == dtype and torch.equal(back(y), x)


@given(seeds, halves, lengths, bases)
def test_converted_weights_give_the_same_scores(seed, half, n, base):
    q, k = randn(seed, 2, n, 2 * half)
    inter = pe.apply_rope(q, None, base, True) @ pe.apply_rope(k, None, base, True).T
    to_half = pe.interleaved_to_half_split
    split = pe.apply_rope(to_half(q), None, base) @ pe.apply_rope(to_half(k), None, base).T
    assert torch.allclose(inter, split, atol=1e-10)


@given(seeds, halves, lengths, st.integers(0, 8), offsets, bases, st.floats(0.05, 5.0),
       st.one_of(st.floats(4.0, 4096.0), st.just(math.inf)), st.booleans(), st.booleans())
def test_xpos_score_is_rope_pair_score_times_zeta_power(seed, half, q_len, extra, offset, base, gamma,
                                                         scale_base, centered, il):
    d, k_len = 2 * half, q_len + extra
    q, k = randn(seed, 2, 2, k_len, d)
    q = q[..., extra:, :]
    # uncentred factors zeta^(-n/B) of far positions leave float64 (documented): keep those offsets small
    pos = torch.arange(k_len, dtype=torch.float64) + (offset if centered else offset % 64)
    qx, kx = pe.apply_xpos(q, k, pos, base=base, gamma=gamma, scale_base=scale_base, interleaved=il,
                           centered=centered)
    qr, kr = pe.apply_rope(q, pos[extra:], base, il), pe.apply_rope(k, pos, base, il)
    pairs = pair_sums(qr[..., :, None, :] * kr[..., None, :, :], il)  # (2, q_len, k_len, d/2)
    delta = pos[extra:, None] - pos[None, :]  # m - n
    factor = pe.xpos_zeta(d, gamma) ** (delta[..., None] / scale_base)
    expected = (pairs * factor).sum(-1)
    size = (pairs.abs() * factor).sum(-1)
    assert ((qx @ kx.transpose(-2, -1) - expected).abs() <= 1e-9 * size + 1e-300).all()
    module = pe.XPos(d, base, gamma, scale_base, il, centered)(q, k, pos)
    assert torch.allclose(module[0], qx, rtol=1e-12, atol=0) and torch.allclose(module[1], kx, rtol=1e-12, atol=0)


@given(seeds, halves, st.lists(st.floats(-1e5, 1e5), min_size=1, max_size=6), offsets, bases)
def test_sinusoidal_dot_product_depends_on_the_offset_only(seed, half, pos, offset, base):
    d = 2 * half
    m = torch.tensor(pos, dtype=torch.float64) + offset
    p = pe.sinusoidal_embedding(m, d, base, dtype=torch.float64)
    assert torch.allclose(p @ p.T, pe.sinusoidal_similarity(m[:, None] - m[None, :], d, base), atol=1e-7)
    assert torch.allclose(p.norm(dim=-1), torch.full((len(pos),), math.sqrt(d / 2), dtype=torch.float64))


@given(seeds, halves, lengths, offsets, st.sampled_from(FLOATS), st.floats(-4, 4))
def test_sinusoidal_module_adds_the_float64_table(seed, half, n, offset, dtype, scale):
    d = 2 * half
    x = randn(seed, 2, n, d, dtype=dtype)
    pos = torch.arange(n) + offset
    out = pe.SinusoidalPositionalEmbedding(d, scale=scale)(x, pos)
    want = x.double() + scale * pe.sinusoidal_embedding(pos, d, dtype=torch.float64)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.allclose(out.double(), want, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6,
                          atol=5e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6)


# --------------------------------------------------------------------------- random arguments

NAN = float("nan")
BAD_NUMBERS = [NAN, math.inf, -math.inf, 0, -1.0, 0.5, 1, True, False, "3", None, np.float32("nan"),
               torch.tensor(NAN), torch.tensor([2.0, 3.0]), torch.tensor(True), 1 + 2j]


def _real(value):
    """The float an argument stands for, or None when it is no real number (the documented kinds)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return None
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real):
        return None
    return float(value)


def number(low, high, *, closed=False, inf_ok=False):
    """(strategy, check): numbers, mostly in [low, high], plus BAD_NUMBERS; check says which are valid."""
    def check(value):
        v = _real(value)
        return v is not None and (v >= low if closed else v > low) and (math.isfinite(v) or (inf_ok and v == math.inf))
    good = st.floats(low if closed else low + 1e-6, high)
    return st.one_of(good, good.map(np.float64), st.sampled_from(BAD_NUMBERS)), check


def even_dim(low=2):
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low and v % 2 == 0  # noqa: E731
    return st.one_of(st.sampled_from([2, 4, 8, 16]), st.sampled_from([0, 1, 3, -2, 8.0, True, "8", None])), ok


def dtype_arg():
    return (st.sampled_from(FLOATS + [torch.int64, torch.bool, torch.complex64, "float32", None]),
            lambda v: isinstance(v, torch.dtype) and v.is_floating_point)


POSITIONS = {"good": lambda n: torch.arange(n) * 7 + 1000, "float": lambda n: torch.linspace(-5, 300, n),
             "nan": lambda n: torch.full((n,), NAN), "inf": lambda n: torch.full((n,), math.inf),
             "bool": lambda n: torch.ones(n, dtype=torch.bool), "numpy": lambda n: np.arange(n),
             "short": lambda n: torch.arange(n + 1), "scalar": lambda n: torch.tensor(3.0)}
POSITIONS_OK = {"good", "float", "numpy", "short", "scalar"}  # values fine (shapes aside)
INPUTS = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int64": torch.int64, "bool": torch.bool}


def _tensor(kind, shape, seed):
    return (randn(seed, *shape) * 0.5).clamp(-1, 1).to(INPUTS[kind])


def _finite_outputs(out, dtype=None, shape=None):
    items = out if isinstance(out, tuple) else (out,)
    for item in items:
        if isinstance(item, torch.Tensor):
            assert bool(torch.isfinite(item.double()).all()) if item.is_floating_point() else True
            assert dtype is None or item.dtype == dtype
            assert shape is None or item.shape == shape
        else:
            assert math.isfinite(item)


CASES = {
    # name: (call(args) -> output, {argument: (strategy, check)}[, a ValueError valid arguments may still
    # raise: xPos factors too extreme for the dtype, the message says "range"])
    "rope_frequencies": (lambda a: pe.rope_frequencies(a["dim"], a["base"]),
                         {"dim": even_dim(), "base": number(1, 1e6)}),
    "rope_cos_sin": (lambda a: pe.rope_cos_sin(torch.arange(5), a["dim"], a["base"], dtype=a["dtype"]),
                     {"dim": even_dim(), "base": number(1, 1e6), "dtype": dtype_arg()}),
    "rope_rotation_matrix": (lambda a: pe.rope_rotation_matrix(a["position"], a["dim"], a["base"]),
                             {"position": number(-1e6, 1e6), "dim": even_dim(), "base": number(1, 1e6)}),
    "interpolated": (lambda a: pe.rope_frequencies_interpolated(a["dim"], a["base"], a["scale"]),
                     {"dim": even_dim(), "base": number(1, 1e6), "scale": number(1, 64, closed=True)}),
    "ntk": (lambda a: pe.rope_frequencies_ntk(a["dim"], a["base"], a["scale"]),
            {"dim": even_dim(4), "base": number(1, 1e6), "scale": number(1, 64, closed=True)}),
    "yarn": (lambda a: pe.rope_frequencies_yarn(a["dim"], a["base"], a["scale"], 512, a["fast"], 1.0),
             {"dim": even_dim(), "base": number(1, 1e6), "scale": number(1, 64, closed=True),
              "fast": number(1, 64)}),
    "yarn_attention_factor": (lambda a: pe.yarn_attention_factor(a["scale"]), {"scale": number(0, 64)}),
    "rope_decay_bound": (lambda a: pe.rope_decay_bound(torch.arange(6), a["dim"], a["base"]),
                         {"dim": even_dim(), "base": number(1, 1e6)}),
    "RotaryEmbedding": (lambda a: pe.RotaryEmbedding(a["dim"], a["base"], attention_factor=a["factor"])(
        torch.randn(1, 3, a["dim"]), torch.randn(1, 3, a["dim"])),
        {"dim": even_dim(), "base": number(1, 1e6), "factor": number(0, 4)}),
    "RoPE": (lambda a: pe.RoPE(a["base"]), {"base": number(1, 1e6)}),
    "xpos_zeta": (lambda a: pe.xpos_zeta(a["dim"], a["gamma"]), {"dim": even_dim(), "gamma": number(0, 10)}),
    "xpos_scales": (lambda a: pe.xpos_scales(torch.arange(9), a["dim"], a["gamma"], a["scale_base"],
                                             center=a["center"]),
                    {"dim": even_dim(), "gamma": number(0, 10), "scale_base": number(0, 1e4, inf_ok=True),
                     "center": number(-1e6, 1e6)}, "range"),
    "apply_xpos": (lambda a: pe.apply_xpos(torch.rand(1, 3, 4) - 0.5, torch.rand(1, 5, 4) - 0.5,
                                           base=a["base"], gamma=a["gamma"], scale_base=a["scale_base"]),
                   {"base": number(1, 1e6), "gamma": number(0, 10), "scale_base": number(0, 1e4, inf_ok=True)},
                   "range"),
    "XPos": (lambda a: pe.XPos(a["dim"], a["base"], a["gamma"], a["scale_base"])(
        torch.rand(1, 3, a["dim"]) - 0.5, torch.rand(1, 5, a["dim"]) - 0.5),
        {"dim": even_dim(), "base": number(1, 1e6), "gamma": number(0, 10),
         "scale_base": number(0, 1e4, inf_ok=True)}, "range"),
    "XPosRotation": (lambda a: pe.XPosRotation(a["base"], scale_base=a["scale_base"], gamma=a["gamma"]),
                     {"base": number(1, 1e6), "gamma": number(0, 10), "scale_base": number(0, 1e4, inf_ok=True)}),
    "sinusoidal_embedding": (lambda a: pe.sinusoidal_embedding(4, a["dim"], a["base"], dtype=a["dtype"]),
                             {"dim": even_dim(), "base": number(1, 1e6), "dtype": dtype_arg()}),
    "sinusoidal_shift_matrix": (lambda a: pe.sinusoidal_shift_matrix(a["shift"], a["dim"], a["base"]),
                                {"shift": number(-1e6, 1e6), "dim": even_dim(), "base": number(1, 1e6)}),
    "SinusoidalPositionalEmbedding": (lambda a: pe.SinusoidalPositionalEmbedding(a["dim"], a["base"],
                                                                                 scale=a["scale"])(
        torch.zeros(2, 3, a["dim"])), {"dim": even_dim(), "base": number(1, 1e6), "scale": number(-4, 4)}),
    "SinusoidalPositions": (lambda a: pe.SinusoidalPositions(a["base"]), {"base": number(1, 1e6)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=40)
@given(data=st.data())
def test_random_parameters_give_finite_values_or_value_error(name, data):
    call, arguments, *allowed = CASES[name]
    args = {key: data.draw(strategy, label=key) for key, (strategy, _) in arguments.items()}
    valid = all(check(args[key]) for key, (_, check) in arguments.items())
    if not valid:
        with pytest.raises(ValueError):
            call(args)
        return
    try:
        out = call(args)
    except ValueError as err:
        assert allowed and allowed[0] in str(err), err
        return
    if not isinstance(out, torch.nn.Module):
        _finite_outputs(out)


@settings(max_examples=80)
@given(seeds, st.sampled_from(sorted(INPUTS)), st.sampled_from(sorted(INPUTS)), st.sampled_from(sorted(POSITIONS)),
       st.sampled_from([None, "dims"]), st.integers(0, 5), st.integers(0, 3))
def test_random_tensors_give_finite_values_or_value_error(seed, q_kind, k_kind, pos_kind, pos_use, k_len, extra):
    q_len = max(k_len - extra, 0)
    q, k = _tensor(q_kind, (2, 2, q_len, 4), seed), _tensor(k_kind, (2, 2, k_len, 4), seed + 1)
    pos = POSITIONS[pos_kind](k_len) if pos_use else None
    # values: NaN / inf entries and booleans are refused (an empty tensor holds no NaN);
    # shape: the rotations and the module need (..., k_len), the table functions take any shape
    values_ok = pos is None or pos_kind in POSITIONS_OK or (k_len == 0 and pos_kind in ("nan", "inf"))
    shape_ok = pos is None or pos_kind not in ("short", "scalar")
    floats = q.is_floating_point() and k.is_floating_point()
    calls = {  # name: (call, inputs fine, needs positions, dtype of the output)
        "apply_rope": (lambda: pe.apply_rope(k, pos), k.is_floating_point(), False, k.dtype),
        "RotaryEmbedding": (lambda: pe.RotaryEmbedding(4)(q, k, pos), floats, False, None),
        "apply_xpos": (lambda: pe.apply_xpos(q, k, pos), floats, False, None),
        "XPos": (lambda: pe.XPos(4)(q, k, pos), floats, False, None),
        "SinusoidalPositionalEmbedding": (lambda: pe.SinusoidalPositionalEmbedding(4)(k, pos),
                                          k.is_floating_point(), False, k.dtype),
        "rope_cos_sin": (lambda: pe.rope_cos_sin(pos, 4), True, True, None),
        "sinusoidal_embedding": (lambda: pe.sinusoidal_embedding(pos, 4), True, True, None),
    }
    for name, (call, inputs_ok, needs_positions, dtype) in calls.items():
        if needs_positions and pos is None:
            continue
        if inputs_ok and values_ok and (shape_ok or needs_positions):
            _finite_outputs(call(), dtype)
        else:
            with pytest.raises(ValueError):
                call()


@pytest.mark.parametrize("call", [
    lambda bad: pe.apply_rope(bad), lambda bad: pe.apply_rope(torch.randn(3, 4), bad),
    lambda bad: pe.apply_xpos(bad, torch.randn(3, 4)), lambda bad: pe.XPos(4)(torch.randn(3, 4), bad),
    lambda bad: pe.RotaryEmbedding(4)(bad, bad), lambda bad: pe.SinusoidalPositionalEmbedding(4)(bad),
    lambda bad: pe.interleaved_to_half_split(bad), lambda bad: pe.rope_cos_sin(bad, 4),
])
@pytest.mark.parametrize("bad", [object(), "abc", {"a": 1}])
def test_wrong_kinds_of_object_raise_type_error(call, bad):
    with pytest.raises(TypeError, match="must be a"):
        call(bad)
