"""Multi-query associative recall: the layout of every sequence, the answers, the knobs and bad input."""

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe


def answer_by_lookup(task, x):
    """What a perfect recall gives at every query: the token after the query's key in the pair block."""
    pairs = x[:, : 2 * task.n_pairs]
    out = torch.full_like(x, pe.IGNORE_INDEX)
    for b in range(x.shape[0]):
        table = {int(pairs[b, 2 * i]): int(pairs[b, 2 * i + 1]) for i in range(task.n_pairs)}
        for t in range(2 * task.n_pairs, x.shape[1]):
            if int(x[b, t]) in table:
                out[b, t] = table[int(x[b, t])]
    return out


@settings(max_examples=60, deadline=None)
@given(n_pairs=st.integers(1, 8), extra=st.integers(0, 40), n_queries=st.integers(1, 8), min_gap=st.integers(0, 9),
       batch=st.integers(1, 5), seed=st.integers(0, 2 ** 31))
def test_every_query_is_a_key_of_the_pair_block_asked_once_and_its_target_is_its_value(
        n_pairs, extra, n_queries, min_gap, batch, seed):
    task = pe.AssociativeRecall(n_pairs, min(n_queries, n_pairs), n_keys=8, n_values=5, n_filler=3, min_gap=min_gap)
    n = task.min_len + extra
    x, y = task.batch(batch, n, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (batch, n) and x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
    # the pair block: distinct keys, then values
    keys, values = x[:, 0:2 * n_pairs:2], x[:, 1:2 * n_pairs:2]
    assert ((keys >= task.key_offset) & (keys < task.value_offset)).all()
    assert ((values >= task.value_offset) & (values < task.vocab_size)).all()
    assert all(len(set(row.tolist())) == n_pairs for row in keys)
    # the answers are exactly what a lookup in the pair block gives, at every key after it
    assert torch.equal(y, answer_by_lookup(task, x))
    counted = y != pe.IGNORE_INDEX
    assert (counted.sum(1) == task.n_queries).all()
    # queries: none in the gap, each followed by its value, each key once
    where = counted.nonzero()
    assert (where[:, 1] >= 2 * n_pairs + min_gap).all() and (where[:, 1] <= n - 2).all()
    assert torch.equal(x[where[:, 0], where[:, 1] + 1], y[where[:, 0], where[:, 1]])
    for b in range(batch):
        asked = x[b, counted[b]].tolist()
        assert len(set(asked)) == len(asked)
    # filler elsewhere
    rest = torch.ones_like(counted)
    rest[:, : 2 * n_pairs] = False
    rest[counted] = False
    rest[:, 1:][counted[:, :-1]] = False
    assert (x[rest] < task.n_filler).all()


def test_the_same_generator_state_gives_the_same_batch_and_another_seed_another():
    task = pe.AssociativeRecall()
    a = task.batch(4, 64, torch.Generator().manual_seed(3))
    b = task.batch(4, 64, torch.Generator().manual_seed(3))
    c = task.batch(4, 64, torch.Generator().manual_seed(4))
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and not torch.equal(a[0], c[0])


def test_queries_spread_over_the_whole_sequence_so_the_gap_grows_with_length():
    """At 16 times the length most queries sit far beyond where they sit at the training length."""
    task = pe.AssociativeRecall(n_pairs=4)
    g = torch.Generator().manual_seed(0)
    _, short = task.batch(64, 64, g)
    _, long = task.batch(64, 1024, g)
    far_short = (short != pe.IGNORE_INDEX).nonzero()[:, 1].float()
    far_long = (long != pe.IGNORE_INDEX).nonzero()[:, 1].float()
    assert far_short.max() < 64 and far_long.mean() > 8 * far_short.mean() and far_long.max() > 900


def test_a_model_that_looks_up_the_pairs_scores_one_and_a_guess_scores_chance():
    task = pe.AssociativeRecall(n_pairs=6, n_values=4)
    x, y = task.batch(256, 48, torch.Generator().manual_seed(1))
    counted = y != pe.IGNORE_INDEX
    assert (answer_by_lookup(task, x)[counted] == y[counted]).all()
    guess = torch.full_like(y, task.value_offset)
    hit = (guess[counted] == y[counted]).float().mean().item()
    assert task.chance == 0.25 and abs(hit - task.chance) < 0.05


def test_evaluate_lengths_reports_the_recall_accuracy_over_the_queries_only():
    task = pe.AssociativeRecall(n_pairs=2)
    model = pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi")
    res = pe.evaluate_lengths(model, task, [16, 40], batches=2, batch_size=4, cache=False)
    assert res[16].tokens == res[40].tokens == 2 * 4 * task.n_queries
    assert 0.0 <= res[40].accuracy <= 1.0


def test_config_and_repr_name_every_knob():
    task = pe.AssociativeRecall(3, 2, n_keys=5, n_values=6, n_filler=7, min_gap=4)
    assert task.config == dict(kind="associative_recall", n_pairs=3, n_queries=2, n_keys=5, n_values=6, n_filler=7,
                               min_gap=4)
    assert task.vocab_size == 18 and task.min_len == 6 + 4 + 4
    assert "n_pairs=3" in repr(task) and "min_gap=4" in repr(task)
    assert pe.AssociativeRecall(3).config != pe.AssociativeRecall(4).config


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_pairs=0), "n_pairs"),
    (dict(n_pairs=5, n_keys=4), "n_pairs must be at most n_keys"),
    (dict(n_pairs=2, n_queries=3), "n_queries must be at most n_pairs"),
    (dict(n_queries=0), "n_queries"),
    (dict(n_values=1), "n_values"),
    (dict(n_filler=0), "n_filler"),
    (dict(min_gap=-1), "min_gap"),
    (dict(n_pairs=2.5), "n_pairs"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pe.AssociativeRecall(**kwargs)


def test_bad_batches_are_refused():
    task = pe.AssociativeRecall(n_pairs=4, min_gap=2)
    with pytest.raises(ValueError, match="seq_len must be at least 18"):
        task.batch(2, 17)
    task.batch(2, 18)
    with pytest.raises(ValueError, match="split"):
        task.batch(2, 32, split="test")
    with pytest.raises(ValueError, match="generator"):
        task.batch(2, 32, generator=0)
    with pytest.raises(ValueError, match="batch_size"):
        task.batch(0, 32)


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(2, 40), lo=st.integers(2, 12), span=st.integers(0, 12), extra=st.integers(0, 40),
       batch=st.integers(1, 6), seed=st.integers(0, 2 ** 31))
