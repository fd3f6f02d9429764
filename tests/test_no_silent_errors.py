"""Inputs that once gave a silently wrong result or an unhelpful error: each now works or raises a clear ValueError."""

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc as pe
import posenc.train as train_module

SPELLINGS = [int, np.int64, np.int32, torch.tensor]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


def tiny(position="rope", **kw):
    return pe.TinyLM(8, 16, 1, 2, position=position, **kw)


DATA = pe.MarkovChain(8, order=1, seed=0)
RUN = dict(steps=3, seq_len=8, batch_size=2, progress=False)


# ------------------------------------------------------------------ fine-tuning never changes the earlier run

def test_fine_tuning_a_runs_own_model_leaves_the_run_alone():
    first = pe.train(tiny(), DATA, **RUN)
    before = {k: v.clone() for k, v in first.model.state_dict().items()}
    tuned = pe.train(first.model, DATA, init=first, **dict(RUN, seed=1))
    assert tuned.model is not first.model
    assert all(torch.equal(before[k], v) for k, v in first.model.state_dict().items())
    again = pe.train(tiny(), DATA, init=first, cache=False, **dict(RUN, seed=1))  # from first's weights, as its key says
    assert all(torch.equal(a, b) for a, b in zip(tuned.model.state_dict().values(), again.model.state_dict().values()))


# ------------------------------------------------------------------ every option in the config, as a Python value

@settings(max_examples=25, deadline=None)
@given(st.integers(17, 200), st.integers(2, 40), st.integers(1, 64), st.sampled_from(SPELLINGS))
def test_configs_are_equal_for_equal_values_in_any_spelling(max_distance, num_buckets, block, spell):
    num_buckets = 2 * (num_buckets // 2) or 2
    plain = dict(t5=tiny("t5", max_distance=max_distance, num_buckets=num_buckets).config,
                 diag=tiny("none", attention="diag", diag_block=block).config,
                 learned=tiny("learned", max_len=block).config,
                 sandwich=tiny("sandwich", dim=2 * block).config,
                 train=pe.training_preset("small", steps=block, warmup=block - 1))
    spelled = dict(t5=tiny("t5", max_distance=spell(max_distance), num_buckets=spell(num_buckets)).config,
                   diag=tiny("none", attention="diag", diag_block=spell(block)).config,
                   learned=tiny("learned", max_len=spell(block)).config,
                   sandwich=tiny("sandwich", dim=spell(2 * block)).config,
                   train=pe.training_preset("small", steps=spell(block), warmup=spell(block - 1)))
    for key in plain:
        assert json.dumps(spelled[key], default=repr, sort_keys=True) == json.dumps(plain[key], default=repr,
                                                                                   sort_keys=True), key
    assert plain["t5"]["position"]["max_distance"] == max_distance
    assert tiny("t5", max_distance=np.int64(max_distance)).config != tiny("t5", max_distance=max_distance + 1).config


@pytest.mark.parametrize("spell", [float, np.float64, lambda v: torch.tensor(v, dtype=torch.float64)])
def test_numbers_of_a_scheme_of_ours_enter_its_config_as_python_values(spell):
    class Rate(pe.PositionScheme):
        def __init__(self, rate):
            super().__init__()
            self.rate = rate

        def distance_bias(self, length, *, device, dtype):
            return -self.rate * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)

    assert tiny(Rate(spell(0.5))).config["position"]["rate"] == 0.5


def test_train_takes_numpy_integers_and_keys_them_as_ints():
    a = pe.train(tiny(), DATA, **RUN)
    b = pe.train(tiny(), DATA, **dict(RUN, steps=np.int64(3), seq_len=np.int32(8), seed=np.int64(0)))
    assert b.from_cache and b.key == a.key
    lengths = 4 * 2 ** np.arange(2)
    assert list(pe.evaluate_lengths(a.model, DATA, lengths, batches=1, batch_size=2)) == [4, 8]


# ------------------------------------------------------------------ the hooks' contracts

