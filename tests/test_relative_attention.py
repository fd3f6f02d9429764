"""Tests for posenc.relative_attention: every path equals the explicit reference."""

import math
import sys
import warnings

import numpy as np
import pytest
import torch

import posenc as pe
from posenc._fused_alibi import key_bias_available
from posenc.attention import _pick_path

H, D = 4, 16
PATHS = ["fold", "chunked", "flex", "bias", "auto"] + (["key_bias"] if key_bias_available() else [])


def qkv(q_len, k_len=None, batch=2, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    k_len = q_len if k_len is None else k_len
    q = torch.randn(batch, H, q_len, D, generator=g, dtype=dtype)
    k = torch.randn(batch, H, k_len, D, generator=g, dtype=dtype)
    v = torch.randn(batch, H, k_len, D, generator=g, dtype=dtype)
    return q, k, v


def biases(k_len, dtype=torch.float64):
    table = -torch.rand(H, k_len, generator=torch.Generator().manual_seed(1), dtype=dtype).cumsum(-1)
    slopes = pe.alibi_slopes(H, dtype=dtype)
    return {"alibi": dict(slopes=slopes), "table": dict(distance_bias=table), "window": dict(window=37),
            "all three": dict(slopes=slopes, distance_bias=table, window=50)}


def run(path, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is not compiled
        return pe.relative_attention(*args, path=path, **kw)


@pytest.mark.parametrize("q_len,k_len", [(16, 16), (300, 300), (600, 600), (100, 300), (1, 40)])
@pytest.mark.parametrize("kind", ["alibi", "table", "window", "all three"])
def test_every_path_equals_the_reference(q_len, k_len, kind):
    q, k, v = qkv(q_len, k_len)
    kw = biases(k_len)[kind]
    ref = run("naive", q, k, v, **kw)
    for path in PATHS:
        if path in ("fold", "key_bias") and (kind != "alibi" or q_len != k_len):
            with pytest.raises(ValueError, match=path):
                run(path, q, k, v, **kw)
            continue
        if path == "flex" and q_len > 300:
            continue  # eager FlexAttention on CPU is the slow reference; one size is enough
        out = run(path, q, k, v, **kw)
        assert out.shape == (2, H, q_len, D)
        assert torch.allclose(out, ref, atol=1e-12), (path, (out - ref).abs().max().item())


def test_reference_is_attention_with_the_full_bias():
    """The naive path adds exactly -m (i - j) + b(i - j) on allowed pairs, as pe.attention with the matrix."""
    q, k, v = qkv(40, 70)
    slopes = pe.alibi_slopes(H, dtype=torch.float64)
    table = torch.randn(H, 70, dtype=torch.float64)
    dist = -pe.relative_positions(40, 70)  # i - j, queries are the last 40 positions
    full = pe.alibi_bias(slopes, 40, 70) + table[:, dist.clamp(min=0)]
    mask = (dist >= 0) & (dist < 9)
    out, w = pe.relative_attention(q, k, v, slopes=slopes, distance_bias=table, window=9, return_weights=True)
    ref, w_ref = pe.attention(q, k, v, bias=full, mask=mask, causal=False, return_weights=True)
    assert torch.allclose(w, w_ref, atol=1e-14) and torch.allclose(out, ref, atol=1e-14)
    assert (w[..., ~mask] == 0).all()


def test_no_bias_is_plain_causal_attention():
    q, k, v = qkv(50)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(pe.relative_attention(q, k, v), ref, atol=1e-14)


def test_fold_in_float32_error_is_bounded():
    """Folding ALiBi into a channel rounds logits of size ~ m n; the error stays near m n 2^-24."""
    n = 2048
    q, k, v = qkv(n, batch=1, dtype=torch.float32)
    slopes = pe.alibi_slopes(H)
    ref = run("naive", q.double(), k.double(), v.double(), slopes=slopes.double())
    fold = run("fold", q, k, v, slopes=slopes)
    err = (fold.double() - ref).abs().max().item()
    bound = 8 * slopes.max().item() * n * 2.0 ** -24
    assert err < bound, (err, bound)
    assert err > 0  # it is float32: not exact


@pytest.mark.parametrize("path", ["key_bias", "fold", "chunked"])
def test_gradients_match_the_reference(path):
    n = 300
    q, k, v = (t.requires_grad_() for t in qkv(n, batch=1))
    table = biases(n)["table"]["distance_bias"].clone().requires_grad_()
    kw = dict(distance_bias=table) if path == "chunked" else dict(slopes=pe.alibi_slopes(H, dtype=torch.float64))
    grads = []
    for p in (path, "naive"):
        out = run(p, q, k, v, **kw)
        inputs = (q, k, v) + ((table,) if path == "chunked" else ())
        grads.append(torch.autograd.grad((out * torch.cos(out)).sum(), inputs))
    for fast, ref in zip(*grads):
        assert torch.allclose(fast, ref, atol=1e-10)


def test_causal_output_ignores_later_tokens():
    q, k, v = qkv(400)
    kw = biases(400)["table"]
    out = run("chunked", q, k, v, **kw)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 200:] += 5
    v2[:, :, 200:] -= 3
    out2 = run("chunked", q, k2, v2, **kw)
    assert torch.equal(out[:, :, :200], out2[:, :, :200])
    assert not torch.allclose(out[:, :, 200:], out2[:, :, 200:])


@pytest.mark.parametrize("key_bias", [True, False], ids=["key-bias-kernel", "older-torch"])
def test_auto_path_choice(key_bias, monkeypatch):
    """The fixed rule: ALiBi per key where the CPU kernel takes it, else the fold for long, wide heads, else chunks."""
    monkeypatch.setattr(sys.modules["posenc.attention"], "key_bias_available", lambda: key_bias)
    q = k = torch.empty(1, H, 4096, 64)  # long and wide enough for the fold (only shapes and dtype matter)
    slopes, table = pe.alibi_slopes(H), torch.zeros(H, 4096)
    alibi = "key_bias" if key_bias else "fold"
    assert _pick_path(q, k, slopes, None, None) == alibi
    assert _pick_path(q.bfloat16(), k.bfloat16(), slopes, None, None) == "chunked"  # both need float32/64
    short = "key_bias" if key_bias else "chunked"  # the fold pays for its extra channel on long, wide heads only
    assert _pick_path(q[..., :32], k[..., :32], slopes, None, None) == short
    assert _pick_path(q[:, :, :2048], k[:, :, :2048], slopes, None, None) == short
    assert _pick_path(q[:, :, :129], k[:, :, :129], slopes, None, None) == short
    assert _pick_path(q[:, :, -1000:], k, slopes, None, None) == "chunked"  # queries after a cache
    assert _pick_path(q, k, slopes, None, 64) == "chunked"
    assert _pick_path(q, k, None, table, None) == "chunked"
    assert _pick_path(q[:, :, :128], k[:, :, :128], None, table, None) == "bias"
    learned = slopes.clone().requires_grad_()  # the kernel gives no gradient for its mask
    assert _pick_path(q, k, learned, None, None) == "fold"
    with torch.no_grad():
        assert _pick_path(q, k, learned, None, None) == alibi


def test_key_bias_float32_error_is_bounded_and_learned_slopes_are_refused():
    """ALiBi per key rounds logits of size ~ m n / 2, as the fold; learned slopes must take another path."""
    n = 2048
    q, k, v = qkv(n, batch=1, dtype=torch.float32)
    slopes = pe.alibi_slopes(H)
    ref = run("naive", q.double(), k.double(), v.double(), slopes=slopes.double())
    err = (run("key_bias", q, k, v, slopes=slopes).double() - ref).abs().max().item()
    assert 0 < err < 8 * slopes.max().item() * n * 2.0 ** -24, err
    learned = slopes.clone().requires_grad_()
    with pytest.raises(ValueError, match="fold"):
        run("key_bias", q, k, v, slopes=learned)
    out = run("auto", q[:, :, :300], k[:, :, :300], v[:, :, :300], slopes=learned)  # another path, with a gradient
    (grad,) = torch.autograd.grad(out.sum() + (out ** 2).sum(), learned)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_key_bias_probe_refuses_a_kernel_that_ignores_the_mask_or_the_arguments(monkeypatch):
    """A torch whose CPU flash kernel drops the mask, or does not take one, never gets the path."""
    from posenc import _fused_alibi

    def plain(q, k, v, dropout, causal, attn_mask=None, scale=None):  # ignores the mask
        return (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),)

    def old(q, k, v, dropout, causal, scale=None):  # no mask argument
        return plain(q, k, v, dropout, causal, scale=scale)

    probe, real = _fused_alibi.key_bias_available.__wrapped__, _fused_alibi._CPU_FLASH
    for fake in (plain, old, None):
        monkeypatch.setattr(_fused_alibi, "_CPU_FLASH", fake)
        assert probe() is False, fake
    monkeypatch.setattr(_fused_alibi, "_CPU_FLASH", real)
    assert probe() is _fused_alibi.key_bias_available()
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4):
        assert _fused_alibi.key_bias_available()  # the CPU flash kernel has taken a mask since torch 2.3


