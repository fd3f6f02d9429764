"""model(idx, positions=...): explicit position ids for every kind of scheme."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe

V = 11
RELATIVE = ["none", "rope", "alibi", "kerple_power", "kerple_log", "sandwich", "xpos", "t5", "p_rope"]


def build(position, **kw):
    if position == "learned":
        kw.setdefault("max_len", 256)
    model = pe.TinyLM(V, 16, 2, 2, position=position, **kw)
    with torch.no_grad():  # sharper attention than at initialisation, so that positions show in the logits
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)
    return model.eval()


def tokens(n, batch=2, seed=0):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def increasing(batch, n, top, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(top, generator=g)[:n].sort().values for _ in range(batch)])


@pytest.mark.parametrize("position", pe.POSITION_SCHEMES)
def test_contiguous_ids_give_today_s_output(position):
    model, x = build(position), tokens(30)
    with torch.no_grad():
        plain = model(x)
        torch.testing.assert_close(model(x, positions=torch.arange(30)), plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(x, positions=torch.arange(30).expand(2, 30)), plain, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(position=st.sampled_from(RELATIVE), shift=st.integers(1, 500), seed=st.integers(0, 100))
def test_relative_schemes_ignore_a_shift_of_every_id(position, shift, seed):
    model, x = build(position), tokens(20, seed=seed)
    ids = increasing(2, 20, 80, seed)
    with torch.no_grad():
        torch.testing.assert_close(model(x, positions=ids + shift), model(x, positions=ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_absolute_schemes_read_the_table_at_the_ids(position):
    model, x = build(position), tokens(20)
    ids = increasing(2, 20, 80, 1)
    embedded = model.position.embed(model.tok(x), positions=ids)
    rows = (model.position.table.detach() if position == "learned"
            else pe.sinusoidal_embedding(100, 16))
    torch.testing.assert_close(embedded, model.tok(x) + rows[ids])
    with torch.no_grad():
        assert not torch.allclose(model(x, positions=ids + 3), model(x, positions=ids), atol=1e-3)


class _Table(pe.PositionScheme):
    """A bias f(d) read from a formula, with a factor on the distance."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def distance_bias(self, length, *, device, dtype):
        d = torch.arange(length, device=device, dtype=dtype) * self.factor
        return torch.stack([-0.3 * d, -torch.log1p(d)])                     # (heads=2, length)


def test_a_bias_reads_the_ids_differences():
    """Ids 0, 2, 4, ... under the bias f(d) are contiguous ids under f(2d)."""
    spaced, doubled = build(_Table(1.0)), build(_Table(2.0))
    doubled.load_state_dict(spaced.state_dict())
    x = tokens(25)
    with torch.no_grad():
        torch.testing.assert_close(spaced(x, positions=2 * torch.arange(25)), doubled(x), rtol=1e-5, atol=1e-5)


def test_alibi_reads_the_ids_differences():
    model, x = build("alibi"), tokens(12)
    ids = increasing(1, 12, 40, 3)[0]
    _, weights = model(x, positions=ids, return_attention=True)
    q_k = model.attention_inputs(x)[0]                                          # layer 0's input
    qkv = model.blocks[0].attn._qkv(q_k)
    d = (ids[:, None] - ids[None, :]).float()
    scores = qkv[0] @ qkv[1].transpose(-2, -1) / 8 ** 0.5 - model.position.slopes()[:, None, None] * d
    expected = torch.softmax(scores.masked_fill(d < 0, float("-inf")), -1)
    torch.testing.assert_close(weights[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "xpos"])
def test_rotations_turn_by_the_ids(position):
    model = build(position)
    qk = torch.randn(2, 2, 2, 10, 8)
    ids = increasing(2, 10, 50, 4)
    out = model.position.rotate(qk, positions=ids)
    if position == "rope":
        torch.testing.assert_close(out, torch.stack([pe.apply_rope(t, ids) for t in qk]))
    else:
        torch.testing.assert_close(out, torch.stack(pe.apply_xpos(qk[0], qk[1], ids)))


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_ids_stay_causal_and_serve_the_loss(position):
    model, x = build(position), tokens(24)
    ids = increasing(2, 24, 100, 5)
    with torch.no_grad():
        out = model(x, positions=ids)
        y = x.clone()
        y[:, 12:] = (y[:, 12:] + 1) % V
        torch.testing.assert_close(model(y, positions=ids)[:, :12], out[:, :12], rtol=0, atol=0)
    loss = model.loss(x[:, :-1], x[:, 1:], positions=ids[:, :-1])
    assert torch.isfinite(loss) and loss.ndim == 0


def test_a_window_counts_tokens():
    model, x = build("alibi", window=6), tokens(20)
    ids = increasing(2, 20, 60, 6)
    with torch.no_grad():
        torch.testing.assert_close(model(x, positions=ids + 11), model(x, positions=ids), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        windowed = model(x, positions=ids)
        model.window = None
        assert not torch.allclose(model(x, positions=ids), windowed, atol=1e-4)
        torch.testing.assert_close(windowed[:, :6], model(x, positions=ids)[:, :6])   # the first 6 see all anyway


@pytest.mark.parametrize("positions, match", [
    (torch.tensor([0, 2, 2, 5]), "strictly increasing"),
    (torch.tensor([3, 2, 5, 7]), "strictly increasing"),
    (torch.tensor([-1, 0, 1, 2]), ">= 0"),
    (torch.arange(5), r"shape \(4,\)"),
    (torch.arange(4.0), "integer ids"),
    ([0, 1, 2, 3], "integer ids"),
])
def test_bad_ids_are_refused(positions, match):
    with pytest.raises(ValueError, match=match):
        build("rope")(tokens(4, batch=1), positions=positions)


def test_what_ids_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="larger max_len"):
        pe.TinyLM(V, 16, 1, 2, position="learned", max_len=8)(tokens(4), positions=torch.tensor([0, 1, 2, 8]))

    class OldRotation(pe.PositionScheme):
        def rotate(self, qk):
            return qk

    with pytest.raises(ValueError, match="takes no positions argument"):
        pe.TinyLM(V, 16, 1, 2, position=OldRotation())(tokens(4), positions=torch.arange(4))
    model = pe.TinyLM(V, 16, 1, 2, position="rope")
    model.rope_scaling = ("rerope", 4)
    with pytest.raises(ValueError, match="ReRoPE"):
        model(tokens(6), positions=torch.arange(6))