class Biased(pe.PositionScheme):
    def __init__(self, value, at=1):
        super().__init__()
        self.value, self.at = value, at

    def distance_bias(self, length, *, device, dtype):
        table = -torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length).clone()
        table[:, min(self.at, length - 1)] = self.value
        return table


@pytest.mark.parametrize("value,at", [(float("nan"), 1), (float("inf"), 1), (float("nan"), 0), (-float("inf"), 0)])
def test_a_bias_table_with_nan_or_inf_is_refused(value, at):
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        tiny(Biased(value, at))


def test_a_bias_of_minus_infinity_masks_a_distance():
    model = tiny(Biased(-float("inf"), 1))
    assert torch.isfinite(model(torch.zeros(1, 5, dtype=torch.long))).all()


@pytest.mark.parametrize("hook, source", [
    ("distance_bias", "def distance_bias(self, seq_len, device=None):\n    return None"),          # no dtype
    ("distance_bias", "def distance_bias(self):\n    return None"),                                   # no length
    ("rotate", "def rotate(self, q, k):\n    return q"),                                              # q and k apart
    ("embed", "def embed(self, x, positions, scale):\n    return x"),                                # an extra argument
    ("slopes", "def slopes(self, n_heads):\n    return None"),
])
def test_a_hook_with_another_signature_is_refused_at_construction_naming_the_right_one(hook, source):
    namespace = {}
    exec(source, namespace)
    scheme = type("Mine", (pe.PositionScheme,), {hook: namespace[hook]})
    with pytest.raises(ValueError, match=f"Mine\\.{hook}.*define it as {hook}\\(self"):
        tiny(scheme())
    if hook != "embed":                                                           # (no embedding per layer)
        with pytest.raises(ValueError, match=f"Mine\\.{hook}"):                # in a per-layer list too
            pe.TinyLM(12, d_model=32, n_layers=2, n_heads=2, position=[scheme(), "none"])


def test_hooks_that_leave_out_positions_or_use_other_names_are_accepted():
    class Named(pe.PositionScheme):
        def distance_bias(self, n, *, device=None, dtype=None, **unused):
            return -torch.arange(n, device=device, dtype=dtype).expand(self.n_heads, n)

        def rotate(self, stacked):                                                   # contiguous ids only
            return stacked

    assert torch.isfinite(tiny(Named())(torch.zeros(1, 5, dtype=torch.long))).all()


class Rotating(pe.PositionScheme):
    def __init__(self, change):
        super().__init__()
        self.change = change

    def rotate(self, qk):
        return self.change(qk)


class Embedding(pe.PositionScheme):
    def __init__(self, change):
        super().__init__()
        self.change = change

    def embed(self, x):
        return self.change(x)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["drop", "add", "dtype", "none", "first", "list"]), st.booleans())
def test_a_hook_must_keep_shape_and_dtype(how, rotate):
    change = dict(drop=lambda t: t[..., :-1], add=lambda t: torch.cat((t, t[..., :1]), -1), dtype=lambda t: t.double(),
                  none=lambda t: None, first=lambda t: t[0], list=lambda t: [t])[how]
    if not rotate and how == "drop":
        change = lambda t: t[:, :-1]  # noqa: E731 - a position dropped
    scheme = Rotating(change) if rotate else Embedding(change)
    with pytest.raises(ValueError, match="must return a tensor of the shape and dtype"):
        tiny(scheme)(torch.zeros(2, 8, dtype=torch.long))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.integers(1, 3), st.booleans())
def test_hooks_that_keep_the_contract_run(seq, batch, rotate):
    scheme = Rotating(lambda t: t.flip(-1)) if rotate else Embedding(lambda t: t + 1.0)
    out = tiny(scheme)(torch.zeros(batch, seq, dtype=torch.long))
    assert out.shape == (batch, seq, 8) and torch.isfinite(out).all()