def test_bad_inputs():
    q, k, v = qkv(20)
    with pytest.raises(ValueError, match="slopes"):
        pe.relative_attention(q, k, v, slopes=torch.ones(H + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="distance_bias covers"):
        pe.relative_attention(q, k, v, distance_bias=torch.zeros(H, 10, dtype=torch.float64))
    with pytest.raises(ValueError, match="distance_bias must be"):
        pe.relative_attention(q, k, v, distance_bias=torch.zeros(H, 3, 20))
    with pytest.raises(ValueError, match="window"):
        pe.relative_attention(q, k, v, window=0)
    with pytest.raises(ValueError, match="path must be one of"):
        pe.relative_attention(q, k, v, path="fastest")
    with pytest.raises(ValueError, match="return_weights"):
        pe.relative_attention(q, k, v, window=3, path="chunked", return_weights=True)
    with pytest.raises(ValueError, match="q_len"):
        pe.relative_attention(k[:, :, :5], q[:, :, :3], v[:, :, :3])


def test_paths_are_listed():
    assert set(pe.ATTENTION_PATHS) == {"auto", "key_bias", "fold", "chunked", "flex", "bias", "naive"}


@pytest.mark.parametrize("q_len,k_len,window", [(300, 300, None), (270, 520, 100), (520, 520, 300)])
@pytest.mark.parametrize("small_blocks", [False, True], ids=["256-rows", "16-rows"])
def test_learned_bias_gradients_through_chunks(q_len, k_len, window, small_blocks, monkeypatch):
    """A bias that requires grad (KERPLE, T5, learned slopes) trains through the chunked path's own backward.

    The backward sizes its query chunks by the keys they see; with blocks of 1 number it takes its
    smallest chunks (16 rows), so a chunk boundary falls inside the window and the key ranges shift.
    """
    if small_blocks:
        monkeypatch.setattr(sys.modules["posenc.attention"], "_BACKWARD_BLOCK", 1)
    q, k, v = (t.requires_grad_() for t in qkv(q_len, k_len, batch=2))
    table = biases(k_len)["table"]["distance_bias"].clone().requires_grad_()
    slopes = pe.alibi_slopes(H, dtype=torch.float64).clone().requires_grad_()
    weight = torch.randn(2, H, q_len, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    grads = []
    for path in ("chunked", "naive"):
        out = run(path, q, k, v, slopes=slopes, distance_bias=table, window=window)
        grads.append(torch.autograd.grad((out * weight).sum(), (q, k, v, table, slopes)))
    for name, fast, ref in zip("q k v table slopes".split(), *grads):
        assert torch.allclose(fast, ref, atol=1e-10), (name, (fast - ref).abs().max().item())


# ------------------------------------------------------------------ reliability: precision, edge cases, errors


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 0.05), (torch.float16, 0.006)])
@pytest.mark.parametrize("kind", ["alibi", "table"])
def test_half_precision_every_path_at_1024(dtype, tol, kind):
    """Every explicit path in bfloat16 / float16 stays within rounding of the float64 reference.

    The fold used to add ``m j / scale`` in bfloat16 (errors of 0.2 to 0.5 at n = 1024): it now runs in float32.
    """
    n = 1024
    q, k, v = qkv(n, batch=1)
    kw = biases(n)[kind]
    ref = run("naive", q, k, v, **kw)
    low = {key: t.to(dtype) for key, t in kw.items()}
    for path in ["key_bias", "fold", "chunked", "flex", "bias", "naive", "auto"]:
        if path in ("fold", "key_bias") and kind != "alibi":
            continue
        out = run(path, q.to(dtype), k.to(dtype), v.to(dtype), **low)
        err = (out.double() - ref).abs().max().item()
        assert out.dtype == dtype and err < tol, (path, err)
        if path in ("fold", "key_bias"):  # computed in float32: only the output's rounding is left
            assert err < tol / 2


