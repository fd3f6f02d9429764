"""Inputs that once gave a wrong number without a word: each now gives the right one, or a ValueError saying why."""

import math

import numpy as np
import pytest
import torch

import posenc as pe


# ---------------------------------------------------------------------- half precision reaches long distances


def test_half_precision_biases_keep_distances_beyond_float16_s_range():
    """float16 holds no integer above 65504 and bfloat16 rounds those above 256: the distances are taken in float32."""
    n = 70_000
    r = torch.tensor([1.0])
    exact = -torch.log1p(torch.arange(n, dtype=torch.float64))  # KERPLE log with r1 = r2 = 1, by distance
    for dtype in (torch.float16, torch.bfloat16):
        bias = pe.kerple_log_bias(r.to(dtype), r.to(dtype), 1, n)   # (heads, 1 query, n keys)
        got = bias[0, 0].flip(-1).double()
        assert bias.dtype == dtype and bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, exact, rtol=1e-2, atol=0)
        alibi = pe.ALiBi()
        alibi.bind(d_model=8, n_heads=1, n_layers=1)
        row = alibi.distance_bias(n, device="cpu", dtype=dtype)
        assert row.dtype == dtype
        torch.testing.assert_close(row.double(), alibi.distance_bias(n, device="cpu", dtype=torch.float64).to(dtype)
                                   .double(), rtol=0, atol=0)   # rounded once, at the end
    q = torch.randn(1, 2, 1, 8)
    k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
    slopes = torch.tensor([1e-6, 0.0])   # a slope of 0 times an infinite distance was NaN
    reference = pe.relative_attention(q, k, v, slopes=slopes)
    half = pe.relative_attention(q.half(), k.half(), v.half(), slopes=slopes)
    assert bool(torch.isfinite(half).all())
    torch.testing.assert_close(half.float(), reference, rtol=0, atol=2e-2)


def test_sandwich_s_table_is_computed_in_the_dtype_asked_for():
    scheme = pe.Sandwich()
    scheme.bind(d_model=8, n_heads=2, n_layers=1)
    row = scheme.distance_bias(64, device="cpu", dtype=torch.float64)
    exact = pe.sandwich_bias(2, 1, 64, dtype=torch.float64)[:, 0].flip(-1)
    assert row.dtype == torch.float64 and torch.equal(row, exact)


# ---------------------------------------------------------------------- values the formulas cannot take


def test_a_forget_gate_of_exactly_zero_is_refused_rather_than_read_as_nan():
    q = k = v = torch.randn(1, 1, 4, 8)
    log_forget = torch.log(torch.sigmoid(torch.tensor([[[0.0, 0.0, -120.0, 0.0]]])))   # underflows to -inf
    assert math.isinf(log_forget[0, 0, 2])
    for call in (lambda: pe.forgetting_attention(q, k, v, log_forget), lambda: pe.forgetting_bias(log_forget)):
        with pytest.raises(ValueError, match="got -inf.*logsigmoid"):
            call()
    finite = torch.nn.functional.logsigmoid(torch.tensor([[[0.0, 0.0, -120.0, 0.0]]]))
    assert bool(torch.isfinite(pe.forgetting_attention(q, k, v, finite)).all())


def test_a_distance_table_may_mask_with_minus_infinity_but_not_hold_nan_or_plus_infinity():
    q = k = v = torch.randn(1, 2, 4, 8)
    for bad in (math.nan, math.inf):
        table = torch.zeros(2, 4)
        table[0, 1] = bad
        with pytest.raises(ValueError, match="distance_bias must hold finite values, or -inf"):
            pe.relative_attention(q, k, v, distance_bias=table)
    table = torch.zeros(2, 4)
    table[0, 1] = -math.inf   # distance 1 masked for head 0
    out, weights = pe.relative_attention(q, k, v, distance_bias=table, return_weights=True)
    assert bool(torch.isfinite(out).all()) and bool((weights[0, 0].diagonal(-1) == 0).all())


def test_cope_positions_want_square_gates_in_zero_one():
    for gates in (torch.ones(2, 3), torch.tensor([[-1.0, 0.0], [0.5, 1.0]]), torch.tensor([[math.nan, 0.0], [0.5, 1.0]])):
        with pytest.raises(ValueError, match="gates must"):
            pe.cope_positions(gates, 4)
    assert torch.equal(pe.cope_positions(torch.tensor([[1.0, 0.0], [0.5, 1.0]])), torch.tensor([[1.0, 0.0], [1.5, 1.0]]))


