"""RULER-like tasks (posenc.ruler): the answer follows from the records, only it is a target, depth places it."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe
from posenc.data import IGNORE_INDEX


def _records(task, seq):
    """The records of a full sequence (inputs + last target), in order: lists of tokens after each KEY/VAR."""
    body = seq[: len(seq) - task.answer_len - (task.key_len if isinstance(task, pe.VariableTracking) else 1) - 1]
    out, i = [], 0
    while i < len(body):
        if body[i] == task.key_token:
            size = 1 + (task.key_len if task.name_offset > body[i + 2] or isinstance(task, pe.MultiKeyRetrieval)
                        or isinstance(task, pe.MultiValueRetrieval) else 1)
            out.append((i, body[i + 1: i + 1 + size]))
            i += 1 + size
        else:
            assert body[i] < task.n_filler, f"a stray token {body[i]} at {i}"
            i += 1
    return out


def solve(task, seq):
    """What the answer must be, read from the records of one sequence (an oracle)."""
    records = _records(task, seq)
    query_at = len(seq) - task.answer_len - (task.key_len if isinstance(task, pe.VariableTracking) else 1) - 1
    assert seq[query_at] == task.query_token
    asked = seq[query_at + 1: len(seq) - task.answer_len]
    if isinstance(task, pe.MultiKeyRetrieval):
        found = [r[1:] for _, r in records if r[0] == asked[0]]
        assert len(found) == 1 and len(records) == task.n_keys
        return found[0], [at for at, r in records if r[0] == asked[0]][0]
    if isinstance(task, pe.MultiValueRetrieval):
        assert len(records) == task.n_values and all(r[0] == asked[0] for _, r in records)
        return [t for _, r in records for t in r[1:]], records[0][0]
    value_of, first_at = {}, None
    for at, (name, *rhs) in records:                      # VAR name value-or-name, in order of appearance
        value_of[name] = value_of[rhs[0]] if len(rhs) == 1 and rhs[0] in value_of else tuple(rhs)
        if tuple(rhs) == tuple(asked):                    # the queried chain's first assignment
            first_at = at
    chain = [name for _, (name, *rhs) in records if value_of[name] == tuple(asked)]
    assert len(chain) == task.n_hops + 1 and len(records) == task.n_chains * (task.n_hops + 1)
    return chain, first_at


TASKS = [pe.MultiKeyRetrieval(n_keys=3, key_len=2, n_digits=4, n_filler=3, n_names=5),
         pe.MultiValueRetrieval(n_values=3, key_len=1, n_digits=5, n_filler=3, n_names=4),
         pe.VariableTracking(n_hops=2, n_chains=2, n_digits=5, n_filler=3, n_names=8),
         pe.VariableTracking(n_hops=0, n_chains=3, key_len=2, n_digits=3, n_filler=2, n_names=3)]


@settings(max_examples=30, deadline=None)
@given(task=st.sampled_from(TASKS), extra=st.integers(0, 40), seed=st.integers(0, 10**6),
       depth=st.one_of(st.none(), st.floats(0, 1)))
def test_the_answer_follows_from_the_records_and_only_it_is_a_target(task, extra, seed, depth):
    n = task.min_len + extra
    x, y = task.batch(3, n, torch.Generator().manual_seed(seed), depth=depth)
    assert x.shape == y.shape == (3, n) and x.dtype == torch.long and 0 <= x.min() and x.max() < task.vocab_size
    assert (y[:, : n - task.answer_len] == IGNORE_INDEX).all() and (y[:, n - task.answer_len:] >= 0).all()
    assert torch.equal(x[:, 1:], y[:, :-1].where(y[:, :-1] != IGNORE_INDEX, x[:, 1:]))   # targets = inputs shifted
    for row in range(3):
        seq = x[row].tolist() + [y[row, -1].item()]
        answer, first_at = solve(task, seq)
        assert seq[-task.answer_len:] == list(answer)
        filler = sum(t < task.n_filler for t in seq[: n + 1 - task.answer_len])
        if depth is not None:                             # the queried record sits at that fraction of the filler
            before = sum(t < task.n_filler for t in seq[:first_at])
            assert before == round(depth * filler)


def test_batches_are_reproducible_and_differ_between_seeds():
    for task in TASKS:
        a = task.batch(4, task.min_len + 10, torch.Generator().manual_seed(3))
        b = task.batch(4, task.min_len + 10, torch.Generator().manual_seed(3))
        c = task.batch(4, task.min_len + 10, torch.Generator().manual_seed(4))
        assert all(torch.equal(u, v) for u, v in zip(a, b)) and not torch.equal(a[0], c[0])
        assert task.config["kind"] in ("multi_key", "multi_value", "variable_tracking") and repr(task).startswith(type(task).__name__)


def test_passkey_accuracy_scores_every_task_and_an_oracle_solves_them():
    """passkey_accuracy reads each task's answer length; a model that reads the records scores 1, a blind one less."""
    for task in TASKS:
        def oracle(x, task=task):
            logits = torch.zeros(*x.shape, task.vocab_size)
            for row in range(x.shape[0]):
                seq = x[row].tolist() + [0]              # the last answer token is not an input
                answer, _ = solve(task, seq[:-task.answer_len] + [0] * task.answer_len)
                for j, token in enumerate(answer):
                    logits[row, x.shape[1] - task.answer_len + j, token] = 1.0
            return logits

        grid = pe.passkey_accuracy(oracle, task, [task.min_len, task.min_len + 20], depths=[0.0, 1.0], samples=8)
        assert grid.shape == (2, 2) and (grid == 1).all()
        blind = pe.passkey_accuracy(lambda x: torch.zeros(*x.shape, task.vocab_size), task, [task.min_len], samples=8)
        assert (blind < 1).all()


def test_tasks_refuse_bad_settings():
    for make, match in [(lambda: pe.MultiKeyRetrieval(n_keys=5, n_names=4), "n_names"),
                        (lambda: pe.MultiKeyRetrieval(n_keys=0), "n_keys"),
                        (lambda: pe.MultiValueRetrieval(n_values=11, n_digits=10), "distinct"),
                        (lambda: pe.VariableTracking(n_hops=3, n_chains=4, n_names=15), "n_names"),
                        (lambda: pe.VariableTracking(n_chains=3, n_digits=2, n_names=16), "distinct values"),
                        (lambda: pe.VariableTracking(n_hops=-1), "n_hops")]:
        with pytest.raises(ValueError, match=match):
            make()
    task = pe.MultiKeyRetrieval()
    with pytest.raises(ValueError, match=f"seq_len must be >= {task.min_len}"):
        task.batch(2, task.min_len - 1)
    with pytest.raises(ValueError, match="depth"):
        task.batch(2, task.min_len, depth=1.5)
    with pytest.raises(ValueError, match="answer_len"):
        pe.passkey_accuracy(lambda x: x, pe.MarkovChain(vocab_size=4), [16])


def test_a_model_trains_on_each_task(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    for task in TASKS:
        model = pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi")
        run = pe.train(model, task, steps=4, seq_len=task.min_len + 8, batch_size=4, lr=1e-2, warmup=1, progress=False)
        assert len(run.losses) == 4 and all(torch.isfinite(torch.tensor(run.losses)))
        again = pe.train(pe.TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi"), task,
                         steps=4, seq_len=task.min_len + 8, batch_size=4, lr=1e-2, warmup=1, progress=False)
        assert again.from_cache and again.losses == run.losses          # the task's config keys the run cache
