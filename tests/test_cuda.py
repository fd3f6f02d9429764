"""The fused paths on the device a reader trains on: equal to the reference in float32 and bfloat16, forward and backward.

Every test runs on the CPU and, where one is present, on a CUDA GPU (the ``cuda`` cases are marked
``cuda`` and skipped without one): on CUDA ``path="auto"`` is FlexAttention compiled with
``torch.compile``, the path a Colab reader's models take, and training runs under bf16 autocast.
The reference is the explicit formula in float64 on the same inputs.
"""

import warnings

import pytest
import torch

import posenc as pe

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
#: worst absolute error allowed, relative to the largest reference value (outputs are O(1))
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}
H, D = 4, 64
STEPS = 12  # training steps per run in the full-mode seeds test


def _inputs(n, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, H, n, D, generator=g, dtype=torch.float64) for _ in range(3))
    table = -torch.rand(H, n, generator=g, dtype=torch.float64).cumsum(-1) / 8
    return [t.to(device, dtype) for t in (q, k, v)], table.to(device, dtype)


def _close(got, ref, dtype, what):
    err = (got.double() - ref.double()).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    assert err < TOLERANCE[dtype], f"{what}: relative error {err:.2e}"


BIASES = {"ALiBi": lambda table, dev, dt: dict(slopes=pe.alibi_slopes(H).to(dev, dt)),
          "table (KERPLE, Sandwich, T5)": lambda table, dev, dt: dict(distance_bias=table),
          "window": lambda table, dev, dt: dict(window=100),
          "ALiBi + table + window": lambda table, dev, dt: dict(slopes=pe.alibi_slopes(H).to(dev, dt),
                                                                distance_bias=table, window=100)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", list(BIASES))
def test_relative_attention_forward_and_backward(device, dtype, bias):
    n = 320 if device == "cpu" else 1024
    (q, k, v), table = _inputs(n, device, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, table)]
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    kw = BIASES[bias](leaves[3], device, dtype)
    ref_kw = {key: (ref_leaves[3] if key == "distance_bias" else val.double() if torch.is_tensor(val) else val)
              for key, val in kw.items()}
    ref = pe.relative_attention(*ref_leaves[:3], path="naive", **ref_kw)
    dy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(device)
    ref.backward(dy)
    paths = ["auto", "chunked"] + (["fold"] if list(kw) == ["slopes"] else [])
    for path in paths:
        for t in leaves:
            t.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is not compiled
            out = pe.relative_attention(*leaves[:3], path=path, **kw)
        assert out.dtype == dtype and out.device.type == device
        _close(out, ref, dtype, f"{path} forward")
        out.backward(dy.to(dtype))
        for name, t, r in zip("qkv", leaves, ref_leaves):
            _close(t.grad, r.grad, dtype, f"{path} d{name}")
        if "distance_bias" in kw:
            _close(leaves[3].grad, ref_leaves[3].grad, dtype, f"{path} d(table)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_window_with_sinks(device, dtype):
    (q, k, v), _ = _inputs(300, device, dtype)
    out = pe.sink_attention(q, k, v, window=64, sinks=4)
    allowed = pe.sliding_window_mask(300, window=64, sinks=4, device=device)
    ref = pe.attention(q.double(), k.double(), v.double(), mask=allowed)
    _close(out, ref, dtype, "window + sinks")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rotations_in_half_precision_use_float64_angles(device, dtype):
    """Positions up to 32k: the rotation in ``dtype`` equals the float64 one to the rounding of ``dtype``."""
    x = torch.randn(1, 2, 4096, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    positions = torch.arange(28672, 32768)
    ref = pe.apply_rope(x, positions)
    got = pe.apply_rope(x.to(device, dtype), positions.to(device))
    assert got.dtype == dtype
    _close(got, ref.to(device), dtype, "RoPE at positions 28k-32k")
    ref_x, got_x = pe.XPos(D)(x, x), pe.XPos(D).to(device)(x.to(device, dtype), x.to(device, dtype))
    for r, g in zip(ref_x, got_x):
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", list(pe.POSITION_SCHEMES))
def test_every_scheme_trains_under_bf16_autocast(device, scheme):
    """One model per scheme: logits under autocast close to float32 ones, and one training step moves the loss."""
    torch.manual_seed(0)
    options = {"max_len": 128} if scheme == "learned" else {}
    model = pe.TinyLM(16, 64, 2, 4, position=scheme, train_len=128, **options).to(device)
    idx = torch.randint(0, 16, (2, 128), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        ref = model(idx)
        with torch.autocast(device, dtype=torch.bfloat16):
            got = model(idx)
    assert torch.isfinite(got).all()
    _close(got.float(), ref, torch.bfloat16, f"{scheme} logits")
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(idx).float().flatten(0, 1), idx.roll(-1, 1).flatten())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flex_compiles_at_every_length_without_falling_back(dtype):
    """path="flex" must stay compiled FlexAttention: its fallback to the chunked path (exact, but many times
    slower on a GPU) would let every other CUDA test pass, so here a fallback's warning is an error."""
    from posenc import _flex as A

    for n in (256, 384, 512, 640):
        (q, k, v), table = _inputs(n, "cuda", dtype)
        for kw in (dict(slopes=pe.alibi_slopes(H).to("cuda", dtype)), dict(distance_bias=table), dict(window=100)):
            ref = pe.relative_attention(q.double(), k.double(), v.double(), path="naive",
                                        **{key: val.double() if torch.is_tensor(val) else val for key, val in kw.items()})
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                out = pe.relative_attention(q, k, v, path="flex", **kw)
            _close(out, ref, dtype, f"flex at n={n}, {sorted(kw)}")
    assert not A._FLEX.get("broken")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_seeds_machinery_in_full_mode(tmp_path, monkeypatch):
    """The full preset over seeds on the GPU: each configuration trained once per seed, on the GPU, one after the
    other (no forked workers once CUDA is up); a re-run loads every run from the cache unchanged; per-seed measures
    come back as spreads whose values differ between seeds."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    P = pe.training_preset("full", steps=STEPS, warmup=2)
    task = pe.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0)
    makers = {s: (lambda s=s: P.make_model(task.vocab_size, s)) for s in ["rope", "alibi"]}
    seed_list = pe.seeds()
    assert len(seed_list) == 3
    runs = pe.train_seeds(makers, task, seed_list, workers=3, **P.train_kwargs())
    flat = [r for rs in runs.values() for r in rs]
    assert len(flat) == 6 and not any(r.from_cache for r in flat)
    assert all(next(r.model.parameters()).device.type == "cuda" for r in flat)
    again = pe.train_seeds(makers, task, seed_list, **P.train_kwargs())
    for name in makers:
        for first, second in zip(runs[name], again[name]):
            assert second.from_cache and second.final_loss == first.final_loss
    final = pe.spread([r.final_loss for r in runs["rope"]])
    assert len(set(final.values)) == 3 and all(x == x for x in final.values)
    L = P.seq_len
    excess = pe.spread(pe.per_seed(lambda i: {n: r.loss for n, r in pe.evaluate_lengths(
        runs["alibi"][i].model, task, [L, 2 * L], batches=2, seed=pe.evaluation_seed()).items()}, range(3), workers=3))
    assert set(excess) == {L, 2 * L}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_token_ids_drawn_on_the_cpu_follow_a_model_on_the_gpu():
    """A batch drawn on the CPU (as the tasks draw them) fed to a model on the GPU: the same logits as ids moved by hand,
    with explicit position ids too (chapter 7 feeds its models such batches)."""
    torch.manual_seed(0)
    model = pe.TinyLM(16, 64, 2, 4, position="rope").cuda()
    idx = torch.randint(0, 16, (2, 32), generator=torch.Generator().manual_seed(1))
    ids = torch.arange(32) * 3
    with torch.no_grad():
        assert torch.equal(model(idx), model(idx.cuda()))
        assert torch.equal(model(idx, positions=ids), model(idx.cuda(), positions=ids.cuda()))