def _dead_table(k_len, forbidden=3):
    """A table forbidding distances 0 .. forbidden-1: the first `forbidden` queries may attend to no key."""
    table = biases(k_len)["table"]["distance_bias"].clone()
    table[:, :forbidden] = float("-inf")
    return table


@pytest.mark.parametrize("q_len,k_len", [(20, 20), (300, 300), (2, 2)])
def test_a_query_allowed_no_key_gets_zeros_on_every_path(q_len, k_len):
    """One behaviour everywhere: a fully masked row is 0 (output and weights), with finite gradients."""
    q, k, v = (t.requires_grad_() for t in qkv(q_len, k_len))
    table = _dead_table(k_len).requires_grad_()
    dead = min(3, q_len)
    grads = {}
    for path in ["naive", "chunked", "bias", "flex", "auto"]:
        with torch.set_grad_enabled(path != "flex"):  # eager FlexAttention has no backward on the CPU
            out = run(path, q, k, v, distance_bias=table, window=5 if path == "auto" else None)
        assert torch.isfinite(out).all() and (out[:, :, :dead] == 0).all(), path
        if path != "flex":
            grads[path] = torch.autograd.grad((out * out.detach().cos()).sum(), (q, k, v, table))
            assert all(torch.isfinite(g).all() for g in grads[path]), path
    for path in ("chunked", "bias"):
        for fast, ref in zip(grads[path], grads["naive"]):
            assert torch.allclose(fast, ref, atol=1e-10), path
    _, w = pe.relative_attention(q, k, v, distance_bias=table, return_weights=True)
    assert (w[:, :, :dead] == 0).all() and torch.allclose(w[:, :, dead:].sum(-1), torch.ones(()).double())


