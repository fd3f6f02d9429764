"""Models with positions from the content (FoX, stick-breaking, CoPE, SSMax): causal, finite far out, train, save."""

import pytest
import torch

import posenc as pe

#: name -> TinyLM arguments (besides vocab_size, d_model, n_layers, n_heads)
KINDS = {
    "forgetting": dict(position="none", attention="forgetting"),
    "forgetting_rope": dict(position="rope", attention="forgetting"),
    "stick_breaking": dict(position="none", attention="stick_breaking"),
    "cope": dict(position="cope", n_positions=8),
    "ssmax": dict(position="rope", log_n_scaling="ssmax"),
}


def _model(name, seed=0):
    torch.manual_seed(seed)
    model = pe.TinyLM(12, 16, 2, 2, **KINDS[name])
    with torch.no_grad():  # not the zeros / ones they start from, so every part matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("name", list(KINDS))
def test_future_tokens_change_nothing_before_them(name):
    model = _model(name)
    idx = torch.randint(0, 12, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 1 + torch.randint(0, 10, (2, 8))) % 12
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


@pytest.mark.parametrize("name", list(KINDS))
def test_finite_at_sixteen_times_the_training_length(name):
    model = _model(name)
    with torch.no_grad():
        logits = model(torch.randint(0, 12, (1, 16 * 16)))  # trained at 16 below: 16 x 16 tokens
    assert bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("name", list(KINDS))
def test_trains_a_few_steps_and_round_trips_a_file(name, tmp_path):
    model = pe.TinyLM(8, 16, 2, 2, **KINDS[name])
    result = pe.train(model, pe.MarkovChain(vocab_size=8, order=2, seed=0), steps=4, seq_len=16, batch_size=2,
                      cache=False, progress=False, device="cpu")
    assert len(result.losses) == 4 and bool(torch.isfinite(torch.tensor(result.losses)).all())
    trained = result.model
    pe.save_model(trained, tmp_path / "model.pt")
    again = pe.load_model(tmp_path / "model.pt")
    assert again.config == trained.config
    idx = torch.randint(0, 8, (2, 24))
    with torch.no_grad():
        assert torch.equal(again(idx), trained(idx))
        assert bool(torch.isfinite(trained.loss(idx[:, :-1], idx[:, 1:])))


def test_state_numbers_and_attention_weights():
    fox, sb = _model("forgetting"), _model("stick_breaking")
    d = 8
    assert fox.state_numbers(10) == 2 * (2 * d + 1) * 10 and sb.state_numbers(10) == 2 * 2 * d * 10
    for model in (fox, sb, _model("cope"), _model("ssmax")):
        _, weights = model(torch.randint(0, 12, (1, 9)), return_attention=True)
        for w in weights:
            torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 9))
            assert bool((w.triu(1) == 0).all())


def test_refusals():
    with pytest.raises(ValueError, match="bias"):
        pe.TinyLM(8, 16, 1, 2, position="alibi", attention="forgetting")
    with pytest.raises(ValueError, match="window"):
        pe.TinyLM(8, 16, 1, 2, position="none", attention="stick_breaking", window=4)
    with pytest.raises(ValueError, match="attention"):
        pe.TinyLM(8, 16, 1, 2, attention="forgeting")
    with pytest.raises(ValueError, match="forget_bias"):
        pe.TinyLM(8, 16, 1, 2, attention="forgetting", forget_bias=float("nan"))


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(KINDS))
def test_bf16_autocast_is_close_to_float32_and_trains(device, name):
    """As tests/test_cuda.py for the schemes: logits under bf16 autocast near float32, finite gradients."""
    model = _model(name).to(device)
    idx = torch.randint(0, 12, (2, 128), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        ref = model(idx)
        with torch.autocast(device, dtype=torch.bfloat16):
            got = model(idx).float()
    assert bool(torch.isfinite(got).all()) and float((got - ref).abs().max()) < 3e-2 * float(ref.abs().max())
    with torch.autocast(device, dtype=torch.bfloat16):
        model.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
