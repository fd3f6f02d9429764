"""The evaluation cache: the same weights, settings, data and arguments give the stored numbers; anything else measures."""

import os
import warnings
from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe
from posenc import _evalcache
from posenc.model import TinyLM

CHAIN = pe.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0)
PASSKEY = pe.PasskeyRetrieval(key_len=1, n_digits=8, n_filler=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    monkeypatch.setenv("POSENC_EVAL_CACHE", "1")
    return tmp_path / "evals"


def model(vocab=8, **kwargs):
    torch.manual_seed(0)
    return TinyLM(vocab, 32, 2, 4, **{"position": "rope", **kwargs})


def forwards():
    return mock.patch.object(TinyLM, "forward", autospec=True, side_effect=TinyLM.forward)


def same(a, b):
    return list(a) == list(b) and all(
        (a[n].length, a[n].loss, a[n].ppl, a[n].accuracy, a[n].tokens) == (b[n].length, b[n].loss, b[n].ppl, b[n].accuracy, b[n].tokens)
        and torch.equal(a[n].position_loss, b[n].position_loss) for n in a)


@pytest.mark.parametrize("position", ["rope", "alibi", "xpos", "t5", "learned"])
def test_a_second_evaluation_is_served_from_the_cache_with_the_same_numbers(cache, position):
    m = model(position=position, max_len=128) if position == "learned" else model(position=position)
    first = pe.evaluate_lengths(m, CHAIN, [16, 64, 128], batches=2)
    with forwards() as forward:
        again = pe.evaluate_lengths(m, CHAIN, [16, 64, 128], batches=2)
    assert forward.call_count == 0 and same(first, again)
    assert same(first, pe.evaluate_lengths(m, CHAIN, [16, 64, 128], batches=2, cache=False))
    assert len(list(cache.glob("*.pt"))) == 3  # one entry per length


def change_weight(m):
    with torch.no_grad():
        m.head.weight[0, 0] += 1e-3


def change_window(m):
    m.window = 8


def change_scaling(m):
    m.train_len = 16
    m.rope_scaling = ("yarn", 4)


def change_sinks(m):
    m.window, m.sinks = 16, 2


@pytest.mark.parametrize("change", [change_weight, change_window, change_scaling, change_sinks])
def test_a_changed_model_is_measured_again(cache, change):
    m = model()
    pe.evaluate_lengths(m, CHAIN, [16, 64], batches=2)
    change(m)
    with forwards() as forward:
        changed = pe.evaluate_lengths(m, CHAIN, [16, 64], batches=2)
    assert forward.call_count > 0
    assert same(changed, pe.evaluate_lengths(m, CHAIN, [16, 64], batches=2, cache=False))


@pytest.mark.parametrize("other", [dict(seed=5), dict(batches=3), dict(batch_size=4), dict(lengths=[16, 32]),
                                   dict(split="train"), dict(max_tokens=64), dict(data=pe.MarkovChain(8, 2, 0.1, seed=1)),
                                   dict(position_sampling="randomized", max_position=256)])
def test_other_arguments_or_data_are_measured_again(cache, other):
    m = model()
    base = dict(data=CHAIN, lengths=[16, 64], batches=2)
    pe.evaluate_lengths(m, **base)
    with forwards() as forward:
        pe.evaluate_lengths(m, **{**base, **other})
    assert forward.call_count > 0


def test_passkey_grids_are_cached_and_checked(cache):
    m = model(PASSKEY.vocab_size, position="alibi")
    first = pe.passkey_accuracy(m, PASSKEY, [32, 64], samples=4)
    with forwards() as forward:
        again = pe.passkey_accuracy(m, PASSKEY, [32, 64], samples=4)
        assert forward.call_count == 0 and torch.equal(first, again)
        other_depths = pe.passkey_accuracy(m, PASSKEY, [32, 64], depths=[0.5], samples=4)
        assert forward.call_count > 0 and other_depths.shape == (2, 1)
    assert torch.equal(first, pe.passkey_accuracy(m, PASSKEY, [32, 64], samples=4, cache=False))


def test_a_model_with_a_hook_or_a_replaced_forward_is_never_cached(cache):
    m = model()
    handle = m.register_forward_hook(lambda module, args, out: out * 2)
    pe.evaluate_lengths(m, CHAIN, [16], batches=1)
    assert not list(cache.glob("*.pt"))
    handle.remove()
    m.forward = lambda *args, **kwargs: TinyLM.forward(m, *args, **kwargs)
    pe.evaluate_lengths(m, CHAIN, [16], batches=1)
    assert not list(cache.glob("*.pt"))
    passkey_callable = lambda x: torch.zeros(*x.shape, PASSKEY.vocab_size)   # not a module: never cached
    pe.passkey_accuracy(passkey_callable, PASSKEY, [32], samples=2)
    assert not list(cache.glob("*.pt"))


def test_a_damaged_entry_is_warned_about_measured_and_replaced(cache):
    m = model()
    first = pe.evaluate_lengths(m, CHAIN, [16], batches=2)
    (entry,) = cache.glob("*.pt")
    entry.write_bytes(entry.read_bytes()[:50])
    with pytest.warns(RuntimeWarning, match="cannot be used"), forwards() as forward:
        again = pe.evaluate_lengths(m, CHAIN, [16], batches=2)
    assert forward.call_count > 0 and same(first, again)
    def stored(result):   # with a digest that matches: the entry's values are still checked
        torch.save(dict(key=entry.stem, result=result, digest=_evalcache.digest(result)), entry)

    stored([64, 1.0, 2.7, 0.5, 10, torch.zeros(64)])   # another length
    with pytest.warns(RuntimeWarning, match="another length"):
        assert same(first, pe.evaluate_lengths(m, CHAIN, [16], batches=2))
    stored([16, 1.0, 2.7, 1.5, 10, torch.zeros(16)])   # accuracy above 1
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert same(first, pe.evaluate_lengths(m, CHAIN, [16], batches=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same(first, pe.evaluate_lengths(m, CHAIN, [16], batches=2))   # the replaced entry is good
    assert not [p for p in cache.iterdir() if ".tmp" in p.name]


def test_the_switch_and_the_argument_turn_it_off(cache, monkeypatch):
    m = model()
    pe.evaluate_lengths(m, CHAIN, [16], batches=1, cache=False)
    pe.passkey_accuracy(model(PASSKEY.vocab_size), PASSKEY, [32], samples=2, cache=False)
    monkeypatch.setenv("POSENC_EVAL_CACHE", "0")
    pe.evaluate_lengths(m, CHAIN, [16], batches=1)
    assert not cache.exists() or not list(cache.iterdir())


def test_an_unwritable_cache_costs_a_warning_not_the_result(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("POSENC_CACHE", str(blocker))
    monkeypatch.setenv("POSENC_EVAL_CACHE", "1")
    _evalcache._warn_unwritable.cache_clear()
    m = model()
    with pytest.warns(RuntimeWarning, match="could not write the evaluation cache"):
        result = pe.evaluate_lengths(m, CHAIN, [16], batches=1)
    assert same(result, pe.evaluate_lengths(m, CHAIN, [16], batches=1, cache=False))


def test_a_user_scheme_is_keyed_by_its_source(cache):
    class Bias(pe.PositionScheme):
        def distance_bias(self, length, *, device, dtype):
            return -0.5 * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)

    class Steeper(Bias):
        def distance_bias(self, length, *, device, dtype):
            return -2.0 * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)

    torch.manual_seed(0)
    a = TinyLM(8, 32, 2, 4, position=Bias())
    torch.manual_seed(0)
    b = TinyLM(8, 32, 2, 4, position=Steeper())
    key = lambda m: _evalcache.evaluation_key("evaluate_lengths", m, CHAIN, torch.device("cpu"), lengths=[16])
    assert key(a) is not None and key(a) != key(b)
    assert not same(pe.evaluate_lengths(a, CHAIN, [64], batches=1), pe.evaluate_lengths(b, CHAIN, [64], batches=1))


@settings(max_examples=15)
@given(lengths=st.lists(st.sampled_from([8, 16, 24, 40, 64]), min_size=1, max_size=4, unique=True),
       seed=st.integers(0, 3), position=st.sampled_from(["rope", "alibi", "none"]))
def test_cached_results_equal_measured_ones(tmp_path_factory, lengths, seed, position):
    with mock.patch.dict(os.environ, POSENC_CACHE=str(tmp_path_factory.mktemp("c")), POSENC_EVAL_CACHE="1"):
        m = model(position=position)
        first = pe.evaluate_lengths(m, CHAIN, lengths, batches=1, seed=seed)
        with forwards() as forward:
            again = pe.evaluate_lengths(m, CHAIN, lengths, batches=1, seed=seed)
        assert forward.call_count == 0
        assert same(first, again) and same(again, pe.evaluate_lengths(m, CHAIN, lengths, batches=1, seed=seed, cache=False))


def test_a_dead_writers_temporary_file_is_removed_when_an_entry_is_written(cache):
    cache.mkdir(parents=True)
    dead = cache / "0123456789abcdef.pt.tmp999999999.deadbeef"     # no such process
    dead.write_bytes(b"half a file")
    pe.evaluate_lengths(model(), CHAIN, [16], batches=1)
    assert not dead.exists() and len(list(cache.glob("*.pt"))) == 1


def test_a_length_beyond_the_table_is_refused_before_any_length_is_measured(cache):
    m = model(position="learned", max_len=64)
    with forwards() as forward, pytest.raises(ValueError, match=r"\[96, 128\].*max_len=64"):
        pe.evaluate_lengths(m, CHAIN, [16, 96, 32, 128], batches=1)
    assert forward.call_count == 0 and not list(cache.glob("*.pt"))
    with forwards() as forward, pytest.raises(ValueError, match=r"max_position 96.*max_len=64"):
        pe.evaluate_lengths(m, CHAIN, [16], batches=1, position_sampling="randomized", max_position=96)
    assert forward.call_count == 0


@pytest.mark.parametrize("sampling", [None, "randomized"])
@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_an_evaluation_stopped_midway_keeps_the_lengths_it_measured(cache, monkeypatch, sampling, failure):
    """An interrupt (or an error) at the third length keeps the first two: a rerun measures only the rest."""
    lengths = [16, 24, 32, 40]
    extra = dict(position_sampling=sampling, max_position=64) if sampling else {}
    m = model()
    whole = pe.evaluate_lengths(m, CHAIN, lengths, batches=2, cache=False, **extra)
    asked = []
    batch = CHAIN.batch

    def stopping(batch_size, length, generator, **kw):  # the data source, stopping at length 32
        asked.append(length)
        if length == 32 and failure is not None:
            raise failure("stopped")
        return batch(batch_size, length, generator, **kw)

    monkeypatch.setattr(CHAIN, "batch", stopping)      # the same data (its class and config are the key's)
    m.train()
    with pytest.raises(failure):
        pe.evaluate_lengths(m, CHAIN, lengths, batches=2, **extra)
    assert m.training                                  # its mode is restored
    m.eval()
    failure = None
    asked.clear()
    again = pe.evaluate_lengths(m, CHAIN, lengths, batches=2, **extra)
    assert sorted(set(asked)) == [32, 40]              # 16 and 24 came from the cache
    assert same(whole, again)                          # and the numbers are those of one uninterrupted evaluation
    asked.clear()
    assert same(whole, pe.evaluate_lengths(m, CHAIN, lengths, batches=2, **extra)) and not asked