@pytest.mark.parametrize("path", PATHS + ["naive"])
def test_empty_inputs_give_empty_outputs(path):
    q, k, v = qkv(5)
    slopes = pe.alibi_slopes(H, dtype=torch.float64)
    for args in [(q[:, :, :0], k[:, :, :0], v[:, :, :0]), (q[:0], k[:0], v[:0]), (q, k, v[..., :0])]:
        out = run(path, *args, slopes=slopes)
        assert out.shape == (*args[0].shape[:3], args[2].shape[-1])
    out, w = pe.relative_attention(q[:, :, :0], k, v, return_weights=True)
    assert out.shape == (2, H, 0, D) and w.shape == (2, H, 0, 5)


@pytest.mark.parametrize("path", ["fold", "chunked", "bias", "naive", "auto"])
def test_meta_tensors_give_shapes(path):
    q, k, v = (t.to("meta") for t in qkv(300, batch=1))
    out = run(path, q, k, v, slopes=pe.alibi_slopes(H).to("meta"))
    assert out.shape == (1, H, 300, D) and out.is_meta


def test_flex_refuses_a_backward_on_the_cpu_and_caches_normal_tensors():
    from posenc._flex import _MASKS

    q, k, v = qkv(20)
    with pytest.raises(ValueError, match="chunked"):
        run("flex", q.requires_grad_(), k, v, window=4)
    _MASKS.clear()
    with torch.inference_mode():  # a block mask cached here must stay usable (and savable) outside
        run("flex", q.detach(), k, v, window=4)
    mask = next(iter(_MASKS.values()))
    assert not any(t.is_inference() for t in vars(mask).values() if isinstance(t, torch.Tensor))