@pytest.mark.parametrize("make", [
    lambda self: setattr(self, "embed", torch.nn.Linear(2, 2)),
    lambda self: setattr(self, "rotate", lambda qk: qk),
    lambda self: self.register_buffer("slopes", torch.ones(2)),
    lambda self: setattr(self, "slopes", torch.ones(2)),
    lambda self: self.register_parameter("distance_bias", torch.nn.Parameter(torch.zeros(2))),
])
def test_names_of_hooks_are_refused_for_attributes(make):
    class Hiding(pe.PositionScheme):
        def __init__(self):
            super().__init__()
            make(self)

    with pytest.raises(ValueError, match="is a PositionScheme hook"):
        Hiding()


def test_a_scheme_that_skips_super_init_or_super_bind_is_told_so():
    class NoInit(pe.PositionScheme):
        def __init__(self):
            self.rate = 1.0

    class NoBind(pe.PositionScheme):
        def bind(self, *, d_model, n_heads, n_layers):
            self.table = torch.zeros(n_heads)

    with pytest.raises(ValueError, match="super\\(\\).__init__\\(\\)"):
        tiny(NoInit())
    with pytest.raises(ValueError, match="super\\(\\).bind"):
        tiny(NoBind())


# ------------------------------------------------------------------ options checked where they are given

@pytest.mark.parametrize("build", [
    lambda: pe.RoPE(interleaved="no"), lambda: tiny("rope", interleaved="no"),
    lambda: pe.RotaryEmbedding(8, interleaved="no"),
    lambda: pe.apply_rope(torch.zeros(3, 4), interleaved="no"),
])
def test_a_truthy_string_is_not_a_flag(build):
    with pytest.raises(ValueError, match="interleaved must be True or False"):
        build()


@pytest.mark.parametrize("spec", [dict(method="ntk", factor=4, window=8), dict(method="linear", factor=4, group=3),
                                  dict(method="rerope", window=8, factor=4),
                                  dict(method="linear", factor=4, beta_fast=float("nan")),
                                  dict(method="ntk", factor=2, original_max_position=64)])
def test_a_scaling_refuses_fields_its_rule_does_not_read(spec):
    with pytest.raises(ValueError, match="does not use"):
        pe.RopeScaling(**spec)


def test_the_fields_a_scaling_reads_are_kept():
    assert pe.RopeScaling("yarn", 4, 64, beta_fast=16).config()["beta_fast"] == 16
    assert pe.RopeScaling("self_extend", window=8, group=2).config() == dict(method="self_extend", window=8, group=2)


@pytest.mark.parametrize("kw,name", [(dict(attention="softmax", feature="nope"), "feature"),
                                     (dict(attention="softmax", diag_block=0), "diag_block"),
                                     (dict(attention=None), "attention"), (dict(attention=3), "attention"),
                                     (dict(attention=["softmax", 3]), "attention"),
                                     (dict(dropout="0.1"), "dropout")])
def test_model_options_are_checked_whatever_the_attention(kw, name):
    with pytest.raises(ValueError, match=name):
        pe.TinyLM(8, 16, 2, 2, position="none", **kw)


def test_shares_of_attention_need_weights_that_are_shares():
    idx = torch.zeros(1, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="NormAttention"):
        pe.attention_on_first_tokens(pe.TinyLM(8, 16, 2, 2, position="none", attention=["diag", "norm"]), idx)
    shares = pe.attention_on_first_tokens(pe.TinyLM(8, 16, 2, 2, position="none", attention=["diag", "softmax"]), idx)
    assert ((shares >= 0) & (shares <= 1 + 1e-6)).all()


def test_numbers_next_to_float64_tensors_stay_float64():
    r1 = torch.tensor([0.3, 0.7], dtype=torch.float64)
    for kernel in (pe.kerple_power_bias, pe.kerple_log_bias):
        exact = kernel(r1, torch.tensor([0.7, 0.7], dtype=torch.float64), 9)
        assert torch.equal(kernel(r1, 0.7, 9), exact) and kernel(r1, 0.7, 9).dtype == torch.float64
        assert kernel(torch.tensor([0.3], dtype=torch.float32), 0.7, 4).dtype == torch.float32
    freqs = [1.0, 0.1, 0.01 + 1e-9]
    pos = torch.arange(5, dtype=torch.float64) * 1e3
    assert torch.equal(pe.rope_angles(pos, 6, inv_freq=freqs),
                       pe.rope_angles(pos, 6, inv_freq=torch.tensor(freqs, dtype=torch.float64)))
    assert torch.equal(pe.rope_decay_bound(pos, 6, inv_freq=freqs),
                       pe.rope_decay_bound(pos, 6, inv_freq=torch.tensor(freqs, dtype=torch.float64)))


