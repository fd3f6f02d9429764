"""Position schemes as objects (posenc.scheme): the registry, user-defined schemes, the cache key."""

import copy

import pytest
import torch

import posenc as pe
from posenc import layers
from posenc.train import run_key

V, T = 11, 16


def model(position, **kw):
    torch.manual_seed(0)
    return pe.TinyLM(V, d_model=32, n_layers=2, n_heads=4, position=position, **kw).eval()


def tokens(n, batch=2, seed=0):
    return torch.randint(V, (batch, n), generator=torch.Generator().manual_seed(seed))


class TableALiBi(pe.PositionScheme):
    """ALiBi written by a user as a table by distance (no slopes hook)."""

    def distance_bias(self, length, *, device, dtype):
        d = torch.arange(length, device=device, dtype=dtype)
        return -pe.alibi_slopes(self.n_heads).to(device, dtype)[:, None] * d


class LearnedDecay(pe.PositionScheme):
    """-log(1 + r_h d) with a learned rate per head, one table per layer."""

    def __init__(self, rate=0.5):
        super().__init__()
        self.rate = rate

    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.log_rate = torch.nn.Parameter(torch.full((n_layers, n_heads), float(self.rate)).log())

    def distance_bias(self, length, *, device, dtype):
        d = torch.arange(length, device=device, dtype=dtype)
        return -torch.log1p(self.log_rate.exp()[..., None] * d)  # (layers, heads, length)


class HalfRoPE(pe.PositionScheme):
    """A rotation of the user's: RoPE with base 100 (through the public function)."""

    def rotate(self, qk):
        return pe.apply_rope(qk, None, 100.0)


class Offset(pe.PositionScheme):
    """An absolute scheme of the user's: adds a constant per position parity."""

    def embed(self, x):
        parity = (torch.arange(x.shape[-2], device=x.device) % 2).to(x.dtype)
        return x + parity[:, None]


# ---------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------


def test_registry_lists_the_built_in_schemes_in_book_order():
    assert pe.POSITION_SCHEMES == ("none", "learned", "sinusoidal", "rope", "alibi", "kerple_power",
                                   "kerple_log", "sandwich", "xpos", "t5", "p_rope", "cope")
    assert pe.position_scheme("kerple-log").name == "kerple_log"   # a hyphen for the underscore is accepted
    kinds = {"p_rope": pe.PRoPE, "learned": pe.LearnedPositions, "sinusoidal": pe.SinusoidalPositions, "rope": pe.RoPE,
             "alibi": pe.ALiBi, "kerple_log": pe.Kerple, "sandwich": pe.Sandwich, "xpos": pe.XPosRotation,
             "t5": pe.T5Bias, "none": pe.NoPE, "cope": pe.CoPE}
    for name, cls in kinds.items():
        scheme = pe.position_scheme(name, **({"max_len": 8} if name == "learned" else {}))
        assert isinstance(scheme, cls) and scheme.name == name


def test_registry_options_and_errors():
    assert pe.position_scheme("rope", base=500.0).base == 500.0
    with pytest.raises(ValueError, match="takes the options"):
        pe.position_scheme("rope", max_len=64)
    with pytest.raises(ValueError, match="position must be one of"):
        pe.position_scheme("fire")
    with pytest.raises(ValueError, match="already built"):
        pe.position_scheme(pe.RoPE(), base=3.0)
    with pytest.raises(ValueError, match="already registered"):
        pe.register_scheme("rope", TableALiBi)


def test_registering_a_user_scheme_by_name(monkeypatch):
    from posenc import scheme as S

    monkeypatch.setattr(S, "_REGISTRY", dict(S._REGISTRY))  # restored after the test
    monkeypatch.setattr(S, "POSITION_SCHEMES", S.POSITION_SCHEMES)
    pe.register_scheme("table_alibi", TableALiBi)
    assert S.POSITION_SCHEMES[-1] == "table_alibi"  # after the built-in ones
    assert isinstance(model("table_alibi").position, TableALiBi)