def test_empty_inputs_raise_instead_of_averaging_nothing():
    with pytest.raises(ValueError, match="no rows"):
        pe.locally_accumulated_attention(torch.full((0, 4, 4), 0.25), 0.5)
    with pytest.raises(ValueError, match="head dimension >= 1"):
        pe.diag_attention(torch.randn(1, 1, 3, 0), torch.randn(1, 1, 3, 0), torch.randn(1, 1, 3, 4), block_size=2)


# ---------------------------------------------------------------------- numbers read in the right precision, or refused


def test_a_list_of_decays_is_read_in_the_queries_dtype():
    q, k, v = (torch.randn(1, 1, 6, 4, dtype=torch.float64) for _ in range(3))
    gamma = 1 - 1e-9   # 1.0 in float32: no decay at all
    from_list = pe.decayed_linear_attention(q, k, v, [gamma], normalize=False)
    from_tensor = pe.decayed_linear_attention(q, k, v, torch.tensor([gamma], dtype=torch.float64), normalize=False)
    assert torch.equal(from_list, from_tensor)
    assert not torch.equal(from_list, pe.decayed_linear_attention(q, k, v, [1.0], normalize=False))
    q16, k16, v16 = (t.to(torch.bfloat16) for t in (q, k, v))   # half precision: not rounded to 1 either
    torch.testing.assert_close(pe.decayed_linear_attention(q16, k16, v16, [0.999], normalize=False).double(),
                               pe.decayed_linear_attention(q, k, v, [0.999], normalize=False), rtol=0.05, atol=0.05)
    assert not torch.equal(pe.decayed_linear_attention(q16, k16, v16, [0.999], normalize=False),
                           pe.decayed_linear_attention(q16, k16, v16, [1.0], normalize=False))


def test_booleans_are_not_frequencies_and_two_spellings_of_a_rule_must_agree():
    with pytest.raises(ValueError, match="got booleans"):
        pe.apply_rope(torch.randn(1, 2, 4, 4), inv_freq=[True, False])
    with pytest.raises(ValueError, match="'method' twice with different values"):
        pe.rope_scaling({"type": "linear", "rope_type": "yarn", "factor": 2})
    assert pe.rope_scaling({"type": "yarn", "rope_type": "yarn", "factor": 2}).method == "yarn"   # as HF writes it


def test_position_ids_below_zero_or_of_the_wrong_kind_are_refused_by_the_embedding_hooks():
    for name in ("sinusoidal", "learned"):
        scheme = pe.position_scheme(name, **({"max_len": 8} if name == "learned" else {}))
        scheme.bind(d_model=4, n_heads=1, n_layers=1)
        x = torch.zeros(1, 2, 4)
        with pytest.raises(ValueError, match="ids >= 0"):   # row -1 would be the table's last row
            scheme.embed(x, torch.tensor([[-1, 1]]))
        for ids in (torch.tensor([[0.0, 1.0]]), torch.tensor([[0, 1, 2]])):
            with pytest.raises(ValueError, match="integer ids of shape"):
                scheme.embed(x, ids)
        assert scheme.embed(torch.zeros(1, 0, 4), torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0, 4)
    sinusoidal = pe.position_scheme("sinusoidal")
    sinusoidal.bind(d_model=4, n_heads=1, n_layers=1)
    torch.testing.assert_close(sinusoidal.embed(torch.zeros(1, 2, 4), torch.tensor([[3, 5]]))[0],
                               pe.sinusoidal_embedding(6, 4)[[3, 5]])


# ---------------------------------------------------------------------- names and options read one way