def test_a_periodic_sequence_repeats_a_block_of_distinct_tokens_and_asks_for_the_next_from_the_second_period(
        vocab, lo, span, extra, batch, seed):
    lo = min(lo, vocab)
    hi = min(lo + span, vocab)
    task = pe.PeriodicSequence(vocab, min_period=lo, max_period=hi)
    n = task.min_len + extra
    x, y = task.batch(batch, n, torch.Generator().manual_seed(seed))
    assert x.shape == y.shape == (batch, n) and x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < vocab
    for b in range(batch):
        row = x[b].tolist()
        p = next(q for q in range(1, n + 1) if all(row[t] == row[t - q] for t in range(q, n)))   # the shortest period
        assert lo <= p <= hi and len(set(row[:p])) == p                                       # a block of distinct tokens
        expected = [pe.IGNORE_INDEX] * p + [row[(t + 1) % p] for t in range(p, n)]             # the token after, one period back
        assert y[b].tolist() == expected
        assert y[b, p:-1].tolist() == row[p + 1:]                                              # which is the next input


def test_every_period_of_the_range_occurs_and_the_generator_decides_the_batch():
    task = pe.PeriodicSequence(20, min_period=3, max_period=7)
    x, y = task.batch(400, 30, torch.Generator().manual_seed(1))
    periods = (y == pe.IGNORE_INDEX).sum(1)
    assert set(periods.tolist()) == set(range(3, 8))
    again = task.batch(400, 30, torch.Generator().manual_seed(1))
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, task.batch(400, 30, torch.Generator().manual_seed(2))[0])
    assert task.config == dict(kind="periodic_sequence", vocab_size=20, min_period=3, max_period=7)
    assert task.config != pe.PeriodicSequence(20, min_period=3, max_period=8).config
    assert repr(task) == "PeriodicSequence(vocab_size=20, min_period=3, max_period=7)"


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=1), "vocab_size"),
    (dict(vocab_size=10, min_period=1), "min_period"),
    (dict(vocab_size=10, min_period=5, max_period=4), "min_period <= max_period"),
    (dict(vocab_size=10, max_period=11), "max_period <= vocab_size"),
    (dict(vocab_size=10, min_period=2.5), "min_period"),
    (dict(vocab_size="10"), "vocab_size"),
])
def test_a_periodic_sequence_refuses_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pe.PeriodicSequence(**kwargs)