def test_hooks_are_detected():
    assert pe.RoPE().rotates and not pe.RoPE().biases and not pe.RoPE().embeds
    assert pe.ALiBi().biases and pe.Sandwich().biases and not pe.NoPE().biases
    assert pe.SinusoidalPositions().embeds and Offset().embeds and HalfRoPE().rotates


# ---------------------------------------------------------------------------
# User-defined schemes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [T, 300])  # 300 queries: the chunked path
def test_custom_alibi_table_gives_alibis_logits(n):
    """The same weights with position="alibi" (slopes) and a user's table of -m d: the same logits."""
    alibi, custom = model("alibi"), model(TableALiBi())
    custom.load_state_dict(alibi.state_dict())
    with torch.no_grad():
        assert torch.allclose(alibi(tokens(n)), custom(tokens(n)), atol=1e-5)


def test_custom_bias_takes_the_fast_attention_path(monkeypatch):
    """A user's table reaches pe.relative_attention as distance_bias (no (heads, n, n) tensor)."""
    seen = []
    real = layers.relative_attention

    def spy(q, k, v, **kw):
        seen.append(kw)
        return real(q, k, v, **kw)

    monkeypatch.setattr(layers, "relative_attention", spy)
    m = model(LearnedDecay())
    with torch.no_grad():
        m(tokens(20))
    assert len(seen) == 2
    for layer, kw in enumerate(seen):
        assert kw["distance_bias"].shape == (4, 20) and kw.get("slopes") is None
        expected = -torch.log1p(m.position.log_rate.exp()[layer, :, None] * torch.arange(20.0))
        assert torch.allclose(kw["distance_bias"], expected)


