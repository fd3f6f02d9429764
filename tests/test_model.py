"""Tests for posenc.model: the tiny language model and its position schemes."""

import pytest
import torch

import posenc as pe
from posenc import POSITION_SCHEMES, TinyLM

V = 11  # vocabulary size of the test models
T = 16  # "training" length of the test models


def make(position: str, **kw) -> TinyLM:
    torch.manual_seed(0)
    if position == "learned":
        kw.setdefault("max_len", 8 * T)
    kw.setdefault("train_len", T)
    return TinyLM(V, d_model=32, n_layers=2, n_heads=4, position=position, **kw).eval()


def tokens(n: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(V, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_tinylm_is_exported():
    assert pe.TinyLM is TinyLM
    assert set(POSITION_SCHEMES) >= {"none", "learned", "sinusoidal", "rope", "alibi",
                                      "kerple_power", "kerple_log", "sandwich", "xpos"}


@pytest.mark.parametrize("position", POSITION_SCHEMES)
def test_output_shape(position):
    model = make(position)
    out = model(tokens(T, batch=3))
    assert out.shape == (3, T, V)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("position", POSITION_SCHEMES)
@pytest.mark.parametrize("setting", ["plain", "window", "log_n"])
def test_causal(position, setting):
    """Changing tokens after t never changes the logits at positions <= t."""
    model = make(position)
    if setting == "window":
        model.window = 5
    elif setting == "log_n":
        model.train_len = 4
        model.log_n_scaling = True
    x = tokens(2 * T)
    t = 9
    y = x.clone()
    y[:, t + 1:] = (y[:, t + 1:] + 1 + torch.arange(2 * T - t - 1)) % V  # every later token changes
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:], atol=1e-3)


@pytest.mark.parametrize("position", POSITION_SCHEMES)
def test_runs_at_any_length(position):
    """Built once, run at 1x, 3x and 8x the training length (learned: only within its table)."""
    model = make(position, max_len=2 * T) if position == "learned" else make(position)
    for factor in (1, 3, 8):
        x = tokens(factor * T, batch=1)
        if position == "learned" and factor * T > 2 * T:
            with pytest.raises(ValueError, match="max_len"):
                model(x)
        else:
            with torch.no_grad():
                assert model(x).shape == (1, factor * T, V)


@pytest.mark.parametrize("position", ["none", "rope", "alibi", "kerple_log", "t5", "sinusoidal"])
def test_window_limits_receptive_field(position):
    """One layer with a window w: the output at t depends only on tokens t-w+1 .. t."""
    torch.manual_seed(0)
    model = TinyLM(V, d_model=32, n_layers=1, n_heads=4, position=position, window=4).eval()
    x = tokens(12)
    y = x.clone()
    y[:, 0] = (y[:, 0] + 1) % V
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, 4:], b[:, 4:], atol=1e-6)  # token 0 is out of every window from t = 4
    assert not torch.allclose(a[:, :4], b[:, :4], atol=1e-4)


@pytest.mark.parametrize("position", ["rope", "alibi", "kerple_power", "sandwich", "xpos"])
def test_window_at_least_length_changes_nothing(position):
    model = make(position)
    x = tokens(T)
    with torch.no_grad():
        full = model(x)
        model.window = T
        windowed = model(x)
    assert torch.allclose(full, windowed, atol=1e-6)


def test_log_n_scaling_only_beyond_train_len():
    """Factors are 1 for the first train_len queries: those outputs are unchanged."""
    model = make("rope")
    with torch.no_grad():
        for block in model.blocks:  # sharpen attention so that scaling the logits shows
            block.attn.qkv.weight.mul_(30)
    x = tokens(3 * T)
    with torch.no_grad():
        plain = model(x)
        model.log_n_scaling = True
        scaled = model(x)
    assert torch.allclose(plain[:, :T], scaled[:, :T], atol=1e-6)
    assert not torch.allclose(plain[:, T:], scaled[:, T:], atol=1e-4)
    factors = model._log_n_scale(3 * T, torch.device("cpu"), None).flatten()
    n = torch.arange(1, 3 * T + 1, dtype=torch.float64)
    expected = (n.log() / torch.log(torch.tensor(float(T)))).clamp(min=1)  # log_L(n) for n > L
    assert torch.allclose(factors.double(), expected, atol=1e-6)
    model.window = T  # a window of L keys: every query sees at most L keys, factor 1
    assert model._log_n_scale(3 * T, torch.device("cpu"), model.window) is None


def _reference_bias(model: TinyLM, n: int) -> torch.Tensor:
    """The (heads, n, n) bias each scheme should add, from posenc's matrix functions."""
    scheme = model.position
    if scheme.name == "alibi":
        return pe.alibi_bias(4, n)
    if scheme.name == "sandwich":
        return pe.sandwich_bias(4, n, dim=scheme.dim)
    if scheme.name == "t5":
        return scheme.bias(n)
    return scheme.layers[0](n)  # KERPLE: the first layer's kernel


