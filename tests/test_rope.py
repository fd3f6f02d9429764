import pytest
import torch

import posenc as pe

CONVENTIONS = [False, True]  # half-split, interleaved


def test_frequencies_published_formula():
    d, base = 64, 10000.0
    theta = pe.rope_frequencies(d, base)
    assert theta.shape == (32,)
    assert theta.dtype == torch.float64
    expected = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert torch.allclose(theta, expected, rtol=1e-14)
    assert theta[0] == 1.0  # negative exponent: the first pair turns fastest


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_norm_preserved(interleaved):
    x = torch.randn(2, 3, 50, 16, dtype=torch.float64)
    y = pe.apply_rope(x, interleaved=interleaved)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-12)


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_scores_depend_only_on_offset(interleaved):
    d = 32
    q = torch.randn(d, dtype=torch.float64)
    k = torch.randn(d, dtype=torch.float64)
    positions = torch.tensor([0.0, 3.0, 17.0, 100.0, 1000.0, 12345.0])
    rq = pe.apply_rope(q.expand(6, d), positions, interleaved=interleaved)
    rk = pe.apply_rope(k.expand(6, d), positions, interleaved=interleaved)
    scores = rq @ rk.T  # [a, b] = <R_{m_a} q, R_{m_b} k>
    for shift in (1.0, 250.0, 99999.0):
        sq = pe.apply_rope(q.expand(6, d), positions + shift, interleaved=interleaved)
        sk = pe.apply_rope(k.expand(6, d), positions + shift, interleaved=interleaved)
        assert torch.allclose(sq @ sk.T, scores, atol=1e-8)
    # and equals <q, R_{n-m} k>
    for a in range(6):
        for b in range(6):
            rel = pe.apply_rope(k[None], (positions[b] - positions[a])[None], interleaved=interleaved)
            assert torch.allclose(q @ rel[0], scores[a, b], atol=1e-8)


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_elementwise_equals_block_diagonal_matrix(interleaved):
    d = 12
    x = torch.randn(5, d, dtype=torch.float64)
    for m in (0, 1, 7, 1000):
        r = pe.rope_rotation_matrix(m, d, interleaved=interleaved)
        assert torch.allclose(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-12)
        got = pe.apply_rope(x, torch.full((5,), float(m)), interleaved=interleaved)
        assert torch.allclose(got, x @ r.T, atol=1e-12)


def test_interleaved_matrix_is_block_diagonal_2x2():
    r = pe.rope_rotation_matrix(3, 8, interleaved=True)
    block = torch.block_diag(*[r[2 * i:2 * i + 2, 2 * i:2 * i + 2] for i in range(4)])
    assert torch.equal(r, block)


def test_position_zero_is_identity_and_composition():
    x = torch.randn(4, 8, dtype=torch.float64)
    assert torch.allclose(pe.apply_rope(x, torch.zeros(4)), x)
    twice = pe.apply_rope(pe.apply_rope(x, torch.full((4,), 3.0)), torch.full((4,), 4.0))
    assert torch.allclose(twice, pe.apply_rope(x, torch.full((4,), 7.0)), atol=1e-12)


def test_conventions_agree_after_channel_permutation():
    d = 16
    q, k = torch.randn(2, 10, d, dtype=torch.float64)
    inter = pe.apply_rope(q, interleaved=True) @ pe.apply_rope(k, interleaved=True).T
    q_h, k_h = pe.interleaved_to_half_split(q), pe.interleaved_to_half_split(k)
    half = pe.apply_rope(q_h, interleaved=False) @ pe.apply_rope(k_h, interleaved=False).T
    assert torch.allclose(inter, half, atol=1e-10)
    assert torch.equal(pe.half_split_to_interleaved(q_h), q)


def test_mixed_conventions_break_relative_property():
    # half-split cos/sin layout with the interleaved rotation: a known source of bugs
    d = 16
    q, k = torch.randn(2, d, dtype=torch.float64)

    def wrong(x, m):
        cos, sin = pe.rope_cos_sin(torch.tensor([float(m)]), d, interleaved=False, dtype=torch.float64)
        even, odd = x[0::2], x[1::2]
        rotated = torch.stack((-odd, even), -1).flatten()
        return x * cos[0] + rotated * sin[0]

    s1 = wrong(q, 5) @ wrong(k, 2)
    s2 = wrong(q, 105) @ wrong(k, 102)
    assert not torch.allclose(s1, s2, atol=1e-3)


