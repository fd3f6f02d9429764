"""Training, evaluation and their caches: wrong inputs raise a clear ValueError, wrong cache entries are not trusted."""

import importlib
import math
import warnings
import zipfile
from unittest import mock

import pytest
import torch

import posenc as pe
from posenc import _evalcache
from posenc.model import TinyLM

T = importlib.import_module("posenc.train")

CHAIN = pe.MarkovChain(vocab_size=8, order=1, seed=0)
TASK = pe.PasskeyRetrieval(key_len=2, n_digits=4, n_filler=3)
RUN = dict(steps=3, seq_len=8, batch_size=2, progress=False)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


def tiny(vocab=8):
    return TinyLM(vocab, 16, 1, 2)


def forwards():
    return mock.patch.object(TinyLM, "forward", autospec=True, side_effect=TinyLM.forward)


def cached_runs(tmp_path):
    return sorted((tmp_path / "runs").glob("*.pt")) if (tmp_path / "runs").exists() else []


# ------------------------------------------------------------------ a device this machine does not have

BAD_DEVICES = ["gpu", "cuda:99", "cpu:x"] + ([] if torch.cuda.is_available() else ["cuda", 0])
CALLS = {
    "train": lambda device: pe.train(tiny(), CHAIN, device=device, **RUN),
    "evaluate_lengths": lambda device: pe.evaluate_lengths(tiny(), CHAIN, [8], batches=1, device=device),
    "passkey_accuracy": lambda device: pe.passkey_accuracy(tiny(TASK.vocab_size), TASK, [8], samples=2,
                                                           device=device),
}


@pytest.mark.parametrize("device", BAD_DEVICES)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_device_this_machine_lacks_is_refused_naming_those_it_has(call, device, tmp_path):
    with pytest.raises(ValueError, match=r"device.*this machine has 'cpu'"):
        CALLS[call](device)
    assert not cached_runs(tmp_path)


@pytest.mark.parametrize("call", list(CALLS))
def test_the_cpu_is_accepted_by_name_and_as_a_device(call):
    CALLS[call]("cpu")
    CALLS[call](torch.device("cpu"))


# ------------------------------------------------------------------ TinyLM.loss checks its targets