def test_data_and_presets_refuse_bad_values_at_once():
    corpus = pe.CharCorpus("abc " * 100)
    with pytest.raises(ValueError, match="ids must be integers"):
        corpus.decode([-1])
    assert corpus.decode(torch.tensor([], dtype=torch.long)) == ""
    with pytest.raises(ValueError, match="steps"):
        pe.training_preset("small", steps="10")
    with pytest.raises(ValueError, match="length"):
        pe.evaluation_batches(DATA, -1)  # not at the first batch: at the call
    with pytest.raises(ValueError, match="mark_last"):
        pe.FirstTokenRetrieval(mark_last="no")


def test_seed_everything_and_slider_figure_say_what_they_expect():
    with pytest.raises(ValueError, match="seed"):
        pe.seed_everything(1.5)
    with pytest.raises(ValueError, match="plotly Figure"):
        pe.viz.slider_figure(lambda s: None, [1, 2], name="s")


def test_the_meta_device_is_refused_clearly():
    model = tiny("alibi")
    with pytest.raises(ValueError, match="meta device"):
        model(torch.zeros(1, 4, dtype=torch.long, device="meta"))


@pytest.mark.parametrize("position, options", [("learned", dict(max_len=16)), ("sandwich", {}), ("rope", {})])
def test_a_model_on_the_meta_device_says_so(position, options):
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="this model is on the meta device .*to_empty"):
        tiny(position, **options).to("meta")(idx)
    with pytest.raises(ValueError, match="this model is on the meta device"):
        tiny(position, **options).to("meta").attention_inputs(idx)
    with pytest.raises(ValueError, match="TinyLM cannot be built on the meta device"):
        with torch.device("meta"):
            tiny(position, **options)


def test_integer_features_markov_ids_and_huge_tables_are_refused_clearly():
    with pytest.raises(ValueError, match="x must be a floating-point tensor, got dtype torch.int64"):
        pe.elu_plus_one(torch.tensor([1, 2]))
    chain = pe.MarkovChain(4, order=1, seed=0)
    x, y = chain.batch(2, 6, torch.Generator().manual_seed(0))
    assert chain.optimal_nll(x, y).shape == (2, 6)
    with pytest.raises(ValueError, match=r"ids in \[0, 4\), got 0 to 4"):
        chain.optimal_nll(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[1, 2, 3, 4]]))  # an IndexError before
    with pytest.raises(ValueError, match=r"ids in \[0, 4\), got -1 to 2"):  # a silently wrong loss before (row -1)
        chain.optimal_nll(torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="integer token ids"):
        chain.optimal_nll(x.float(), y.float())
    with pytest.raises(ValueError, match=r"4294967296 float64 probabilities, 32 GiB \(max 2\*\*24"):
        pe.MarkovChain(vocab_size=65536, order=1)  # refused before allocating it


def test_numpy_and_tensor_integers_are_accepted_everywhere():
    task = pe.PasskeyRetrieval(np.int64(2), np.int64(10), torch.tensor(4))
    assert task.config == pe.PasskeyRetrieval(2, 10, 4).config and type(task.key_len) is int
    x, _ = task.batch(np.int64(2), np.int32(12))
    assert x.shape == (2, 12)
    model = pe.TinyLM(task.vocab_size, 16, 1, 2, position="rope")
    acc = pe.passkey_accuracy(model, task, [np.int64(12)], depths=[0.5], samples=np.int64(2), seed=np.int64(0))
    assert acc.shape == (1, 1)
    assert torch.equal(pe.rope_frequencies_llama3(np.int64(8)), pe.rope_frequencies_llama3(8))
    assert torch.equal(pe.rope_frequencies_dynamic_ntk(np.int64(8), 100, 64), pe.rope_frequencies_dynamic_ntk(8, 100, 64))
    assert pe.Sandwich(np.int64(16)).config() == pe.Sandwich(16).config()
    idx = torch.zeros(1, 6, dtype=torch.long)
    assert torch.equal(pe.attention_on_first_tokens(model, idx, 2, from_position=np.int64(3)),
                       pe.attention_on_first_tokens(model, idx, 2, from_position=3))