def test_precision_at_a_million_positions():
    x = torch.randn(1, 8, 64)
    pos = torch.tensor([1_000_000.0, 999_999.0] + [0.0] * 6)
    y = pe.apply_rope(x, pos)
    ref = pe.apply_rope(x.double(), pos.double())
    assert torch.allclose(y.double(), ref, atol=1e-5)
    # the same angles multiplied out in float32 would be off by hundredths of a radian
    theta = pe.rope_frequencies(64)
    naive = torch.cos(torch.tensor(999_999.0) * theta.float()).double()
    exact = torch.cos(999_999.0 * theta)
    assert (naive - exact).abs().max() > 1e-3
    assert y.dtype == torch.float32


def test_shapes_and_dtype_preserved():
    x = torch.randn(2, 4, 7, 8, dtype=torch.bfloat16)
    y = pe.apply_rope(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16


def test_broadcast_positions_per_batch():
    x = torch.randn(2, 1, 5, 8, dtype=torch.float64)
    pos = torch.stack([torch.arange(5), torch.arange(5) + 10]).double()[:, None, :]  # (2, 1, 5)
    y = pe.apply_rope(x, pos)
    assert torch.allclose(y[1], pe.apply_rope(x[1], torch.arange(10, 15).double()))


@pytest.mark.parametrize("dim", [1, 7, 15])
def test_odd_dim_raises(dim):
    with pytest.raises(ValueError, match="even"):
        pe.apply_rope(torch.randn(3, dim))


def test_bad_positions_and_base():
    with pytest.raises(ValueError, match="sequence length"):
        pe.apply_rope(torch.randn(3, 8), torch.arange(4))
    with pytest.raises(ValueError, match="base"):
        pe.rope_frequencies(8, base=0.5)


# --- input rules: positions per batch, kinds of input, empty and meta tensors -------------------------


def _reference_rope(x, positions, base=10000.0, interleaved=False):
    """Row by row with the explicit float64 rotation matrices: x (..., seq, d), positions (..., seq)."""
    out = torch.empty(x.shape, dtype=torch.float64)
    for index in torch.cartesian_prod(*[torch.arange(n) for n in x.shape[:-1]]).view(-1, x.ndim - 1).tolist():
        r = pe.rope_rotation_matrix(float(positions[tuple(index)]), x.shape[-1], base, interleaved)
        out[tuple(index)] = r @ x[tuple(index)].double()
    return out


@pytest.mark.parametrize("interleaved", CONVENTIONS)
def test_batch_positions_apply_to_every_head_when_batch_equals_heads(interleaved):
    # (batch, seq) positions of a (batch, heads, seq, dim) x are per batch row, shared by the heads:
    # with batch == heads they used to be applied per head, silently.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 3, 4, 8, dtype=torch.float64, generator=g)
    pos = torch.tensor([[0, 1, 2, 3], [100, 101, 105, 200], [7, 3, 5, 9]])
    expected = _reference_rope(x, pos[:, None, :].expand(3, 3, 4), interleaved=interleaved)
    assert torch.allclose(pe.apply_rope(x, pos, interleaved=interleaved), expected, atol=1e-12)
    assert torch.allclose(pe.apply_rope(x, pos[:, None, :], interleaved=interleaved), expected, atol=1e-12)
    # per-head positions are spelled (batch, heads, seq) or (1, heads, seq)
    per_head = torch.arange(36).view(3, 3, 4) * 7
    assert torch.allclose(pe.apply_rope(x, per_head, interleaved=interleaved),
                          _reference_rope(x, per_head, interleaved=interleaved), atol=1e-12)
    heads_only = pos[None]  # (1, heads, seq)
    assert torch.allclose(pe.apply_rope(x, heads_only, interleaved=interleaved),
                          _reference_rope(x, heads_only.expand(3, 3, 4), interleaved=interleaved), atol=1e-12)


@pytest.mark.parametrize("x_shape,pos_shape", [
    ((1, 2, 5, 8), (3, 5)),        # (batch, seq) with the wrong batch
    ((1, 2, 5, 8), (2, 1, 5)),     # would broadcast x's batch of 1 up to 2
    ((5, 8), (2, 5)),              # would add a dimension to x
    ((2, 5, 8), (1, 2, 5)),        # likewise
    ((2, 2, 5, 8), (1, 1, 1, 5)),  # too many dimensions
    ((2, 2, 5, 8), (2, 4)),        # wrong length
])
def test_positions_that_would_change_the_output_shape_raise(x_shape, pos_shape):
    with pytest.raises(ValueError, match="positions"):
        pe.apply_rope(torch.randn(x_shape), torch.zeros(pos_shape))


def test_kinds_of_input():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    for bad in (x.long(), x > 0, x.to(torch.complex128)):
        with pytest.raises(ValueError, match="floating-point"):
            pe.apply_rope(bad)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        pe.apply_rope(x.tolist())
    # NumPy float arrays are converted; integer and NumPy positions are fine
    assert torch.equal(pe.apply_rope(x.numpy()), pe.apply_rope(x))
    assert torch.equal(pe.apply_rope(x, torch.arange(5).numpy()), pe.apply_rope(x, torch.arange(5.0)))
    assert torch.equal(pe.apply_rope(x, [0, 1, 2, 3, 4]), pe.apply_rope(x))
    for bad in (torch.ones(5, dtype=torch.bool), torch.tensor([0, 1, float("nan"), 3, 4]),
                torch.tensor([0, 1, 2, 3, float("inf")])):
        with pytest.raises(ValueError, match="positions"):
            pe.apply_rope(x, bad)
    with pytest.raises(TypeError, match="positions"):
        pe.apply_rope(x, "01234")
    with pytest.raises(ValueError, match="dtype"):
        pe.rope_cos_sin(torch.arange(3), 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype"):
        pe.rope_cos_sin(torch.arange(3), 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="device"):
        pe.rope_cos_sin(torch.arange(3), 8, device="nowhere")


@pytest.mark.parametrize("base", [float("nan"), float("inf"), -float("inf"), 1, 0.5, True, "10000", None,
                                  torch.tensor(float("nan"))])
def test_bad_bases_raise_everywhere(base):
    for call in (lambda: pe.rope_frequencies(8, base), lambda: pe.apply_rope(torch.randn(3, 8), base=base),
                 lambda: pe.rope_angles(torch.arange(3), 8, base), lambda: pe.rope_rotation_matrix(1, 8, base),
                 lambda: pe.RotaryEmbedding(8, base), lambda: pe.RoPE(base)):
        with pytest.raises(ValueError, match="base"):
            call()


def test_bad_inv_freq_raises():
    for bad in (torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("inf")]), torch.ones(3),
                torch.ones(2, dtype=torch.bool)):
        with pytest.raises(ValueError, match="inv_freq"):
            pe.apply_rope(torch.randn(3, 4), inv_freq=bad)
        with pytest.raises(ValueError, match="inv_freq"):
            pe.rope_angles(torch.arange(3), 4, inv_freq=bad)


