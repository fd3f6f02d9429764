import pytest
import torch

import posenc as pe


def test_relative_positions_square():
    rel = pe.relative_positions(4)
    i, j = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    assert torch.equal(rel, j - i)


def test_relative_positions_bottom_right_alignment():
    # 2 queries, 5 keys: queries sit at key positions 3 and 4
    rel = pe.relative_positions(2, 5)
    assert rel.shape == (2, 5)
    assert rel[0, 3] == 0 and rel[1, 4] == 0
    assert rel[0, 0] == -3 and rel[1, 0] == -4


def test_causal_mask_is_lower_triangular():
    m = pe.causal_mask(5)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_with_cache_matches_last_rows():
    full = pe.causal_mask(6)
    assert torch.equal(pe.causal_mask(2, 6), full[-2:])


@pytest.mark.parametrize("window", [1, 2, 3, 7])
def test_sliding_window_counts(window):
    n = 10
    m = pe.sliding_window_mask(n, window=window)
    # row i sees min(i + 1, window) keys, all at or before i
    assert torch.equal(m.sum(-1), torch.clamp(torch.arange(1, n + 1), max=window))
    assert not (m & ~pe.causal_mask(n)).any()


def test_sliding_window_large_equals_causal():
    assert torch.equal(pe.sliding_window_mask(6, window=100), pe.causal_mask(6))


def test_sliding_window_bidirectional_is_symmetric():
    m = pe.sliding_window_mask(7, window=3, causal=False)
    assert torch.equal(m, m.T)
    assert m.sum(-1).max() == 5


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_window(bad):
    with pytest.raises(ValueError, match="window"):
        pe.sliding_window_mask(4, window=bad)


def test_bad_lengths():
    with pytest.raises(ValueError, match="k_len"):
        pe.causal_mask(5, 3)
    with pytest.raises(ValueError, match="q_len"):
        pe.relative_positions(0)


def test_integer_scalars_of_other_types_are_lengths():
    import numpy as np

    assert torch.equal(pe.causal_mask(np.int64(4), torch.tensor(6)), pe.causal_mask(4, 6))
    assert torch.equal(pe.sliding_window_mask(5, window=np.int32(2)), pe.sliding_window_mask(5, window=2))
    assert pe.check_lengths(np.int64(3)) == 3


@pytest.mark.parametrize("call", [
    lambda: pe.causal_mask(float("nan")),
    lambda: pe.causal_mask(4, float("inf")),
    lambda: pe.relative_positions(torch.tensor(2.0)),
    lambda: pe.sliding_window_mask(4, window=float("nan")),
    lambda: pe.check_lengths(True),
])
def test_bad_lengths_of_other_types(call):
    with pytest.raises(ValueError, match="must be an integer"):
        call()
    with pytest.raises(TypeError, match="causal"):
        pe.sliding_window_mask(4, window=2, causal="no")
