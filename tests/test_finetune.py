"""pe.train(..., init=earlier): fine-tuning a trained model, cached under its own key."""

import pytest
import torch

import posenc as pe


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


DATA = pe.MarkovChain(vocab_size=12, order=1, seed=0)


def tiny(**kw):
    return pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="rope", **kw)


def run(model, **kw):
    kw = dict(dict(steps=12, seq_len=16, batch_size=4, progress=False), **kw)
    return pe.train(model, DATA, **kw)


def test_fine_tune_starts_from_the_earlier_weights_and_has_its_own_key():
    base = run(tiny(), steps=60, lr=1e-2)
    tuned = run(tiny(), init=base, seq_len=32, steps=5, lr=1e-3, warmup=0)
    scratch = run(tiny(), seq_len=32, steps=5, lr=1e-3, warmup=0)
    assert len({base.key, tuned.key, scratch.key}) == 3
    assert tuned.config["init"] == base.key and "init" not in scratch.config
    assert not tuned.from_cache and tuned.steps_run == 5
    # the first step started from the trained model: its loss is the trained model's, not a fresh one's
    assert tuned.losses[0] < scratch.losses[0] - 0.2, (tuned.losses[0], scratch.losses[0])
    # zero learning rate: the weights are the earlier ones
    frozen = run(tiny(), init=base, seq_len=32, steps=1, lr=1e-12, warmup=0)
    for (name, p), q in zip(frozen.model.state_dict().items(), base.model.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), name


def test_re_running_a_fine_tune_loads_from_the_cache():
    base = run(tiny())
    first = run(tiny(), init=base, seq_len=32, steps=4)
    again = run(tiny(), init=run(tiny()), seq_len=32, steps=4)  # the base itself comes from the cache
    assert again.from_cache and again.steps_run == 0 and again.key == first.key
    assert again.losses == first.losses
    for p, q in zip(again.model.state_dict().values(), first.model.state_dict().values()):
        assert torch.equal(p.cpu(), q.cpu())
    # fine-tuning the same model object in place works too
    model = tiny()
    start = run(model)
    assert run(model, init=start, seq_len=32, steps=4).key == first.key


def test_chained_fine_tunes_and_evaluation_time_settings_enter_the_key():
    base = run(tiny())
    one = run(tiny(), init=base, seq_len=32, steps=3)
    two = run(tiny(), init=one, seq_len=32, steps=3)
    assert two.config["init"] == one.key and two.key != one.key
    scaled_model = tiny()
    scaled_model.train_len = 16
    scaled_model.rope_scaling = ("linear", 2)
    scaled = run(scaled_model, init=base, seq_len=32, steps=3)
    assert scaled.config["train"]["rope_scaling"] == {"method": "linear", "factor": 2.0}
    assert scaled.key != one.key
    sinks_model = tiny()
    sinks_model.window, sinks_model.sinks = 8, 2
    assert run(sinks_model, seq_len=32, steps=3).config["train"]["sinks"] == 2
    plain = run(tiny(), seq_len=32, steps=3)
    assert "sinks" not in plain.config["train"] and "rope_scaling" not in plain.config["train"]


def test_mismatched_architecture_or_bad_init_raises():
    base = run(tiny())
    with pytest.raises(ValueError, match="same architecture"):
        run(pe.TinyLM(12, d_model=64, n_layers=1, n_heads=2, position="rope"), init=base)
    with pytest.raises(ValueError, match="same architecture"):
        run(tiny(partial=0.5), init=base)
    with pytest.raises(ValueError, match="same architecture"):
        run(pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="alibi"), init=base)
    with pytest.raises(ValueError, match="TrainResult"):
        run(tiny(), init=base.model)


def test_abf_continued_training_with_a_raised_rope_base():
    """Xiong et al. (2023): the same weights, trained on with RoPE's base raised (10,000 -> 500,000)."""
    base = run(tiny(), steps=40, lr=1e-2)
    raised = pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="rope", base=500_000.0)
    frozen = run(raised, init=base, seq_len=32, steps=1, lr=1e-12, warmup=0)
    assert frozen.model.position.base == 500_000.0 and frozen.config["init"] == base.key
    for (name, p), q in zip(frozen.model.state_dict().items(), base.model.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), name              # the earlier weights, now under the new base
    x = DATA.batch(2, 32, generator=torch.Generator().manual_seed(1))[0]
    with torch.no_grad():                                         # the base is live: same weights, other logits
        assert not torch.allclose(frozen.model(x), base.model(x), atol=1e-3)
    same_base = run(tiny(), init=base, seq_len=32, steps=1, lr=1e-12, warmup=0)
    assert same_base.key != frozen.key                            # the base is in the key
    tuned = run(pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="rope", base=500_000.0),
                init=base, seq_len=32, steps=5, lr=1e-3, warmup=0)
    again = run(pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="rope", base=500_000.0),
                init=run(tiny(), steps=40, lr=1e-2), seq_len=32, steps=5, lr=1e-3, warmup=0)
    assert again.from_cache and again.key == tuned.key


@pytest.mark.parametrize("start, then", [
    (dict(position="p_rope"), dict(position=pe.PRoPE(base=1e6))),
    (dict(n_layers=2, position=["rope", "none"]), dict(n_layers=2, position=[pe.RoPE(base=1e6), "none"])),
])
def test_abf_for_p_rope_and_per_layer_schemes(start, then):
    make = lambda kw: pe.TinyLM(12, **dict(dict(d_model=32, n_layers=1, n_heads=2), **kw))
    base = run(make(start))
    assert run(make(then), init=base, steps=2).config["init"] == base.key


def test_only_the_base_may_differ():
    base = run(tiny())
    for other in [pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="xpos", base=1e6),   # xPos: not RoPE
                  pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position=pe.RoPE(base=1e6, interleaved=True)),
                  pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="p_rope", base=1e6)]:
        with pytest.raises(ValueError, match="only a RoPE base may differ"):
            run(other, init=base)
    xpos = run(pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="xpos"))
    with pytest.raises(ValueError, match="same architecture"):
        run(pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position="xpos", base=1e6), init=xpos)  # RoPE family only


def test_what_may_differ_is_declared_by_the_scheme_class():
    assert pe.RoPE.retunable == ("base",) and pe.PRoPE.retunable == ("base",)     # p-RoPE inherits it
    assert pe.PositionScheme.retunable == () and pe.position_scheme("alibi").retunable == ()

    class Fixed(pe.PositionScheme):
        """A bias -temperature * distance with no weights."""
        def __init__(self, temperature=1.0):
            super().__init__()
            self.temperature = float(temperature)

        def distance_bias(self, length, *, device, dtype):
            return -self.temperature * torch.arange(length, dtype=dtype, device=device).expand(self.n_heads, -1)

    class Tempered(Fixed):
        """The same, declaring that a fine-tune may change the temperature."""
        retunable = ("temperature",)

    make = lambda cls, t: pe.TinyLM(12, d_model=32, n_layers=1, n_heads=2, position=cls(t))
    base = run(make(Tempered, 1.0))
    assert run(make(Tempered, 0.5), init=base, steps=2).config["init"] == base.key
    with pytest.raises(ValueError, match="same architecture"):                   # not declared: all must match
        run(make(Fixed, 0.5), init=run(make(Fixed, 1.0)))
