"""Passkey retrieval: layout, determinism, targets, the accuracy heat map, and a tiny model learns it."""

import pytest
import torch
from hypothesis import given, strategies as st

import posenc as pe


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


def test_layout_and_targets():
    task = pe.PasskeyRetrieval(key_len=3, n_digits=5, n_filler=4)
    assert task.vocab_size == 4 + 5 + 2 and task.min_len == 8
    assert task.config == dict(kind="passkey", key_len=3, n_digits=5, n_filler=4)
    x, y = task.batch(64, 40, torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (64, 40) and x.dtype == y.dtype == torch.int64
    assert ((x >= 0) & (x < task.vocab_size)).all()
    for row, target in zip(x, y):
        (key_at,) = (row == task.key_token).nonzero()[:, 0].tolist()
        (query_at,) = (row == task.query_token).nonzero()[:, 0].tolist()
        key = row[key_at + 1:key_at + 4]
        assert query_at == 40 - 3 and ((key >= 4) & (key < 9)).all()
        assert torch.equal(row[query_at + 1:], key[:2])  # the answer so far, teacher-forced
        assert torch.equal(target[-3:], key) and (target[:-3] == pe.IGNORE_INDEX).all()
        filler = torch.cat((row[:key_at], row[key_at + 4:query_at]))
        assert (filler < 4).all()


def test_depth_places_the_key():
    task = pe.PasskeyRetrieval(key_len=2, n_digits=3, n_filler=2)
    for depth, where in ((0.0, 0), (1.0, 31 - 6), (0.5, 12)):  # 31 tokens, 6 of them KEY, QUERY and digits
        x, _ = task.batch(5, 30, torch.Generator().manual_seed(0), depth=depth)
        assert ((x == task.key_token).nonzero()[:, 1] == where).all(), depth
    x, _ = task.batch(2000, 30, torch.Generator().manual_seed(0))  # uniform depths: every place is used
    assert set((x == task.key_token).nonzero()[:, 1].tolist()) == set(range(26))
    x, _ = task.batch(4, task.min_len, depth=0.3)  # no filler at all
    assert x[:, 0].eq(task.key_token).all()


def test_same_generator_same_batch():
    task = pe.PasskeyRetrieval()
    a = task.batch(8, 50, torch.Generator().manual_seed(3))
    b = task.batch(8, 50, torch.Generator().manual_seed(3))
    assert all(torch.equal(s, t) for s, t in zip(a, b))


@pytest.mark.parametrize("call", [
    lambda t: t.batch(2, 9),
    lambda t: t.batch(0, 20),
    lambda t: t.batch(2, 20, depth=1.5),
    lambda t: t.batch(2, 20, depth=True),
    lambda t: t.batch(2, 20, split="test"),
    lambda t: t.batch(2, 20, generator=3),
    lambda t: pe.PasskeyRetrieval(key_len=0),
    lambda t: pe.PasskeyRetrieval(n_digits=1),
    lambda t: pe.PasskeyRetrieval(n_filler=2.0),
    lambda t: pe.passkey_accuracy(lambda x: x, t, [5]),
    lambda t: pe.passkey_accuracy(lambda x: x, t, []),
    lambda t: pe.passkey_accuracy(lambda x: x, t, [20], depths=[2.0]),
    lambda t: pe.passkey_accuracy(lambda x: x, t, [20], samples=0),
    lambda t: pe.passkey_accuracy(lambda x: x, pe.MarkovChain(), [20]),
    lambda t: pe.passkey_sequences(t, 9, 0.5),
    lambda t: pe.passkey_sequences(t, 20, 1.5),
    lambda t: pe.passkey_sequences(t, 20, "deep"),
    lambda t: pe.passkey_sequences(t, 20, 0.5, samples=0),
    lambda t: pe.passkey_sequences(t, 20, 0.5, seed=-1),
    lambda t: pe.passkey_sequences(pe.MarkovChain(), 20, 0.5),
])
def test_bad_arguments_raise_value_error(call):
    with pytest.raises(ValueError):
        call(pe.PasskeyRetrieval(key_len=4))


class Oracle(torch.nn.Module):
    """Reads the key from the input (the perfect answer), wrong on purpose at depths > ``wrong_from``."""

    def __init__(self, task, wrong_from=2.0):
        super().__init__()
        self.task, self.wrong_from = task, wrong_from

    def forward(self, x):
        t = self.task
        logits = torch.zeros(*x.shape, t.vocab_size)
        for b, row in enumerate(x):
            at = int((row == t.key_token).nonzero()[0, 0])
            key = row[at + 1:at + 1 + t.key_len]
            if at / max(1, x.shape[1] - t.min_len + 1) > self.wrong_from:
                key = key * 0
            logits[b, -t.key_len:].scatter_(-1, key[:, None], 1.0)
        return logits


def test_accuracy_heat_map_shape_and_values():
    task = pe.PasskeyRetrieval(key_len=3, n_digits=4, n_filler=5)
    acc = pe.passkey_accuracy(Oracle(task), task, [10, 20, 40], depths=(0.0, 0.5, 1.0), samples=7, batch_size=3)
    assert acc.shape == (3, 3) and acc.dtype == torch.float64 and (acc == 1).all()
    acc = pe.passkey_accuracy(Oracle(task, wrong_from=0.6), task, [40], depths=(0.0, 0.5, 1.0), samples=6)
    assert acc.tolist() == [[1.0, 1.0, 0.0]]
    assert torch.equal(pe.passkey_accuracy(Oracle(task), task, [20], samples=5, seed=3),
                       pe.passkey_accuracy(Oracle(task), task, [20], samples=5, seed=3))


def test_a_tiny_model_learns_the_task():
    task = pe.PasskeyRetrieval(key_len=2, n_digits=4, n_filler=8)
    model = pe.TinyLM(task.vocab_size, 64, 2, 4, position="rope")
    result = pe.train(model, task, steps=300, seq_len=32, batch_size=32, lr=3e-3, progress=False)
    acc = pe.passkey_accuracy(model, task, [32], samples=64)
    assert acc.mean() > 0.3, acc  # chance: 1 / 4^2
    assert model.training is False and result.final_loss < 1.0


# --- effective length (RULER's notion) -----------------------------------------------------------------------

def test_effective_length_is_the_longest_length_before_the_first_failure():
    scores = {64: 1.0, 128: 0.97, 256: 0.6, 512: 0.9}
    assert pe.effective_length(scores) == 128                              # 512 recovers, but 256 failed first
    assert pe.effective_length(scores, threshold=0.5) == 512
    assert pe.effective_length({128: 0.5, 64: 0.9}, threshold=0.85) == 64  # any order of keys
    assert pe.effective_length({64: 0.2}) is None
    assert pe.effective_length({64: torch.tensor(0.9), 128: 0.85}) == 128   # the threshold itself passes


def test_effective_length_reads_evaluate_lengths_and_passkey_grids():
    Result = type("Result", (), {})
    results = {}
    for n, acc in ((64, 0.99), (128, 0.7)):
        results[n] = Result()
        results[n].accuracy = acc
    assert pe.effective_length(results, threshold=0.9) == 64
    grid = torch.tensor([[1.0, 1.0], [1.0, 0.5], [0.2, 0.2]])              # (lengths, depths)
    assert pe.effective_length(dict(zip([64, 128, 256], grid.mean(1))), threshold=0.75) == 128
    assert pe.effective_length(dict(zip([64, 128, 256], grid.min(1).values)), threshold=0.75) == 64


@given(st.dictionaries(st.integers(1, 10_000), st.floats(0, 1), min_size=1, max_size=12), st.floats(0.01, 1))
def test_effective_length_agrees_with_its_definition(scores, threshold):
    got = pe.effective_length(scores, threshold)
    passing = [n for n in sorted(scores) if all(scores[m] >= threshold for m in scores if m <= n)]
    assert got == (max(passing) if passing else None)


def test_effective_length_refuses_bad_input():
    for scores, threshold, match in [({}, 0.5, "non-empty dict"), ([0.5], 0.5, "non-empty dict"),
                                     ({64: 1.2}, 0.5, r"\[0, 1\]"), ({64: float("nan")}, 0.5, "finite"),
                                     ({0: 1.0}, 0.5, "every length"), ({64: 1.0}, 0, "threshold"),
                                     ({64: 1.0}, 1.5, "threshold"), ({64: torch.ones(2)}, 0.5, "grid.mean")]:
        with pytest.raises(ValueError, match=match):
            pe.effective_length(scores, threshold)


@pytest.mark.parametrize("task", [pe.PasskeyRetrieval(key_len=2, n_digits=4, n_filler=5),
                                  pe.MultiKeyRetrieval(n_keys=2, n_digits=4, n_filler=5, n_names=2)])
def test_passkey_sequences_are_the_ones_the_accuracy_scores(task):
    """Scored by hand, the sequences of passkey_sequences give passkey_accuracy's grid, cell by cell."""
    model = pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi")
    lengths, depths = [24, 40], (0.0, 0.3, 1.0)
    grid = pe.passkey_accuracy(model, task, lengths, depths, samples=9, seed=4, batch_size=4, cache=False)
    k = task.answer_len
    for a, n in enumerate(lengths):
        for b, depth in enumerate(depths):
            x, y = pe.passkey_sequences(task, n, depth, samples=9, seed=4)
            assert x.shape == y.shape == (9, n)
            with torch.no_grad():
                right = (model(x)[:, -k:].argmax(-1) == y[:, -k:]).all(-1)
            assert grid[a, b].item() == right.double().mean().item()
    for depth in ("deep", None):                             # a cell has one depth: not None (uniform)
        with pytest.raises(ValueError, match=f"depth must be a .*got {depth!r}"):
            pe.passkey_sequences(task, 40, depth)
    x, _ = pe.passkey_sequences(task, 40, 0.3, samples=9, seed=4)
    assert not torch.equal(x, pe.passkey_sequences(task, 40, 0.3, samples=9, seed=5)[0])   # the seed moves them