def test_inputs_are_converted_or_refused_clearly():
    q, k, v = qkv(20)
    ref = pe.relative_attention(q, k, v, slopes=torch.tensor([1.0, 2.0, 1.0, 3.0], dtype=torch.float64))
    for slopes in ([1, 2, 1, 3], np.array([1, 2, 1, 3]), torch.tensor([1, 2, 1, 3])):  # integers are safe
        assert torch.allclose(pe.relative_attention(q, k, v, slopes=slopes), ref, atol=1e-6)
    table = torch.arange(20.0, dtype=torch.float64).expand(H, 20).neg()
    assert torch.allclose(pe.relative_attention(q, k, v, distance_bias=table.long()),
                          pe.relative_attention(q, k, v, distance_bias=table), atol=1e-6)
    bad = [
        (dict(slopes=torch.ones(H, dtype=torch.bool)), ValueError, "slopes"),
        (dict(slopes=[0.5, float("nan"), 0.5, 0.5]), ValueError, "finite"),
        (dict(slopes="alibi"), TypeError, "slopes"),
        (dict(distance_bias=torch.zeros(H, 20, dtype=torch.bool)), ValueError, "distance_bias"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(scale="0.5"), ValueError, "scale"),
        (dict(window=2.5), ValueError, "window"),
        (dict(window=float("nan")), ValueError, "window"),
        (dict(return_weights="yes"), TypeError, "return_weights"),
    ]
    for kw, error, match in bad:
        with pytest.raises(error, match=match):
            pe.relative_attention(q, k, v, **kw)


def test_clear_errors_for_tensors_of_the_wrong_kind_or_layout():
    q, k, v = qkv(20)
    cases = [
        ((q.numpy(), k, v), TypeError, "torch.Tensor"),
        ((q.long(), k.long(), v.long()), ValueError, "floating-point"),
        ((q, k.float(), v), ValueError, "one dtype and device"),
        ((q, k.to("meta"), v), ValueError, "one dtype and device"),
        ((q[..., :0], k[..., :0], v), ValueError, "head_dim"),
    ]
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            pe.relative_attention(*args)
    # (batch, seq, heads, dim) by mistake: caught through the slopes' or the table's head count
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with pytest.raises(ValueError, match=r"batch, seq, heads, head_dim"):
        pe.relative_attention(qt, kt, vt, slopes=pe.alibi_slopes(H))
    with pytest.raises(ValueError, match=r"batch, seq, heads, head_dim"):
        pe.relative_attention(qt, kt, vt, distance_bias=torch.zeros(H, 20))
    with pytest.raises(ValueError, match="k, v on seq"):
        pe.relative_attention(q, k, vt)


def test_compiled_flex_keeps_one_entry_per_length_and_kind(monkeypatch):
    """Compiled FlexAttention (CUDA's path), traced here by dynamo with a counting backend: each score kind is
    its own compiled function with static shapes, so twelve lengths of one kind compile twelve times (past
    dynamo's default limit of 8 entries, after which it would run eagerly and store the full score matrix),
    and a second kind does not evict the first."""
    from torch._dynamo.testing import CompileCounter

    from posenc import _flex as A

    counter, compile_ = CompileCounter(), torch.compile
    monkeypatch.setattr(A, "_flex_compiles", lambda device: True)
    monkeypatch.setattr(A, "_FLEX_COMPILED", {})
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None: compile_(fn, dynamic=dynamic, backend=counter))
    lengths = [48 + 16 * i for i in range(12)]
    kinds = {"slopes": lambda n: dict(slopes=pe.alibi_slopes(H)),
             "table + window": lambda n: dict(distance_bias=-torch.rand(H, n, dtype=torch.float64).cumsum(-1),
                                              window=20)}
    for kind, make in kinds.items():
        for n in lengths:
            q, k, v = qkv(n, batch=1)
            kw = make(n)
            with torch.no_grad():
                out = pe.relative_attention(q, k, v, path="flex", **kw)
            assert torch.allclose(out, pe.relative_attention(q, k, v, path="naive", **kw), atol=1e-10), (kind, n)
    assert sorted(A._FLEX_COMPILED) == [(False, True), (True, False)]
    assert counter.frame_count == len(kinds) * len(lengths)
    with torch.no_grad():  # compiled entries are reused: no new frame for a length seen before
        pe.relative_attention(*qkv(lengths[0], batch=1), path="flex", slopes=pe.alibi_slopes(H))
    assert counter.frame_count == len(kinds) * len(lengths)