# ------------------------------------------------------------------ nothing half-written

def test_an_interrupted_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    real = torch.save

    def interrupted(obj, f, *a, **k):
        real(obj, f, *a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pe.train(tiny(), DATA, **RUN)
    monkeypatch.setattr(torch, "save", real)
    assert not list(tmp_path.rglob("*.tmp*"))


def test_temporaries_of_dead_writers_go_when_any_run_is_trained(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    dead = 2 ** 22 + 12345  # above Linux's default pid_max: no such process
    stray = runs / f"0123456789abcdef.pt.tmp{dead}.deadbeef"
    stray.write_bytes(b"half")
    mine = runs / f"fedcba9876543210.pt.tmp{os.getppid()}.cafe0000"  # a live process's file is kept
    mine.write_bytes(b"writing")
    pe.train(tiny(), DATA, **RUN)
    assert not stray.exists() and mine.exists()


def test_a_scheme_of_ones_own_with_a_short_table_names_it_the_position_and_the_table():
    class MyLearned(pe.PositionScheme):
        def __init__(self, size):
            super().__init__()
            self.size = size

        def bind(self, *, d_model, n_heads, n_layers):
            super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
            self.table = torch.nn.Embedding(self.size, d_model)

        def embed(self, x, positions=None):
            ids = torch.arange(x.shape[1]) if positions is None else positions
            return x + self.table(ids)

    model = tiny(MyLearned(8))
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 8)
    with pytest.raises(ValueError, match=r"MyLearned\.embed\(\) raised IndexError .* up to 11: .*\[8\] rows"):
        model(torch.zeros(1, 12, dtype=torch.long))  # a raw IndexError before
    with pytest.raises(ValueError, match=r"MyLearned\.embed\(\) raised IndexError .* up to 9: .*\[8\] rows"):
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.tensor([0, 4, 9]))


class _ShortRotation(pe.PositionScheme):
    """A scheme of one's own that rotates by a learned angle table of 8 rows."""

    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.angles = torch.nn.Parameter(torch.zeros(8, d_model // n_heads // 2))

    def rotate(self, qk, positions=None):
        ids = torch.arange(qk.shape[-2]) if positions is None else positions
        theta = self.angles[ids]                                                  # IndexError beyond 8
        cos, sin = theta.cos().repeat_interleave(2, -1), theta.sin().repeat_interleave(2, -1)
        pair = torch.stack((-qk[..., 1::2], qk[..., 0::2]), -1).flatten(-2)
        return qk * cos + pair * sin


class _ShortBias(pe.PositionScheme):
    """A scheme of one's own with a learned bias table of 8 distances."""

    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.table = torch.nn.Parameter(torch.zeros(n_heads, 8))

    def distance_bias(self, length, *, device=None, dtype=None):
        return self.table[:, torch.arange(length)]                               # IndexError beyond 8


@pytest.mark.parametrize("scheme, hook", [(_ShortRotation, "rotate"), (_ShortBias, "distance_bias")])
def test_a_table_of_your_own_shorter_than_the_sequence_is_named_in_every_hook(scheme, hook):
    model = pe.TinyLM(16, d_model=16, n_layers=1, n_heads=2, position=scheme())
    model(torch.randint(0, 16, (1, 8)))                                          # fits
    with pytest.raises(ValueError, match=rf"{scheme.__name__}\.{hook}.*IndexError.*larger one"):
        model(torch.randint(0, 16, (1, 12)))