def test_a_scheme_name_that_reads_as_a_registered_one_is_refused(monkeypatch):
    monkeypatch.setattr(pe.scheme, "_REGISTRY", dict(pe.scheme._REGISTRY))   # the registry as it was, afterwards
    monkeypatch.setattr(pe.scheme, "POSITION_SCHEMES", pe.scheme.POSITION_SCHEMES)

    class Flat(pe.PositionScheme):
        def slopes(self):
            return torch.zeros(self.n_heads)

    for name in ("ALiBi", "Kerple-Log", "NoPE"):   # "alibi", "kerple_log", "none" as TinyLM reads them
        with pytest.raises(ValueError, match="already registered"):
            pe.register_scheme(name, Flat)
    with pytest.raises(ValueError, match="needs a scheme class or a function"):
        pe.register_scheme("not_a_factory", 3)
    pe.register_scheme("returns_a_number_for_this_test", lambda: 3)
    with pytest.raises(ValueError, match="returned 'int', not a posenc.PositionScheme"):
        pe.TinyLM(8, 16, 1, 2, position="returns_a_number_for_this_test")
    assert "returns_a_number_for_this_test" in pe.POSITION_SCHEMES   # the list is read when asked for
    assert pe.POSITION_SCHEMES == pe.scheme.POSITION_SCHEMES and "POSITION_SCHEMES" in dir(pe)


def test_attention_layer_options_reach_the_layer_and_unknown_ones_are_named():
    assert pe.attention_layer("diag", 8, 2, kind="relu", block_size=4).block_kind == "relu"
    with pytest.raises(ValueError, match=r"takes the options \[.*'ssmax'\], got \['foo'\]"):
        pe.attention_layer("softmax", 8, 2, foo=1)


def test_layer_indices_are_checked():
    cope = pe.CoPE(4)
    cope.bind(d_model=8, n_heads=2, n_layers=2)
    q = torch.randn(1, 2, 5, 4)
    for layer in (2, 1.0, -1):   # -1 read the last layer's table
        with pytest.raises(ValueError, match="layer must"):
            cope.attend(q, q, q, layer=layer)
    layers = pe.LayerSchemes([pe.position_scheme("rope"), pe.NoPE()])
    assert isinstance(layers.layer(1), pe.NoPE)
    with pytest.raises(ValueError, match="one of the 2 layers"):
        layers.layer(2)
    for bad in (pe.NoPE(), None, "rope"):
        with pytest.raises(ValueError, match="a list of PositionScheme objects"):
            pe.LayerSchemes(bad)


def test_a_preset_reads_a_scheme_name_as_the_model_does():
    preset = pe.training_preset("small")
    assert preset.make_model(16, "T5").config["position"] == preset.make_model(16, "t5").config["position"]
    assert preset.make_model(16, "Learned").max_len == preset.make_model(16, "learned").max_len
    with pytest.raises(ValueError, match="max_len_factor"):
        preset.make_model(16, "learned", max_len_factor=True)


def test_progress_and_the_seed_variable_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="progress"):
        pe.train_seeds(lambda: pe.TinyLM(8, 16, 1, 2), pe.MarkovChain(vocab_size=8), [0], steps=1, progress="no")
    for value in ("²", "٣"):   # digits to str.isdigit
        monkeypatch.setenv("POSENC_SEED", value)
        with pytest.raises(ValueError, match="POSENC_SEED must be a non-negative integer"):
            pe.seeds()


# ---------------------------------------------------------------------- evaluation reads what it measures


def test_an_evaluation_refuses_a_model_of_another_vocabulary():
    chain = pe.MarkovChain(vocab_size=16)
    with pytest.raises(ValueError, match="data has vocab_size 16 but the model has 64"):
        pe.evaluate_lengths(pe.TinyLM(64, 16, 1, 2), chain, [16], batches=1, cache=False)
    task = pe.PasskeyRetrieval(key_len=2, n_digits=4, n_filler=3)
    with pytest.raises(ValueError, match="vocabulary of 64 tokens but the task has vocab_size"):
        pe.passkey_accuracy(pe.TinyLM(64, 16, 1, 2), task, [16], samples=2, cache=False)


def test_passkey_accuracy_refuses_logits_it_would_read_wrong():
    task = pe.PasskeyRetrieval(key_len=2, n_digits=4, n_filler=3)

    def logits(ids):   # (batch, seq, vocab), as a model's
        return torch.zeros(*ids.shape, task.vocab_size)

    swapped = lambda ids: logits(ids).transpose(1, 2)   # (batch, vocab, seq), cross_entropy's layout: read wrong
    for model in (swapped, lambda ids: logits(ids)[:, -1], lambda ids: (logits(ids),)):
        with pytest.raises(ValueError, match=r"model must map \(2, 16\) token ids to \(2, 16, vocab >= "):
            pe.passkey_accuracy(model, task, [16], samples=2, cache=False)
    assert pe.passkey_accuracy(logits, task, [16], samples=2, cache=False).shape == (1, 5)