def test_custom_bias_is_what_the_attention_adds():
    """Layer 0's weights equal softmax(q k / sqrt(d) + b(i - j)) with the user's table, causally."""
    m, n = model(LearnedDecay(rate=0.3)), 12
    idx = tokens(n, batch=1)
    with torch.no_grad():
        _, weights = m(idx, return_attention=True)
        block = m.blocks[0]
        q, k, v = block.attn.qkv(block.ln1(m.tok(idx))).view(1, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
        bias = -torch.log1p(0.3 * (-pe.relative_positions(n)).clamp(min=0).float())  # (n, n), j <= i
        _, ref = pe.attention(q, k, v, bias=bias.expand(4, n, n), return_weights=True)
    assert torch.allclose(weights[0], ref, atol=1e-6)


def test_custom_learned_bias_trains_and_gets_gradients():
    m = model(LearnedDecay()).train()
    m(tokens(T)).logsumexp(-1).mean().backward()
    assert m.position.log_rate.grad is not None and m.position.log_rate.grad.abs().sum() > 0


def test_custom_rotation_equals_rotating_by_hand():
    m = model(HalfRoPE())
    x = torch.randn(1, 9, 32)
    layer = m.blocks[0].attn
    q, k, v = (t.reshape(1, 9, 4, 8).transpose(1, 2) for t in layer.qkv(x).chunk(3, -1))
    out = pe.attention(pe.apply_rope(q, None, 100.0), pe.apply_rope(k, None, 100.0), v)
    expected = layer.proj(out.transpose(1, 2).reshape(1, 9, 32))
    with torch.no_grad():
        assert torch.allclose(layer(x, m._positions(9, x.device)[0]), expected, atol=1e-6)


@pytest.mark.parametrize("scheme", [TableALiBi, LearnedDecay, HalfRoPE, Offset], ids=lambda c: c.__name__)
@pytest.mark.parametrize("attention", ["softmax", "linear", "norm", "diag"])
def test_user_schemes_are_causal_at_any_length(scheme, attention):
    obj = scheme()
    if obj.biases and attention != "softmax":
        with pytest.raises(ValueError, match="softmax"):
            model(obj, attention=attention)
        return
    m = model(obj, attention=attention)
    idx = tokens(5 * T)
    changed = idx.clone()
    changed[:, 40:] = (changed[:, 40:] + 1) % V
    with torch.no_grad():
        a, b = m(idx), m(changed)
    assert torch.isfinite(a).all()
    assert torch.allclose(a[:, :40], b[:, :40], atol=1e-5) and not torch.allclose(a[:, 40:], b[:, 40:], atol=1e-4)


def test_a_scheme_belongs_to_one_model():
    scheme = LearnedDecay()
    model(scheme)
    with pytest.raises(ValueError, match="already belongs"):
        pe.TinyLM(V, d_model=64, n_layers=2, n_heads=4, position=scheme)
    model(copy.deepcopy(pe.ALiBi()))  # a fresh object is fine


class WrongShape(pe.PositionScheme):
    def distance_bias(self, length, *, device, dtype):
        return torch.zeros(length, device=device, dtype=dtype)  # forgot the heads


class OddOnly(pe.PositionScheme):
    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self._require_even_head_dim()

    def rotate(self, qk):
        return qk


def test_bad_user_schemes_fail_at_construction():
    with pytest.raises(ValueError, match=r"distance_bias\(3\) must return"):
        model(WrongShape())
    with pytest.raises(ValueError, match="head_dim"):
        pe.TinyLM(V, d_model=36, n_layers=1, n_heads=4, position=OddOnly())
    with pytest.raises(ValueError, match="head_dim"):
        pe.TinyLM(V, d_model=36, n_layers=1, n_heads=4, position="rope")
    with pytest.raises(ValueError, match="sinusoidal needs an even d_model"):
        pe.TinyLM(V, d_model=9, n_layers=1, n_heads=1, position="sinusoidal")


# ---------------------------------------------------------------------------
# Config and the cache key
# ---------------------------------------------------------------------------


def key_of(position, **kw):
    return run_key(model(position, **kw).config)


def test_cache_key_changes_with_scheme_parameters():
    assert key_of("rope") == key_of("rope")
    assert key_of("rope") != key_of("rope", base=500.0)
    assert key_of("xpos") != key_of("xpos", scale_base=256.0)
    assert key_of("sandwich") != key_of("sandwich", dim=64)
    assert key_of("t5") != key_of("t5", max_distance=64)
    assert key_of("learned", max_len=64) != key_of("learned", max_len=128)
    assert key_of("kerple_log") != key_of("kerple_power")
    assert key_of(LearnedDecay(rate=0.5)) == key_of(LearnedDecay(rate=0.5))
    assert key_of(LearnedDecay(rate=0.5)) != key_of(LearnedDecay(rate=0.25))
    assert key_of("alibi") != key_of(TableALiBi())  # same numbers, but a different scheme


def test_user_config_records_class_source_and_initial_values():
    config = model(LearnedDecay()).config["position"]
    assert config["scheme"].endswith("LearnedDecay") and config["rate"] == 0.5
    assert len(config["source"]) == 16 and len(config["initial"]) == 16


def test_user_scheme_reset_restores_its_initial_values():
    m = model(LearnedDecay(rate=0.5))
    with torch.no_grad():
        m.position.log_rate.add_(1.0)
    m.reset_parameters(torch.Generator().manual_seed(1))
    assert torch.allclose(m.position.log_rate.exp(), torch.full((2, 4), 0.5))


def test_built_in_learned_schemes_draw_from_the_generator():
    for name in ("kerple_log", "t5", "learned"):
        kw = {"max_len": 32} if name == "learned" else {}
        a, b = model(name, **kw), model(name, **kw)
        a.reset_parameters(torch.Generator().manual_seed(5))
        b.reset_parameters(torch.Generator().manual_seed(5))
        pa, pb = dict(a.position.named_parameters()), dict(b.position.named_parameters())
        assert pa and all(torch.equal(pa[k], pb[k]) for k in pa), name
        b.reset_parameters(torch.Generator().manual_seed(6))
        assert not all(torch.equal(pa[k], dict(b.position.named_parameters())[k]) for k in pa), name


def _class_without_source(body: str):
    """A scheme class defined as in a notebook cell: inspect.getsource cannot find its file."""
    namespace = {"pe": pe, "torch": torch, "__name__": "__main__"}
    exec(compile(f"class Cell(pe.PositionScheme):\n{body}", "<ipython-input-1>", "exec"), namespace)
    return namespace["Cell"]


def test_source_hash_of_a_class_defined_in_a_notebook_follows_its_code():
    """Editing a method of a class whose source Python cannot read still changes the cache key."""
    a = _class_without_source("    def distance_bias(self, length, *, device, dtype):\n"
                              "        return -0.5 * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)\n")
    b = _class_without_source("    def distance_bias(self, length, *, device, dtype):\n"
                              "        return -0.25 * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)\n")
    same = _class_without_source("    def distance_bias(self, length, *, device, dtype):\n"
                                 "        return -0.5 * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)\n")
    import inspect

    with pytest.raises(OSError):
        inspect.getsource(a)
    keys = [model(cls()).config["position"]["source"] for cls in (a, b, same)]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_sinusoidal_scheme_table_is_kept_per_length_and_never_stale():
    """The added table is computed once per (length, device, dtype, base) and equals the formula every time."""
    scheme = pe.SinusoidalPositions()
    scheme.bind(d_model=8, n_heads=2, n_layers=1)
    x = torch.randn(2, 5, 8)
    for _ in range(2):  # the second call reads the kept table
        torch.testing.assert_close(scheme.embed(x), x + pe.sinusoidal_embedding(5, 8), rtol=0, atol=0)
    assert len(scheme._tables) == 1
    torch.testing.assert_close(scheme.embed(x[:, :3]), x[:, :3] + pe.sinusoidal_embedding(3, 8), rtol=0, atol=0)
    torch.testing.assert_close(scheme.embed(x.double()), x.double() + pe.sinusoidal_embedding(5, 8, dtype=torch.float64))
    scheme.base = 100.0  # changed after use: the new base's table, not the kept one
    torch.testing.assert_close(scheme.embed(x), x + pe.sinusoidal_embedding(5, 8, 100.0), rtol=0, atol=0)
    for t in range(1, 12):  # the number of kept tables stays bounded
        scheme.embed(torch.randn(1, t, 8))
    assert len(scheme._tables) <= 8
    ids = torch.tensor([[4, 0, 2]])  # explicit position ids: the table's rows at those ids
    torch.testing.assert_close(scheme.embed(x[:1, :3], ids), x[:1, :3] + pe.sinusoidal_embedding(5, 8, 100.0)[ids], rtol=0, atol=0)


def test_sinusoidal_module_keeps_the_default_table_and_never_a_stale_one():
    """SinusoidalPositionalEmbedding: the default positions' table is kept; explicit positions and changes are honoured."""
    module = pe.SinusoidalPositionalEmbedding(8)
    x = torch.randn(2, 5, 8)
    for _ in range(2):
        torch.testing.assert_close(module(x), x + pe.sinusoidal_embedding(5, 8), rtol=0, atol=1e-7)
    assert len(module._tables) == 1
    module.scale = 0.5  # changed after use: the new scale, not the kept table
    torch.testing.assert_close(module(x), x + 0.5 * pe.sinusoidal_embedding(5, 8, dtype=torch.float64).float())
    ids = torch.tensor([4.0, 0.0, 2.0, 1.0, 3.0])
    torch.testing.assert_close(module(x, ids), x + 0.5 * pe.sinusoidal_embedding(ids, 8, dtype=torch.float64).float())
