"""One position scheme and one window per layer: NoPE/RoPE interleaving (iRoPE) and local/global layers (Gemma)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe
from posenc.data import MarkovChain

V = 11
IN_ATTENTION = ["none", "rope", "alibi", "kerple_log", "sandwich", "xpos", "t5", "p_rope"]


def tokens(n, batch=2, seed=0):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def sharp(model):
    with torch.no_grad():  # sharper attention than at initialisation, so that positions show in the logits
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)
    return model


def copy_weights(src, dst):
    dst.load_state_dict(src.state_dict())
    return dst


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(IN_ATTENTION), layers=st.integers(1, 3))
def test_the_same_scheme_in_every_layer_is_the_single_scheme(name, layers):
    single = sharp(pe.TinyLM(V, 16, layers, 2, position=name))
    listed = pe.TinyLM(V, 16, layers, 2, position=[name] * layers)
    listed.load_state_dict({k.replace("position.", "position.schemes.0.", 1): v   # a learned scheme's tensors
                            for k, v in single.state_dict().items()})
    assert listed.position.layer(0) is listed.position.layer(layers - 1)   # one object per name
    x = tokens(20)
    with torch.no_grad():
        torch.testing.assert_close(listed(x), single(x), rtol=0, atol=0)
    assert listed.config["position"] == dict(scheme="layers", layers=[single.config["position"]] * layers)


def test_each_layer_gets_its_own_scheme():
    model = pe.TinyLM(V, 16, 3, 2, position=["alibi", "rope", "none"])
    first, second, third = model._positions(10, torch.device("cpu"))
    assert first.slopes is not None and first.rotate is None
    assert second.rotate is not None and second.slopes is None and second.table is None
    assert third.rotate is None and third.slopes is None and third.table is None
    assert [model.position.layer(i).name for i in range(3)] == ["alibi", "rope", "none"]


def test_interleaved_differs_from_both_of_its_parts_and_stays_causal():
    rope = sharp(pe.TinyLM(V, 16, 2, 2, position="rope"))
    mixed = copy_weights(rope, pe.TinyLM(V, 16, 2, 2, position=["rope", "none"]))
    nope = copy_weights(rope, pe.TinyLM(V, 16, 2, 2, position="none"))
    x = tokens(24)
    with torch.no_grad():
        out = mixed(x)
        assert not torch.allclose(out, rope(x), atol=1e-4) and not torch.allclose(out, nope(x), atol=1e-4)
        y = x.clone()
        y[:, 12:] = (y[:, 12:] + 1) % V                           # change the future only
        torch.testing.assert_close(mixed(y)[:, :12], out[:, :12], rtol=0, atol=0)


def test_options_go_to_every_named_scheme_and_objects_are_used_as_given():
    own = pe.RoPE(base=50.0)
    model = pe.TinyLM(V, 16, 3, 2, position=["rope", own, "rope"], base=500.0)
    assert model.position.layer(0).base == 500.0 == model.position.layer(2).base
    assert model.position.layer(1) is own


@pytest.mark.parametrize("position, attention, match", [
    (["sinusoidal", "rope"], "softmax", "adds to the embeddings"),
    (["rope"], "softmax", "one per layer"),
    (["rope", "rope", "rope"], "softmax", "one per layer"),
    (["alibi", "rope"], ["linear", "softmax"], "only softmax"),
    (["rope", 3], "softmax", "position must be one of"),
])
def test_bad_lists_are_refused(position, attention, match):
    with pytest.raises(ValueError, match=match):
        pe.TinyLM(V, 16, 2, 2, position=position, attention=attention)


@pytest.mark.parametrize("kind", ["linear", "norm", "decay", "gated"])
def test_alibi_on_a_linear_layer_is_refused_naming_the_decay_that_carries_its_slopes(kind):
    with pytest.raises(ValueError, match="attention='decay', decay='alibi'"):
        pe.TinyLM(V, 16, 1, 2, position="alibi", attention=kind)
    with pytest.raises(ValueError, match="only softmax") as refused:                  # other biases: no such hint
        pe.TinyLM(V, 16, 1, 2, position="t5", attention=kind)
    assert "decay=" not in str(refused.value)
    decayed = pe.TinyLM(V, 16, 1, 2, position="none", attention="decay", decay="alibi")   # the route it names
    assert torch.allclose(decayed.blocks[0].attn.log_decay.exp(), pe.decay_rates("alibi", 2, dtype=torch.float64))


def test_a_bias_on_the_softmax_layer_of_a_hybrid_is_allowed():
    model = pe.TinyLM(V, 16, 2, 2, position=["rope", "alibi"], attention=["linear", "softmax"])
    assert torch.isfinite(model(tokens(40))).all()


def test_rope_scaling_applies_to_every_rope_layer():
    model = pe.TinyLM(V, 16, 3, 2, position=["rope", "none", "rope"])
    model.rope_scaling = ("linear", 2)
    assert model.position.layer(0).scaling.method == "linear" and model.rope_scaling.method == "linear"
    model.rope_scaling = None
    assert model.position.layer(0).scaling is None
    no_rope = pe.TinyLM(V, 16, 2, 2, position=["alibi", "none"])
    no_rope.rope_scaling = None
    with pytest.raises(ValueError, match="RoPE layers"):
        no_rope.rope_scaling = ("linear", 2)


# --------------------------------------------------------------------------- windows per layer

def test_a_window_per_layer():
    model = sharp(pe.TinyLM(V, 16, 2, 2, position="alibi", window=[8, None]))
    assert model.window == (8, None)
    local, glob = model._positions(20, torch.device("cpu"))
    assert local.window == 8 and glob.window is None
    assert [p.window for p in model._positions(8, torch.device("cpu"))] == [None, None]   # no shorter than 8
    both = copy_weights(model, pe.TinyLM(V, 16, 2, 2, position="alibi", window=8))
    listed = copy_weights(model, pe.TinyLM(V, 16, 2, 2, position="alibi", window=[8, 8]))
    x = tokens(30)
    with torch.no_grad():
        torch.testing.assert_close(listed(x), both(x), rtol=0, atol=0)
        assert not torch.allclose(model(x), both(x), atol=1e-4)
    model.window = [None, None]
    assert model.window is None


def test_sinks_and_log_n_scaling_follow_each_layer_s_window():
    model = pe.TinyLM(V, 16, 2, 2, position="rope", window=[8, None], train_len=8, log_n_scaling=True)
    model.sinks = 2
    local, glob = model._positions(20, torch.device("cpu"))
    assert local.sinks == 2 and glob.sinks == 0
    assert local.q_scale is None                                    # at most 8 keys: factor 1
    assert glob.q_scale is not None and float(glob.q_scale.max()) > 1


@pytest.mark.parametrize("window, attention, match", [
    ([8], "softmax", "one per layer"),
    ([8, 0], "softmax", r"window\[1\]"),
    ([None, 8], ["softmax", "linear"], "layer 1 is 'linear'"),
])
def test_bad_window_lists_are_refused(window, attention, match):
    with pytest.raises(ValueError, match=match):
        pe.TinyLM(V, 16, 2, 2, position="rope", attention=attention, window=window)


def test_lists_enter_the_cache_key_and_load(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    chain = MarkovChain(vocab_size=6, order=1, alpha=0.2, seed=0)
    fast = dict(steps=6, seq_len=16, batch_size=2, progress=False, device="cpu")
    first = pe.train(pe.TinyLM(6, 16, 2, 2, position=["rope", "none"], window=[8, None]), chain, **fast)
    assert first.config["train"]["window"] == [8, None] and first.config["model"]["position"]["scheme"] == "layers"
    again = pe.train(pe.TinyLM(6, 16, 2, 2, position=["rope", "none"], window=[8, None]), chain, **fast)
    assert again.from_cache and again.key == first.key
    keys = {pe.train(pe.TinyLM(6, 16, 2, 2, position=p, window=w), chain, **fast).key
            for p, w in [(["none", "rope"], [8, None]), (["rope", "none"], [None, 8]), ("rope", [8, None]),
                         (["rope", "none"], [16, None])]}
    assert first.key not in keys and len(keys) == 4
    # a window as long as the training sequence does nothing: the key of no window
    assert pe.train(pe.TinyLM(6, 16, 2, 2, position=["rope", "none"], window=[16, None]), chain,
                    **fast).config["train"]["window"] is None


@pytest.mark.parametrize("options", [
    dict(position=["rope", "none"]),
    dict(position="alibi", window=[32, None]),
    dict(position="rope", window=32, sink_logit=True),
    dict(position="p_rope", p=0.5),
    dict(position=["alibi", "p_rope"], sink_logit=True),
])
def test_causal_far_beyond_the_training_length(options):
    """At 16 x L (L = 64), changing the tokens after t leaves every logit up to t as it was."""
    model = sharp(pe.TinyLM(V, 16, 2, 2, **options))
    x = tokens(1024, batch=1)
    y = x.clone()
    y[:, 700:] = (y[:, 700:] + 1) % V
    with torch.no_grad():
        a, b = model(x), model(y)
        assert torch.isfinite(a).all()
        torch.testing.assert_close(b[:, :700], a[:, :700], rtol=0, atol=0)
        assert not torch.allclose(b[:, 700:], a[:, 700:])