def test_a_periodic_sequence_refuses_a_length_without_a_target_in_every_row():
    task = pe.PeriodicSequence(10, min_period=2, max_period=6)
    with pytest.raises(ValueError, match="at least 7"):
        task.batch(2, 6)
    assert (task.batch(64, 7, torch.Generator().manual_seed(0))[1] != pe.IGNORE_INDEX).any(1).all()
    with pytest.raises(ValueError, match="split"):
        task.batch(2, 8, split="test")
    with pytest.raises(ValueError, match="generator"):
        task.batch(2, 8, generator=0)


def test_the_warm_up_teaches_the_recall_task_the_plateau_hides():
    """Small preset, one seed: recall alone stays near the plateau (about 1/4 of 4 pairs) where the warm-up
    followed by as many recall steps solves it; the book's chapter 7 checks every seed it uses."""
    P = pe.training_preset("small")
    recall = pe.AssociativeRecall(n_pairs=4)
    kw = dict(P.train_kwargs(), cache=False, progress=False)
    accuracy = lambda run: pe.evaluate_lengths(run.model, recall, [P.seq_len], batches=8, batch_size=16, seed=5,  # noqa: E731
                                               cache=False)[P.seq_len].accuracy
    warm = pe.train(P.make_model(recall.vocab_size, "rope"), pe.PeriodicSequence(recall.vocab_size), **dict(kw, steps=2 * P.steps))
    tuned = pe.train(P.make_model(recall.vocab_size, "rope"), recall, init=warm, **kw)
    alone = pe.train(P.make_model(recall.vocab_size, "rope"), recall, **kw)
    assert accuracy(tuned) > 0.95 and accuracy(alone) < 0.6


def test_recall_accuracy_places_every_query_beyond_the_training_distance_and_equals_evaluate_lengths():
    task = pe.AssociativeRecall(n_pairs=2)
    model = pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi")
    far = pe.AssociativeRecall(n_pairs=2, min_gap=40 - 16)
    by_hand = pe.evaluate_lengths(model, far, [40], batches=2, batch_size=4, seed=7, cache=False)[40].accuracy
    assert pe.recall_accuracy(model, task, 40, train_len=16, sequences=8, batch_size=4, seed=7) == by_hand
    for x, y in pe.evaluation_batches(far, 40, batches=2, batch_size=4, seed=7):  # what it reads: queries after the gap
        first_query = (y != pe.IGNORE_INDEX).float().argmax(dim=1)
        assert (first_query >= 2 * task.n_pairs + 40 - 16).all()
    within = pe.evaluate_lengths(model, task, [16], batches=2, batch_size=4, seed=7, cache=False)[16].accuracy
    assert pe.recall_accuracy(model, task, 16, train_len=16, sequences=8, batch_size=4, seed=7) == within  # no gap