IDS = torch.randint(8, (2, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("targets, message", [
    (torch.full((2, 8), 9), r"token ids in \[0, 8\).*or -100.*from 9 to 9"),
    (torch.full((2, 8), -5), r"token ids in \[0, 8\)"),
    (torch.zeros(2, 8), "integer token ids.*float32"),
    (torch.zeros(2, 8, dtype=torch.bool), "integer token ids.*bool"),
    (torch.zeros(3, 8, dtype=torch.long), r"shape of idx.*\(2, 8\), got \(3, 8\)"),
    (torch.zeros(16, dtype=torch.long), r"shape of idx.*got \(16,\)"),
    ([[0] * 8] * 2, "tensor of token ids, got list"),
    (torch.full((2, 8), -100), "no counted target"),
])
def test_loss_refuses_wrong_targets(targets, message):
    with pytest.raises(ValueError, match=message):
        tiny().loss(IDS, targets)


def test_loss_of_valid_targets_is_the_cross_entropy_as_before():
    model = tiny()
    targets = torch.randint(8, (2, 8), generator=torch.Generator().manual_seed(1))
    targets[0, :3] = -100
    expected = torch.nn.functional.cross_entropy(model(IDS).flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert torch.equal(model.loss(IDS, targets), expected)
    assert torch.equal(model.loss(IDS, targets.int()), expected)   # int32 ids, as idx accepts them


# ------------------------------------------------------------------ passkey_accuracy's arguments


@pytest.mark.parametrize("call, message", [
    (lambda r: pe.passkey_accuracy(r, TASK, [16], samples=2), "got TrainResult: pass result.model"),
    (lambda r: pe.passkey_accuracy(r.model, TASK, 16, samples=2), r"lengths must be a sequence.*got 16"),
    (lambda r: pe.passkey_accuracy(r.model, TASK, torch.tensor(16), samples=2), "lengths must be a sequence"),
    (lambda r: pe.passkey_accuracy(r.model, TASK, [16], depths=0.5, samples=2), r"depths must be a sequence.*0\.5"),
    (lambda r: pe.passkey_accuracy(r.model, TASK, [16], depths="0.5", samples=2), "depths must be a sequence"),
    (lambda r: pe.passkey_accuracy("model", TASK, [16], samples=2), "model must map .* got str"),
])
def test_passkey_accuracy_refuses_a_train_result_and_single_values(call, message):
    result = pe.train(tiny(TASK.vocab_size), TASK, **dict(RUN, seq_len=16))
    with pytest.raises(ValueError, match=message):
        call(result)


# ------------------------------------------------------------------ flags are True or False, never a truthy string

@pytest.mark.parametrize("call", [
    lambda: tiny()(IDS, return_attention="no"),
    lambda: tiny()(IDS, "yes"),
    lambda: pe.train(tiny(), CHAIN, **dict(RUN, cache="no")),
    lambda: pe.train(tiny(), CHAIN, **dict(RUN, progress="no")),
    lambda: pe.evaluate_lengths(tiny(), CHAIN, [8], batches=1, cache="no"),
    lambda: pe.passkey_accuracy(tiny(TASK.vocab_size), TASK, [8], samples=2, cache="no"),
])
def test_flags_refuse_a_truthy_string(call, tmp_path):
    with pytest.raises(ValueError, match="must be True or False, got '(no|yes)'"):
        call()
    assert not cached_runs(tmp_path)


def test_flags_accept_booleans():
    model = tiny()
    logits, weights = model(IDS, return_attention=True)
    assert logits.shape == (2, 8, 8) and len(weights) == 1
    assert torch.allclose(model(IDS, return_attention=False), logits, atol=1e-6)


# ------------------------------------------------------------------ a run without counted targets, or diverging


def test_a_run_without_counted_targets_raises_and_caches_nothing(tmp_path):
    lagged = pe.LaggedCopy(vocab_size=8, lag=10)   # lag >= seq_len: every target ignored
    with pytest.raises(ValueError, match="step 0 has no counted target.*lag >= seq_len=8"):
        pe.train(tiny(), lagged, **RUN)
    assert not cached_runs(tmp_path)


def test_a_diverging_run_raises_naming_the_step_and_caches_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"loss became nan at step \d+: training diverged; try a lower lr"):
        pe.train(tiny(), CHAIN, **dict(RUN, steps=6, lr=1e6))
    assert not cached_runs(tmp_path)


def test_weights_that_become_nan_at_the_last_step_raise_and_are_not_cached(tmp_path, monkeypatch):
    adamw = T._adamw

    def poisoned(groups, lr):
        opt = adamw(groups, lr)
        step = opt.step

        def last_step_poisons(*args, **kwargs):
            step(*args, **kwargs)
            with torch.no_grad():
                groups[0]["params"][0].fill_(math.nan)

        opt.step = last_step_poisons
        return opt

    monkeypatch.setattr(T, "_adamw", poisoned)
    with pytest.raises(ValueError, match="weights became NaN or infinite in the last of the 1 steps"):
        pe.train(tiny(), CHAIN, **dict(RUN, steps=1, warmup=1))
    assert not cached_runs(tmp_path)


# ------------------------------------------------------------------ the run cache checks its digest


def flip_a_byte_of_the_largest_tensor(path):
    """Flip one byte inside the stored bytes of the largest tensor of a torch.save file (a zip archive)."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    blob = bytearray(path.read_bytes())
    header = info.header_offset
    start = header + 30 + int.from_bytes(blob[header + 26:header + 28], "little") + int.from_bytes(
        blob[header + 28:header + 30], "little")
    blob[start + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(blob))


def test_a_run_entry_with_a_flipped_byte_is_warned_about_and_retrained(tmp_path):
    first = pe.train(tiny(), CHAIN, **RUN)
    (path,) = cached_runs(tmp_path)
    assert "digest" in torch.load(path, weights_only=True)
    flip_a_byte_of_the_largest_tensor(path)
    with pytest.warns(RuntimeWarning, match="do not match its digest"):
        again = pe.train(tiny(), CHAIN, **RUN)
    assert not again.from_cache and again.losses == first.losses
    assert all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(),
                                                 again.model.state_dict().values()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pe.train(tiny(), CHAIN, **RUN).from_cache   # the entry was replaced


def test_a_run_entry_with_edited_losses_is_retrained(tmp_path):
    pe.train(tiny(), CHAIN, **RUN)
    (path,) = cached_runs(tmp_path)
    saved = torch.load(path, weights_only=True)
    saved["losses"][1] = 0.0
    torch.save(saved, path)
    with pytest.warns(RuntimeWarning, match="do not match its digest"):
        assert not pe.train(tiny(), CHAIN, **RUN).from_cache


def test_a_run_entry_without_a_digest_or_with_nan_weights_is_retrained(tmp_path):
    first = pe.train(tiny(), CHAIN, **RUN)
    (path,) = cached_runs(tmp_path)
    saved = torch.load(path, weights_only=True)
    del saved["digest"]   # edited, or as written by earlier versions: nothing to check the weights against
    torch.save(saved, path)
    with pytest.warns(RuntimeWarning, match="has no digest"):
        again = pe.train(tiny(), CHAIN, **RUN)
    assert not again.from_cache and again.losses == first.losses
    saved = torch.load(path, weights_only=True)   # the new entry, digest and all
    name = next(iter(saved["state_dict"]))
    saved["state_dict"][name] = torch.full_like(saved["state_dict"][name], math.nan)
    saved["digest"] = pe.train._run_digest(saved["state_dict"], saved["losses"], saved["grad_norms"])
    torch.save(saved, path)   # a consistent digest does not make NaN weights usable
    with pytest.warns(RuntimeWarning, match="NaN or infinite"):
        assert not pe.train(tiny(), CHAIN, **RUN).from_cache


# ------------------------------------------------------------------ the evaluation cache checks its digest and values


@pytest.fixture
def evals(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_EVAL_CACHE", "1")
    return tmp_path / "evals"


def test_an_evaluation_entry_with_a_changed_position_loss_is_measured_again(evals):
    model = tiny()
    first = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    (entry,) = evals.glob("*.pt")
    saved = torch.load(entry, weights_only=True)
    saved["result"][5][3] += 1.0
    torch.save(saved, entry)
    with pytest.warns(RuntimeWarning, match="does not match its digest"), forwards() as forward:
        again = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    assert forward.call_count > 0 and torch.equal(again[8].position_loss, first[8].position_loss)
    flip_a_byte_of_the_largest_tensor(entry)
    with pytest.warns(RuntimeWarning, match="does not match its digest"):
        pe.evaluate_lengths(model, CHAIN, [8], batches=1)


def test_a_passkey_grid_entry_with_a_changed_accuracy_is_measured_again(evals):
    model = tiny(TASK.vocab_size)
    first = pe.passkey_accuracy(model, TASK, [8], samples=2)
    (entry,) = evals.glob("*.pt")
    saved = torch.load(entry, weights_only=True)
    saved["result"][0, 0] = 1.0 - saved["result"][0, 0]
    torch.save(saved, entry)
    with pytest.warns(RuntimeWarning, match="does not match its digest"):
        assert torch.equal(pe.passkey_accuracy(model, TASK, [8], samples=2), first)


def test_an_evaluation_entry_without_a_digest_is_measured_again(evals):
    model = tiny()
    first = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    (entry,) = evals.glob("*.pt")
    saved = torch.load(entry, weights_only=True)
    del saved["digest"]   # nothing to check the result against
    torch.save(saved, entry)
    with pytest.warns(RuntimeWarning, match="has no digest"), forwards() as forward:
        again = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    assert forward.call_count > 0 and again[8].loss == first[8].loss


@pytest.mark.parametrize("change", [
    lambda r: r.__setitem__(1, math.nan),                                 # loss NaN
    lambda r: r.__setitem__(1, math.inf),                                 # loss infinite
    lambda r: r.__setitem__(1, -1.0),                                     # loss below 0
    lambda r: r.__setitem__(2, -5.0),                                     # ppl not exp(loss)
    lambda r: r.__setitem__(2, r[2] * 1.01),
    lambda r: r.__setitem__(5, torch.full_like(r[5], math.inf)),          # position loss infinite
    lambda r: r.__setitem__(5, r[5].long()),                              # position loss not floats
    lambda r: r.__setitem__(4, 0),                                        # no tokens
])
def test_a_stored_length_result_with_impossible_values_is_measured_again(evals, change):
    model = tiny()
    first = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    (entry,) = evals.glob("*.pt")
    saved = torch.load(entry, weights_only=True)
    change(saved["result"])
    saved["digest"] = _evalcache.digest(saved["result"])   # a consistent digest does not make wrong numbers right
    torch.save(saved, entry)
    with pytest.warns(RuntimeWarning, match="malformed"), forwards() as forward:
        again = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    assert forward.call_count > 0 and again[8].loss == first[8].loss


def test_a_stored_position_loss_may_be_nan_where_no_target_counted(evals):
    model = tiny()
    pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    (entry,) = evals.glob("*.pt")
    saved = torch.load(entry, weights_only=True)
    saved["result"][5][0] = math.nan
    saved["digest"] = _evalcache.digest(saved["result"])
    torch.save(saved, entry)
    with forwards() as forward:
        again = pe.evaluate_lengths(model, CHAIN, [8], batches=1)
    assert forward.call_count == 0 and math.isnan(again[8].position_loss[0])


def test_evaluate_lengths_refuses_a_zero_dimensional_tensor_of_lengths():
    with pytest.raises(ValueError, match="lengths must be a sequence of positive integers"):
        pe.evaluate_lengths(tiny(), CHAIN, torch.tensor(8), batches=1)
