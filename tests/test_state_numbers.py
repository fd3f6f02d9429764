"""TinyLM.state_numbers: what a model keeps per head to generate the next token, against the states the layers carry."""

import pytest
import torch
from hypothesis import given, strategies as st

import posenc as pe


def tiny(attention="softmax", n_heads=4, d_model=32, n_layers=2, **kwargs):
    position = "none" if attention in ("decay", "gated", "linear", "norm") else "rope"
    return pe.TinyLM(8, d_model, n_layers, n_heads, position=position, attention=attention, **kwargs)


@pytest.mark.parametrize("kind", ["decay", "gated"])
@pytest.mark.parametrize("n", [1, 7, 200])
def test_a_decayed_layer_keeps_the_state_its_recurrence_returns(kind, n):
    model = tiny(kind)
    d = model.d_model // model.n_heads
    q, k, v = torch.randn(3, 1, model.n_heads, n, d)
    _, state = pe.decayed_linear_attention(q, k, v, [0.9] * model.n_heads, return_state=True)
    assert state.shape == (1, model.n_heads, d, d)
    assert model.state_numbers(n) == model.n_layers * state[0, 0].numel()


def test_a_linear_layer_keeps_its_state_and_normaliser_and_grows_with_nothing():
    model = tiny("linear")
    d = model.d_model // model.n_heads
    assert model.state_numbers(1) == model.state_numbers(10_000) == model.n_layers * (d * d + d)
    assert tiny("norm").state_numbers(50) == 2 * d * d


@given(n=st.integers(1, 5000), heads=st.sampled_from([1, 2, 4, 8]), layers=st.integers(1, 4),
       window=st.one_of(st.none(), st.integers(1, 300)), sinks=st.integers(0, 8))
def test_a_softmax_layer_keeps_a_key_and_a_value_per_token_it_can_still_read(n, heads, layers, window, sinks):
    model = tiny(n_heads=heads, n_layers=layers)
    d = 64 // heads
    d = model.d_model // heads
    model.window = window
    model.sinks = sinks if window is not None else 0
    kept = n if window is None else min(n, window + model.sinks)
    assert model.state_numbers(n) == layers * 2 * d * kept
    if window is None:                                    # the cache grows with n, one key and value at a time
        assert model.state_numbers(n + 1) - model.state_numbers(n) == layers * 2 * d


def test_layouts_add_their_layers():
    model = tiny(["diag", "norm"], diag_block=16)          # TransNormer: a local layer, then a global one
    d = model.d_model // model.n_heads
    assert model.state_numbers(5) == 2 * d * 5 + d * d
    assert model.state_numbers(1024) == 2 * d * 16 + d * d
    mixed = pe.TinyLM(8, 32, 3, 4, position="rope", window=[8, None, None])
    assert mixed.state_numbers(100) == 2 * 8 * (8 + 100 + 100)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "64", None])
def test_a_bad_length_is_refused(bad):
    with pytest.raises(ValueError, match="n"):
        tiny().state_numbers(bad)