@pytest.mark.parametrize("position", ["alibi", "sandwich", "t5", "kerple_power", "kerple_log"])
@pytest.mark.parametrize("n", [T, 300])  # 300 > 256 queries: the chunked path
def test_bias_inside_model_is_the_posenc_bias(position, n):
    """The first layer's attention equals pe.attention with the scheme's full (heads, n, n) bias."""
    model = make(position)
    idx = tokens(n, batch=1)
    with torch.no_grad():
        _, weights = model(idx, return_attention=True)
        block = model.blocks[0]
        qkv = block.attn.qkv(block.ln1(model.tok(idx))).view(1, n, 3, 4, 8)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        out, ref = pe.attention(q, k, v, bias=_reference_bias(model, n), return_weights=True)
        fast = pe.relative_attention(q, k, v, **({"slopes": model.position.slopes()} if position == "alibi" else
                                                 {"distance_bias": _reference_bias(model, n)[:, -1].flip(-1)}))
    assert torch.allclose(weights[0], ref, atol=1e-6)
    assert torch.allclose(fast, out, atol=1e-5)


def test_alibi_slopes_are_not_saved():
    """ALiBi's slopes follow the model's device but are not weights (old checkpoints still load)."""
    model = make("alibi")
    assert torch.equal(model.position.slopes(), pe.alibi_slopes(4))
    assert not any("slopes" in key for key in model.state_dict())


def test_rope_model_rotates_like_apply_rope():
    """The model's rotation (cached tables, q and k in one pass) gives exactly pe.apply_rope on q and k."""
    model = make("rope")
    q = torch.randn(1, 4, 6, 8)
    k = torch.randn(1, 4, 6, 8)
    qa, ka = model.position.rotate(torch.stack((q, k)))
    qb, kb = pe.apply_rope(q), pe.apply_rope(k)
    assert torch.allclose(qa, qb, atol=1e-6) and torch.allclose(ka, kb, atol=1e-6)


def test_config_excludes_evaluation_settings():
    model = make("rope")
    before = model.config
    model.window = 7
    model.log_n_scaling = True
    assert model.config == before
    assert before["position"]["scheme"] == "rope" and before["d_model"] == 32


def test_reset_parameters_is_deterministic():
    a, b = make("kerple_log"), make("kerple_log")
    a.reset_parameters(torch.Generator().manual_seed(3))
    b.reset_parameters(torch.Generator().manual_seed(3))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    b.reset_parameters(torch.Generator().manual_seed(4))
    assert not torch.equal(a.tok.weight, b.tok.weight)


def test_learned_bias_parameters_get_gradients():
    for position in ("kerple_power", "kerple_log", "t5"):
        model = make(position).train()
        model(tokens(T)).logsumexp(-1).mean().backward()
        params = [p for n, p in model.named_parameters() if n.startswith("position.")]
        assert params and all(p.grad is not None and p.grad.abs().sum() > 0 for p in params), position


@pytest.mark.parametrize("kwargs", [
    dict(position="no-such-scheme"),  # ("nope" names NoPE)
    dict(position="rope", n_heads=3),          # 32 not divisible by 3
    dict(position="rope", d_model=36, n_heads=4),  # head_dim 9 is odd
    dict(position="xpos", d_model=36, n_heads=4),
    dict(position="learned"),                  # max_len missing
    dict(position="rope", max_len=64),         # max_len only for learned
    dict(position="rope", window=0),
    dict(position="rope", window=2.5),
    dict(position="rope", log_n_scaling=True),  # needs train_len
    dict(position="rope", train_len=1),
    dict(position="rope", dropout=1.0),
    dict(position="rope", n_layers=0),
])
def test_bad_arguments(kwargs):
    kwargs = dict(dict(d_model=32, n_heads=4), **kwargs)
    with pytest.raises(ValueError):
        TinyLM(V, **kwargs)


def test_bad_inputs():
    model = make("rope")
    with pytest.raises(ValueError):
        model(torch.rand(2, 5))  # not token ids
    with pytest.raises(ValueError):
        model(torch.zeros(5, dtype=torch.long))  # no batch dimension
    with pytest.raises(ValueError):
        model.window = -1
    with pytest.raises(ValueError):
        TinyLM(0)


def test_token_ids_outside_the_vocabulary():
    model = make("rope")
    for bad in (V, -1, 10 * V):
        idx = tokens(T)
        idx[0, 3] = bad
        with pytest.raises(ValueError, match=r"token ids must be in \[0, 11\)"):
            model(idx)
    with pytest.raises(ValueError, match="at least one token"):
        model(torch.zeros(2, 0, dtype=torch.long))


def test_a_presets_model_kwargs_type_check_as_tinylm_arguments(tmp_path, monkeypatch):
    """``TinyLM(V, **P.model_kwargs(), position=...)`` passes ``mypy --strict`` (model_kwargs is a TypedDict)."""
    import tempfile
    from pathlib import Path

    api = pytest.importorskip("mypy.api")
    (tmp_path / "posenc").symlink_to(Path(pe.__file__).parent)  # an editable install hides the package from mypy
    (tmp_path / "snippet.py").write_text("import posenc as pe\n\n"
                                         "P = pe.training_preset()\n"
                                         "model = pe.TinyLM(16, **P.model_kwargs(), position='rope')\n"
                                         "sizes: int = P.model_kwargs()['d_model']\n")
    cache = Path(tempfile.gettempdir()) / "posenc-mypy-cache"  # mypy checks what it reads back: safe to share
    monkeypatch.chdir(tmp_path)  # mypy finds the package beside the snippet
    out, err, status = api.run(["--strict", "--follow-imports=silent", "--cache-dir", str(cache), "snippet.py"])
    assert status == 0, out + err