def test_empty_sequences_give_empty_outputs():
    x = torch.randn(2, 3, 0, 8)
    assert pe.apply_rope(x).shape == (2, 3, 0, 8)
    assert pe.apply_rope(x, torch.zeros(0)).shape == (2, 3, 0, 8)
    cos, sin = pe.rope_cos_sin(torch.zeros(0), 8)
    assert cos.shape == sin.shape == (0, 8)
    assert pe.interleaved_to_half_split(torch.randn(0, 8)).shape == (0, 8)
    assert pe.rope_decay_bound(torch.zeros(0), 8).shape == (0,)


def test_meta_tensors_give_shapes():
    x = torch.empty(2, 3, 5, 8, device="meta")
    for y in (pe.apply_rope(x), pe.apply_rope(x, torch.arange(5)), pe.apply_rope(x, torch.arange(10).view(2, 5))):
        assert y.device.type == "meta" and y.shape == x.shape and y.dtype == x.dtype


def test_messages_name_what_was_expected():
    with pytest.raises(ValueError, match="single number"):
        pe.apply_rope(torch.randn(2, 5, 8), torch.tensor(3.0))
    with pytest.raises(ValueError, match="position must be a finite number"):
        pe.rope_rotation_matrix("3", 8)
    with pytest.raises(ValueError, match="last dimension"):
        pe.interleaved_to_half_split(torch.tensor(1.0))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        pe.half_split_to_interleaved([1.0, 2.0])
    with pytest.raises(ValueError, match="apply_rope expects x of shape"):
        pe.apply_rope(torch.randn(8))
