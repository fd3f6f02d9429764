"""The cost log: every training and evaluation call of a notebook lands in POSENC_COST_LOG once."""

import json

import pytest
import torch

import posenc as pe
from posenc._costs import accounted, read_cost_log


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_train_seeds_and_evaluations_are_logged_once_each(tmp_path, monkeypatch):
    log = tmp_path / "cost.jsonl"
    monkeypatch.setenv("POSENC_COST_LOG", str(log))
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POSENC_PROGRESS", "0")
    chain = pe.MarkovChain(vocab_size=8, order=2, seed=0)
    make = lambda: pe.TinyLM(8, d_model=16, n_layers=1, n_heads=2, position="alibi")  # noqa: E731
    kw = dict(steps=3, seq_len=16, batch_size=2, warmup=1)
    pe.train(make(), chain, **kw)
    assert [(r["kind"], r["runs"]) for r in _records(log)] == [("train", 1)]
    pe.train(make(), chain, **kw)                                   # from the cache: nothing trained, nothing logged
    assert len(_records(log)) == 1
    runs = pe.train_seeds(make, chain, seed_list=[1, 2], workers=1, **kw)
    assert [(r["kind"], r["runs"]) for r in _records(log)][1:] == [("train", 2)]     # the set, not each run again
    pe.train_seeds(make, chain, seed_list=[1, 2], workers=1, **kw)
    assert _records(log)[-1]["runs"] == 0
    pe.evaluate_lengths(runs[0].model, chain, [16, 32], batches=1, batch_size=2, cache=False)
    pe.passkey_accuracy(pe.TinyLM(pe.PasskeyRetrieval().vocab_size, d_model=16, n_layers=1, n_heads=2),
                        pe.PasskeyRetrieval(), [32], samples=2, cache=False)
    assert [r["kind"] for r in _records(log)][-2:] == ["evaluate", "evaluate"]
    totals = read_cost_log(log)
    assert totals["runs"] == 3 and totals["train_core_s"] > 0 and totals["evaluate_wall_s"] > 0
    assert all(r["core_s"] >= 0 and r["wall_s"] >= 0 for r in _records(log))


def test_nothing_is_measured_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_COST_LOG", raising=False)
    with accounted("train", runs=1) as extra:
        extra["runs"] = 2
    assert not list(tmp_path.iterdir())


def test_a_log_that_cannot_be_written_costs_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_COST_LOG", str(tmp_path / "missing-folder" / "cost.jsonl"))
    with accounted("evaluate"):
        x = torch.ones(3).sum()
    assert float(x) == 3.0


def test_an_error_inside_is_still_logged_and_raised(tmp_path, monkeypatch):
    log = tmp_path / "cost.jsonl"
    monkeypatch.setenv("POSENC_COST_LOG", str(log))
    with pytest.raises(KeyError):
        with accounted("evaluate"):
            raise KeyError("boom")
    assert _records(log)[0]["kind"] == "evaluate"
