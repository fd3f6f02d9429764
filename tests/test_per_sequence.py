"""Explicit O(n^2) attention (CoPE, stick-breaking) run one sequence at a time on the CPU: the same numbers."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
from posenc._per_sequence import _MIN_SCORES, per_sequence, split_by_sequence


def _qkv(batch, heads, n, d=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g, dtype=dtype) for _ in range(3)]


ATTENTIONS = {
    "cope": lambda q, k, v, **kw: pe.cope_attention(q, k, v, torch.linspace(-1, 1, 24 * q.shape[-1]).view(24, -1)
                                                    .to(q.dtype), **kw),
    "cope window": lambda q, k, v, **kw: pe.cope_attention(q, k, v, torch.ones(8, q.shape[-1], dtype=q.dtype),
                                                           window=5, **kw),
    "stick_breaking": lambda q, k, v, **kw: pe.stick_breaking_attention(q, k, v, **kw),
    "stick_breaking current": lambda q, k, v, **kw: pe.stick_breaking_attention(q, k, v, attend_current=True, **kw),
}


@pytest.mark.parametrize("name", list(ATTENTIONS))
@pytest.mark.parametrize("return_weights", [False, True])
def test_one_sequence_at_a_time_gives_the_numbers_of_the_whole_batch(name, return_weights):
    q, k, v = _qkv(3, 4, 128)                                 # 4 x 128 x 128 score entries: split without a gradient
    assert split_by_sequence(q, k, (q, k, v))
    with torch.no_grad():
        split = ATTENTIONS[name](q, k, v, return_weights=return_weights)
    whole = ATTENTIONS[name](*(t.clone().requires_grad_() for t in (q, k, v)), return_weights=return_weights)
    split, whole = (split, whole) if return_weights else ((split,), (whole,))
    for a, b in zip(split, whole):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 4), heads=st.integers(1, 4), n=st.integers(1, 140), grad=st.booleans())
def test_the_split_is_taken_only_on_the_cpu_without_a_gradient_and_for_large_scores(batch, heads, n, grad):
    q, k, v = _qkv(batch, heads, n, d=4)
    if grad:
        q.requires_grad_()
    expected = batch > 1 and not grad and heads * n * n >= _MIN_SCORES
    assert split_by_sequence(q, k, (q, k, v)) == expected
    with torch.no_grad():                                    # no gradient is recorded, whatever requires_grad says
        assert split_by_sequence(q, k, (q, k, v)) == (batch > 1 and heads * n * n >= _MIN_SCORES)


def test_per_sequence_concatenates_outputs_and_tuples_in_order():
    x = torch.arange(6.0).view(3, 2)
    assert torch.equal(per_sequence(lambda b: x[b:b + 1] * 2, 3), x * 2)
    out, w = per_sequence(lambda b: (x[b:b + 1], -x[b:b + 1]), 3)
    assert torch.equal(out, x) and torch.equal(w, -x)


@pytest.mark.parametrize("kind", [dict(position="cope"), dict(position="none", attention="stick_breaking")])
def test_a_trained_models_evaluation_does_not_change_with_the_split(kind):
    model = pe.TinyLM(8, d_model=32, n_layers=2, n_heads=4, **kind)
    x = torch.randint(8, (3, 160), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        split = model(x)                                     # 4 x 160 x 160 scores per sequence: split
        one_by_one = torch.cat([model(x[b:b + 1]) for b in range(3)])
    torch.testing.assert_close(split, one_by_one, rtol=0, atol=0)
    with torch.enable_grad():
        whole = model(x)
    torch.testing.assert_close(split, whole.detach(), rtol=1e-5, atol=1e-5)


def test_the_benchmark_runs_and_prints_a_ratio_per_kind_and_length(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "per_sequence.py"
    spec = importlib.util.spec_from_file_location("per_sequence_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = torch.get_num_threads()
    try:
        module.main(["--batch", "2", "--heads", "2", "--head-dim", "4", "--lengths", "16", "32", "--rounds", "1"])
    finally:
        torch.set_num_threads(before)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [16, 32] and all(len(r) == 5 and all(float(x) > 0 for x in r[1:]) for r in rows)
    from posenc._per_sequence import _MIN_SCORES as restored
    assert restored == _MIN_SCORES                           # the benchmark leaves the library as it found it