# ---------------------------------------------------------------------- the entropy rate of a chain that oscillates


def _stationary_entropy_rate(chain):
    p = chain.transitions.numpy()
    values, vectors = np.linalg.eig(p.T)
    pi = np.real(vectors[:, np.argmin(abs(values - 1))])
    pi = pi / pi.sum()
    return float((pi * -(p * np.log(np.where(p > 0, p, 1))).sum(1)).sum())


@pytest.mark.parametrize("alpha, seed", [(0.01, 76), (0.05, 21), (0.05, 7)])
def test_the_entropy_rate_of_a_nearly_periodic_or_slow_chain_is_its_stationary_rate(alpha, seed):
    """Power iteration from the uniform start oscillates on these chains; the rate is that of the eigenvector."""
    chain = pe.MarkovChain(vocab_size=3, order=1, alpha=alpha, seed=seed)
    assert chain.entropy_rate() == pytest.approx(_stationary_entropy_rate(chain), rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------- spreads, figures and ledger entries are what they say


def test_a_spread_holds_numbers_from_the_start():
    for bad in (5, "ab", (1.0, "x"), (1.0, None), (True, False), ()):
        with pytest.raises(ValueError, match="Spread"):
            pe.Spread(bad)
    s = pe.Spread([1, np.float32(2.0), torch.tensor(3.0)])
    assert s.values == (1.0, 2.0, 3.0) and all(type(v) is float for v in s.values)
    assert s == pe.Spread((1.0, 2.0, 3.0)) and hash(s) == hash(pe.Spread((1.0, 2.0, 3.0)))


def test_a_figure_of_spreads_or_complex_values_is_refused_when_it_is_made():
    spreads = [pe.Spread((1.0, 2.0)), pe.Spread((2.0, 3.0)), pe.Spread((3.0, 5.0))]
    with pytest.raises(ValueError, match=r"real numbers.*pass its \.mean"):
        pe.viz.curves([64, 128, 256], {"rope": spreads})
    with pytest.raises(ValueError, match="z must hold real numbers"):
        pe.viz.heatmap(np.ones((2, 2), dtype=complex))
    gap = pe.viz.curves([1, 2, 3], {"a": [1.0, None, 3.0]})   # None: a gap, as before
    assert np.isnan(gap.data[0].y[1])


def test_a_ledger_entry_read_back_is_checked_as_when_it_was_recorded():
    good = dict(key="a", source=["press2022alibi"], claim="c", measured="m", verdict="reproduced (at 2L)",
                outcome="reproduced", section="s")
    assert pe.Claim.from_mapping(good).source == ("press2022alibi",)
    for bad in (dict(good, source="press2022alibi"),   # a string read as a list of its characters
                dict(good, source=5), dict(good, outcome="great", verdict="great"),
                dict(good, verdict="not reproduced"), dict(good, key="Not A Key")):
        with pytest.raises(ValueError):
            pe.Claim.from_mapping(bad)
    for bad in ("chapter.ipynb", {"cells": None}):
        with pytest.raises(ValueError, match="executed notebook as a dict"):
            pe.entries_in_notebook(bad)


def test_a_corpus_and_rms_norm_refuse_what_they_cannot_read():
    text = "hello world, " * 20
    for options in (dict(val_fraction="0.1"), dict(val_fraction=None), dict(name=None), dict(name=5)):
        with pytest.raises(ValueError, match="val_fraction|name"):
            pe.CharCorpus(text, **options)
    corpus = pe.CharCorpus(text)
    assert corpus.decode(corpus.encode("hi there")) == "hi there"
    for call in (lambda: corpus.decode(torch.tensor([True, False])), lambda: corpus.decode("abc"),
                 lambda: corpus.encode(5)):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError, match="one dtype"):
        pe.rms_norm(torch.randn(2, 4), weight=torch.ones(4, dtype=torch.float64))