@pytest.mark.parametrize("kwargs, match", [
    (dict(recall=pe.PeriodicSequence(40)), "AssociativeRecall"),
    (dict(sequences=10, batch_size=4), "multiple of batch_size"),
    (dict(length=0), "length"),
    (dict(train_len=-1), "train_len"),
    (dict(length=12, train_len=16, recall=pe.AssociativeRecall(n_pairs=4, min_gap=5)), "at least 21"),
])
def test_recall_accuracy_refuses_bad_input(kwargs, match):
    recall = kwargs.pop("recall", pe.AssociativeRecall(n_pairs=2))
    args = {**dict(length=32, train_len=16, sequences=8, batch_size=4), **kwargs}
    model = pe.TinyLM(recall.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi")
    with pytest.raises(ValueError, match=match):
        pe.recall_accuracy(model, recall, args.pop("length"), **args)


def test_train_recall_seeds_is_the_warm_up_then_recall_from_it_and_refuses_what_it_would_ignore(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    recall = pe.AssociativeRecall(n_pairs=2)
    make = lambda: pe.TinyLM(recall.vocab_size, d_model=16, n_layers=1, n_heads=2, position="rope")  # noqa: E731
    kw = dict(steps=4, seq_len=24, batch_size=4, warmup=0, progress=False, workers=1)
    runs = pe.train_recall_seeds({"rope": make}, recall, [0, 1], **kw)
    warm = pe.train_seeds({"rope": make}, pe.PeriodicSequence(recall.vocab_size), [0, 1], **dict(kw, steps=8))
    by_hand = pe.train_seeds({"rope": make}, recall, [0, 1], init=warm, **kw)
    assert all(w.from_cache for w in warm["rope"]) and all(r.from_cache for r in by_hand["rope"])  # the same runs
    for a, b in zip(runs["rope"], by_hand["rope"]):
        assert a.key == b.key and a.losses == b.losses
    three = pe.train_recall_seeds(make, recall, [0], warmup_steps=3, **kw)    # one function: a list per seed
    assert len(three) == 1 and three[0].key != runs["rope"][0].key            # another warm-up, another run
    with pytest.raises(ValueError, match="AssociativeRecall"):
        pe.train_recall_seeds(make, pe.PeriodicSequence(recall.vocab_size), [0], **kw)
    with pytest.raises(ValueError, match="init"):
        pe.train_recall_seeds(make, recall, [0], init=warm["rope"][:1], **kw)
    with pytest.raises(ValueError, match="steps"):
        pe.train_recall_seeds(make, recall, [0], **{k: v for k, v in kw.items() if k != "steps"})
    with pytest.raises(ValueError, match="warmup_steps"):
        pe.train_recall_seeds(make, recall, [0], warmup_steps=0, **kw)


def _untrained_runs(task, names=("alibi", "none"), seeds=2):
    """{scheme: [an object with .model per seed]}: what train_recall_seeds returns, without training."""
    def model(scheme, seed):
        torch.manual_seed(seed)
        return pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position=scheme)
    return {name: [types.SimpleNamespace(model=model(name, s)) for s in range(seeds)] for name in names}


def test_recall_over_seeds_is_recall_accuracy_for_every_model_seed_and_length():
    task = pe.AssociativeRecall(n_pairs=2)
    runs = _untrained_runs(task)
    table = pe.recall_over_seeds(runs, task, [16, 40], train_len=16, sequences=16, within_sequences=32)
    seed = pe.evaluation_seed()
    for i in range(2):
        for name, rs in runs.items():
            for n in (16, 40):
                assert table.per_seed[i][name][n] == pe.recall_accuracy(rs[i].model, task, n, train_len=16, sequences=16,
                                                                        seed=seed)
            assert table.within[name][i] == pe.recall_accuracy(rs[i].model, task, 16, train_len=16, sequences=32, seed=seed)
    assert table.spread["alibi"][40].values == tuple(row["alibi"][40] for row in table.per_seed)
    assert table.worst_within() == {name: min(values) for name, values in table.within.items()}


def test_recall_over_seeds_names_the_models_not_solved_within_the_training_length():
    table = pe.RecallOverSeeds(per_seed=[], within={"a": [0.95, 0.99], "b": [0.97, 0.89], "c": [0.9, 1.0]})
    assert table.unsolved() == ["b"] and table.unsolved(0.96) == ["a", "b", "c"] and table.unsolved(0.5) == []


@pytest.mark.parametrize("change, match", [
    (dict(runs={}), "non-empty dict"),
    (dict(runs=[1, 2]), "non-empty dict"),
    (dict(runs="unequal"), "the same seeds"),
    (dict(runs="none"), "the same seeds"),
    (dict(recall=pe.PeriodicSequence(16)), "AssociativeRecall"),
    (dict(lengths=[]), "lengths must not be empty"),
    (dict(lengths=40), "lengths must be a sequence"),
    (dict(lengths=[0]), "every length"),
])
def test_recall_over_seeds_refuses_bad_input(change, match):
    task = pe.AssociativeRecall(n_pairs=2)
    runs = _untrained_runs(task)
    if change.get("runs") == "unequal":
        change["runs"] = {**runs, "none": runs["none"][:1]}
    elif change.get("runs") == "none":
        change["runs"] = {name: [] for name in runs}
    args = dict(dict(runs=runs, recall=task, lengths=[16, 40]), **change)
    with pytest.raises(ValueError, match=match):
        pe.recall_over_seeds(args.pop("runs"), args.pop("recall"), args.pop("lengths"), train_len=16)
