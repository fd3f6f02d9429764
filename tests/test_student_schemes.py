"""A scheme of one's own, written as a student would: reproducible, cached, and keyed by everything that shapes it."""

import sys
import types

import numpy as np
import pytest
import torch

import posenc as pe

DATA = pe.MarkovChain(8, order=1, seed=0)
RUN = dict(steps=4, seq_len=8, batch_size=2, progress=False)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


class MLPBias(pe.PositionScheme):
    """FIRE-like: a bias per head from an MLP of log(1 + d), written with nn.Linear."""

    def __init__(self, n_heads, hidden=8):
        super().__init__()
        self.hidden = hidden
        self.mlp = torch.nn.Sequential(torch.nn.Linear(1, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_heads))

    def distance_bias(self, length, *, device, dtype):
        d = torch.log1p(torch.arange(length, device=device, dtype=dtype))[:, None]  # (length, 1)
        return self.mlp(d).T                                                           # (heads, length)


def model():
    return pe.TinyLM(8, 16, 1, 2, position=MLPBias(2))


def test_a_scheme_with_linear_layers_trains_the_same_whatever_ran_before():
    torch.manual_seed(1)
    first = pe.train(model(), DATA, **RUN)
    torch.manual_seed(2)  # another global RNG state: other initial nn.Linear weights at construction
    np.random.seed(3)
    again = pe.train(model(), DATA, **RUN)
    assert again.from_cache and again.key == first.key and again.losses == first.losses
    fresh = pe.train(model(), DATA, cache=False, **RUN)
    assert fresh.losses == first.losses
    other_seed = pe.train(model(), DATA, cache=False, **dict(RUN, seed=1))
    w0 = first.model.position.mlp[0].weight
    assert not torch.equal(other_seed.model.position.mlp[0].weight, w0)  # drawn from the training seed


def test_the_global_generator_is_left_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    m = model()
    m.position.reset_parameters(torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), expected)


def test_a_tensor_held_by_the_scheme_keeps_its_value_and_enters_the_key():
    class Slope(pe.PositionScheme):
        def __init__(self, start):
            super().__init__()
            self.slope = torch.nn.Parameter(torch.full((2,), start))

        def distance_bias(self, length, *, device, dtype):
            return -self.slope[:, None] * torch.arange(length, device=device, dtype=dtype)

    a = pe.train(pe.TinyLM(8, 16, 1, 2, position=Slope(0.5)), DATA, **dict(RUN, steps=1, lr=1e-9))
    assert torch.allclose(a.model.position.slope, torch.full((2,), 0.5), atol=1e-6)
    b = pe.train(pe.TinyLM(8, 16, 1, 2, position=Slope(0.25)), DATA, **dict(RUN, steps=1, lr=1e-9))
    assert a.key != b.key


def test_a_private_setting_is_in_the_key():
    class Scaled(pe.PositionScheme):
        def __init__(self, scale):
            super().__init__()
            self._scale = scale

        def distance_bias(self, length, *, device, dtype):
            return -self._scale * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)

    one = pe.TinyLM(8, 16, 1, 2, position=Scaled(0.5)).config
    two = pe.TinyLM(8, 16, 1, 2, position=Scaled(0.25)).config
    assert one != two and one["position"]["_scale"] == 0.5


def test_a_module_constant_is_in_the_key():
    def build(rate):
        module = types.ModuleType("student_homework")
        module.RATE = rate
        exec("import torch, posenc as pe\n"
             "class Decay(pe.PositionScheme):\n"
             "    def distance_bias(self, length, *, device, dtype):\n"
             "        return -RATE * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)\n",
             module.__dict__)
        sys.modules["student_homework"] = module
        try:
            return pe.TinyLM(8, 16, 1, 2, position=module.Decay()).config
        finally:
            del sys.modules["student_homework"]

    assert build(0.5) == build(0.5)
    assert build(0.5) != build(0.25)


def test_a_hand_written_alibi_with_a_buffer_named_slopes_is_told_what_to_do():
    class MyALiBi(pe.PositionScheme):
        def __init__(self):
            super().__init__()
            self.register_buffer("slopes", pe.alibi_slopes(2))

    with pytest.raises(ValueError, match="override slopes\\(\\)"):
        MyALiBi()
