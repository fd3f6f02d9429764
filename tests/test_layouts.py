"""Tensor layouts from the user's side: stacked queries and keys with explicit ids, (batch, seq, heads, head_dim)
tensors said as such, and a scheme's hooks refusing the wrong order where the model's sizes tell."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe


def _ids(batch, seq, seed):
    """(batch, seq) strictly increasing ids, a different set per row."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 4, (batch, seq), generator=g).cumsum(-1) + torch.arange(batch)[:, None] * 5)


def _per_row(x, ids, **kw):
    """The rotation of each (batch) row of a 4-D x at its own ids, one row at a time: the meaning of (batch, seq) ids."""
    return torch.stack([pe.apply_rope(x[b], ids[b], **kw) for b in range(x.shape[0])])


# ------------------------------------------------ apply_rope on stacked (2, batch, heads, seq, dim) with (batch, seq)

@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 6), st.sampled_from([2, 4, 8]), st.booleans(),
       st.integers(0, 999))
@settings(max_examples=40, deadline=None)
def test_stacked_queries_and_keys_take_batch_ids(batch, heads, seq, dim, interleaved, seed):
    """What a scheme's rotate(qk, positions) hook receives: row b of queries and keys at ids[b], any batch and heads."""
    g = torch.Generator().manual_seed(seed)
    qk = torch.randn(2, batch, heads, seq, dim, generator=g, dtype=torch.float64)
    ids = _ids(batch, seq, seed)
    out = pe.apply_rope(qk, ids, interleaved=interleaved)
    for i in range(2):
        assert torch.allclose(out[i], _per_row(qk[i], ids, interleaved=interleaved), atol=1e-12)
    # (seq,) ids: the same positions for every row
    assert torch.allclose(pe.apply_rope(qk, ids[0]), torch.stack([pe.apply_rope(t, ids[0]) for t in qk]), atol=1e-12)


def test_stacked_ids_when_batch_equals_heads_are_read_as_batch():
    """B == H once lined the ids up with the heads silently (off by 5 to 8)."""
    qk = torch.randn(2, 3, 3, 4, 8, dtype=torch.float64)
    ids = torch.tensor([[0, 1, 2, 3], [10, 20, 30, 40], [5, 6, 7, 8]])
    assert torch.allclose(pe.apply_rope(qk, ids)[1, 2], pe.apply_rope(qk[1, 2], ids[2]), atol=1e-12)


def test_stacked_ids_of_another_batch_are_refused_clearly():
    qk = torch.randn(2, 3, 4, 5, 8)
    with pytest.raises(ValueError, match=r"\(2, batch, heads, seq, dim\)"):
        pe.apply_rope(qk, torch.arange(10).view(2, 5))


def test_a_scheme_of_your_own_rotates_at_explicit_ids_like_the_built_in_rope():
    """The apply_rope docstring's pattern: a rotate hook with positions, run by the model with ids, equals RoPE."""

    class MyRoPE(pe.PositionScheme):
        def rotate(self, qk, positions=None):
            return pe.apply_rope(qk, positions)

    ids = torch.tensor([[0, 1, 2, 5, 9, 12], [3, 4, 8, 9, 10, 20]])
    idx = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    mine, rope = (pe.TinyLM(16, 16, 1, 2, position=p) for p in (MyRoPE(), "rope"))
    rope.load_state_dict(mine.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(mine(idx, positions=ids), rope(idx, positions=ids), atol=1e-5)


# ------------------------------------------------------------------ saying the layout: layout="bshd"

@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 6), st.sampled_from([2, 6]), st.booleans(),
       st.integers(0, 999))
@settings(max_examples=30, deadline=None)
def test_apply_rope_bshd_is_the_transposed_rotation(batch, heads, seq, dim, with_ids, seed):
    x = torch.randn(batch, seq, heads, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ids = _ids(batch, seq, seed) if with_ids else None
    out = pe.apply_rope(x, ids, layout="bshd")
    assert out.shape == x.shape
    assert torch.allclose(out, pe.apply_rope(x.transpose(1, 2), ids).transpose(1, 2), atol=1e-12)


@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 7), st.booleans(), st.integers(0, 999))
@settings(max_examples=30, deadline=None)
def test_attention_bshd_attends_along_positions(batch, heads, seq, with_bias, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, seq, heads, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(heads, seq, seq, generator=g, dtype=torch.float64) if with_bias else None
    t = [x.transpose(1, 2) for x in (q, k, v)]
    ref = pe.attention(*t, bias=bias).transpose(1, 2)
    assert torch.allclose(pe.attention(q, k, v, bias=bias, layout="bshd"), ref, atol=1e-12)
    out, w = pe.attention(q, k, v, bias=bias, layout="bshd", return_weights=True)
    assert torch.allclose(out, ref, atol=1e-12) and w.shape == (batch, heads, seq, seq)
    slopes = torch.linspace(0.2, 1, heads, dtype=torch.float64)
    ref = pe.relative_attention(*t, slopes=slopes, path="naive").transpose(1, 2)
    for path in ("naive", "chunked", "bias", "fold", "auto"):
        assert torch.allclose(pe.relative_attention(q, k, v, slopes=slopes, path=path, layout="bshd"), ref,
                              atol=1e-12), path


def test_a_wrong_layout_name_is_refused_with_a_suggestion():
    x = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="did you mean 'bshd'"):
        pe.apply_rope(x, layout="bsdh")
    with pytest.raises(ValueError, match="layout must be one of"):
        pe.attention(x, x, x, layout=2)


# ------------------------------------------------------------------ the scheme hooks know the model's sizes

@pytest.mark.parametrize("position", ["rope", "p_rope", "xpos"])
def test_scheme_rotate_refuses_seq_and_heads_swapped(position):
    model = pe.TinyLM(16, 32, 1, 4, position=position)  # 4 heads of 8 channels
    scheme = model.position
    qk = torch.randn(2, 2, 4, 6, 8)  # (2, batch, heads, seq, head_dim)
    assert scheme.rotate(qk).shape == qk.shape
    with pytest.raises(ValueError, match=r"transpose seq and heads"):
        scheme.rotate(qk.transpose(2, 3).contiguous())  # (2, batch, seq, heads, head_dim)
    with pytest.raises(ValueError, match="stacked"):
        scheme.rotate(qk[0])  # q alone
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        scheme.rotate(qk, positions=torch.arange(12).view(6, 2))
