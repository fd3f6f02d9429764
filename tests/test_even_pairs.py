"""Even Pairs: every answer counted from its definition (pairs ab and ba), the unscored prefix, and bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe

E = pe.EvenPairs


def answers_by_counting(x):
    """The definition itself: at each position, is the number of 'ab' and 'ba' pairs in the prefix even?"""
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        pairs = 0
        for t in range(x.shape[1]):
            pairs += t > 0 and int(x[b, t]) != int(x[b, t - 1])
            out[b, t] = E.EVEN if pairs % 2 == 0 else E.ODD
    return out


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 5), seq_len=st.integers(1, 48), labels_from=st.integers(0, 47), seed=st.integers(0, 2 ** 31))
def test_every_answer_is_the_parity_of_the_pairs_and_the_prefix_is_not_scored(batch, seq_len, labels_from, seed):
    if seq_len <= labels_from:
        with pytest.raises(ValueError, match="greater than labels_from"):
            E(labels_from).batch(batch, seq_len, torch.Generator().manual_seed(seed))
        return
    x, y = E(labels_from).batch(batch, seq_len, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (batch, seq_len) and x.dtype == y.dtype == torch.int64
    assert ((x == E.A) | (x == E.B)).all()                               # inputs are a and b only
    expected = answers_by_counting(x)
    expected[:, :labels_from] = pe.IGNORE_INDEX
    assert torch.equal(y, expected)


def test_both_answers_are_equally_likely_beyond_the_first_position():
    x, y = E().batch(64, 256, torch.Generator().manual_seed(0))
    assert (y[:, 0] == E.EVEN).all()                                     # no pair yet
    assert abs((y[:, 1:] == E.EVEN).float().mean().item() - E.chance) < 0.02
    assert abs((x == E.A).float().mean().item() - 0.5) < 0.02


def test_the_same_generator_gives_the_same_batch_and_the_config_names_the_task():
    a = E(3).batch(4, 20, torch.Generator().manual_seed(5))
    b = E(3).batch(4, 20, torch.Generator().manual_seed(5))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert E(3).config == {"kind": "even_pairs", "labels_from": 3} != E().config
    assert repr(E(3)) == "EvenPairs(labels_from=3)" and E.vocab_size == 4


@pytest.mark.parametrize("labels_from", [-1, 1.5, True, "2", None])
def test_bad_labels_from_is_refused(labels_from):
    with pytest.raises(ValueError, match="labels_from must be an integer >= 0"):
        E(labels_from)


@pytest.mark.parametrize("kwargs, match", [(dict(batch_size=0, seq_len=4), "batch_size"),
                                           (dict(batch_size=2, seq_len=0), "seq_len"),
                                           (dict(batch_size=2, seq_len=4, split="test"), "split"),
                                           (dict(batch_size=2, seq_len=4, generator=3), "generator")])
def test_bad_batch_requests_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        E().batch(**kwargs)


def test_evaluation_scores_only_the_positions_from_labels_from():
    """An untrained model's accuracy is counted over the scored positions alone: all of them, or those from L."""
    torch.manual_seed(0)
    model = pe.TinyLM(E.vocab_size, position="none", d_model=16, n_layers=1, n_heads=2)
    x, y = E(8).batch(4, 24, torch.Generator().manual_seed(1234))
    with torch.no_grad():
        right = model(x).argmax(-1) == y
    expected = right[:, 8:].float().mean().item()
    result = pe.evaluate_lengths(model, E(8), [24], batches=1, batch_size=4, seed=1234)[24]
    assert result.accuracy == pytest.approx(expected)
