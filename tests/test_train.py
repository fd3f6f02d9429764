"""Tests for posenc.train: training, the run cache, evaluation at several lengths, presets."""

import importlib
import math
import os

import pytest
import torch

import posenc as pe

# ``pe.train`` is the module, callable as the function
T = importlib.import_module("posenc.train")
from posenc.data import FirstTokenRetrieval, MarkovChain
from posenc.model import TinyLM

CHAIN = MarkovChain(vocab_size=6, order=1, alpha=0.2, seed=0)
FAST = dict(steps=12, seq_len=16, batch_size=4, lr=3e-3, warmup=2, progress=False, device="cpu")


def small_model(position="rope", **kw) -> TinyLM:
    if position == "learned":
        kw.setdefault("max_len", 64)
    kw = dict(dict(d_model=16, n_layers=1, n_heads=2), **kw)
    return TinyLM(CHAIN.vocab_size, position=position, **kw)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))


def test_train_reduces_loss():
    result = T.train(small_model(), CHAIN, **dict(FAST, steps=60, lr=1e-2), cache=False)
    assert len(result.losses) == 60 and result.steps_run == 60 and not result.from_cache
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.2
    assert not result.model.training


def test_second_call_loads_from_cache(tmp_path):
    first = T.train(small_model(), CHAIN, **FAST)
    assert not first.from_cache and first.steps_run == FAST["steps"]
    assert (tmp_path / "runs" / f"{first.key}.pt").exists()
    again = T.train(small_model(), CHAIN, **FAST)
    assert again.from_cache and again.steps_run == 0 and again.key == first.key
    assert again.losses == first.losses
    for name, value in first.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[name]), name
    other_seed = T.train(small_model(), CHAIN, **dict(FAST, seed=1))
    assert not other_seed.from_cache and other_seed.key != first.key
    no_cache = T.train(small_model(), CHAIN, **FAST, cache=False)
    assert not no_cache.from_cache and no_cache.steps_run == FAST["steps"]


def test_training_is_deterministic_and_ignores_current_weights():
    a = T.train(small_model(), CHAIN, **FAST, cache=False)
    model = small_model()
    with torch.no_grad():
        model.tok.weight.add_(5.0)  # train() starts from a fresh initialisation drawn from the seed
    b = T.train(model, CHAIN, **FAST, cache=False)
    assert a.losses == b.losses


def test_cache_key_covers_model_data_and_training():
    key = T.train(small_model(), CHAIN, **FAST).key
    assert T.train(small_model("alibi"), CHAIN, **FAST).key != key
    assert T.train(small_model(), MarkovChain(vocab_size=6, order=1, alpha=0.2, seed=1), **FAST).key != key
    assert T.train(small_model(), CHAIN, **dict(FAST, lr=1e-3)).key != key
    # evaluation-time settings that do not act at the training length do not change the key
    assert T.train(small_model(window=FAST["seq_len"]), CHAIN, **FAST).key == key
    assert T.train(small_model(window=4), CHAIN, **FAST).key != key


def test_train_sets_train_len():
    model = small_model()
    assert model.train_len is None
    T.train(model, CHAIN, **FAST)
    assert model.train_len == FAST["seq_len"]


def test_evaluate_lengths():
    model = T.train(small_model(), CHAIN, **FAST).model
    lengths = [16, 32, 48, 128]
    out = T.evaluate_lengths(model, CHAIN, lengths, batches=2, batch_size=3)
    assert list(out) == lengths
    for n, r in out.items():
        assert r.length == n and r.tokens == 2 * 3 * n
        assert math.isclose(r.ppl, math.exp(r.loss), rel_tol=1e-9)
        assert 0.0 <= r.accuracy <= 1.0
        assert r.position_loss.shape == (n,)
        assert math.isclose(r.position_loss.mean().item(), r.loss, rel_tol=1e-6)
    again = T.evaluate_lengths(model, CHAIN, lengths, batches=2, batch_size=3)
    assert all(again[n].loss == out[n].loss for n in lengths)  # fixed evaluation batches
    split = T.evaluate_lengths(model, CHAIN, [128], batches=2, batch_size=3, max_tokens=100)
    assert math.isclose(split[128].loss, out[128].loss, rel_tol=1e-5)  # chunking changes nothing


def test_evaluate_counts_only_marked_targets():
    task = FirstTokenRetrieval(n_keys=4, n_filler=6, mark_prob=0.0)  # one marker: the last token
    model = TinyLM(task.vocab_size, d_model=16, n_layers=1, n_heads=2)
    out = T.evaluate_lengths(model, task, [10, 20], batches=2, batch_size=4)
    assert out[10].tokens == out[20].tokens == 8
    assert torch.isnan(out[20].position_loss[:-1]).all() and not torch.isnan(out[20].position_loss[-1])


def test_learned_model_cannot_be_evaluated_beyond_its_table():
    model = small_model("learned", max_len=32)
    with pytest.raises(ValueError, match="max_len"):
        T.evaluate_lengths(model, CHAIN, [16, 64], batches=1, batch_size=1)


def test_bad_arguments():
    with pytest.raises(ValueError):  # vocabulary mismatch
        T.train(TinyLM(7, d_model=16, n_heads=2), CHAIN, **FAST)
    with pytest.raises(ValueError):
        T.train(small_model(), CHAIN, **dict(FAST, steps=0))
    with pytest.raises(ValueError):
        T.train(small_model(), CHAIN, **dict(FAST, lr=-1.0))
    with pytest.raises(ValueError):
        T.train(small_model("learned", max_len=8), CHAIN, **FAST)  # seq_len beyond the table
    with pytest.raises(ValueError):
        T.train(torch.nn.Linear(2, 2), CHAIN, **FAST)
    with pytest.raises(ValueError):
        T.train(small_model(), object(), **FAST)
    with pytest.raises(ValueError):
        T.evaluate_lengths(small_model(), CHAIN, [])
    with pytest.raises(ValueError):
        T.evaluate_lengths(small_model(), CHAIN, [0, 16])


def test_presets(monkeypatch):
    small, full = pe.training_preset("small"), pe.training_preset("full")
    assert small.mode == "small" and full.mode == "full"
    assert full.d_model > small.d_model and full.steps > small.steps and full.seq_len > small.seq_len
    monkeypatch.setenv("POSENC_SIZE", "full")
    assert pe.training_preset() == full
    monkeypatch.setenv("POSENC_SIZE", "small")
    assert pe.training_preset(steps=7).steps == 7
    for preset in (small, full, pe.training_preset("small", steps=1)):
        retrieval, base = preset.retrieval_kwargs(), preset.train_kwargs()
        assert retrieval["batch_size"] == 2 * base["batch_size"] and 1 <= retrieval["steps"] <= base["steps"]
        assert abs(retrieval["steps"] - 2 * base["steps"] / 3) <= 0.5                      # two thirds, rounded
        assert {k: v for k, v in retrieval.items() if k not in ("batch_size", "steps")} == \
            {k: v for k, v in base.items() if k not in ("batch_size", "steps")}
    model = small.make_model(10, "learned")
    assert model.max_len == 8 * small.seq_len and model.train_len == small.seq_len
    assert small.make_model(10, "rope").d_model == small.d_model
    with pytest.raises(ValueError):
        pe.training_preset("huge")
    with pytest.raises(ValueError):
        pe.training_preset(colour="red")


def test_exported():
    assert pe.train is T and callable(pe.train) and pe.evaluate_lengths is T.evaluate_lengths


def test_evaluation_batches_are_the_evaluated_ones():
    model = small_model()
    out = T.evaluate_lengths(model, CHAIN, [24], batches=2, batch_size=3, seed=7)
    total = 0.0
    for x, y in T.evaluation_batches(CHAIN, 24, 2, 7, batch_size=3):
        with torch.no_grad():
            total += torch.nn.functional.cross_entropy(model(x).transpose(1, 2), y, reduction="sum").item()
    assert math.isclose(total / (2 * 3 * 24), out[24].loss, rel_tol=1e-5)


def test_return_attention():
    model = small_model("alibi", n_layers=2, window=5)
    x = torch.randint(CHAIN.vocab_size, (2, 12))
    logits, weights = model(x, return_attention=True)
    assert torch.allclose(logits, model(x), atol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (2, 2, 12, 12)
    assert torch.allclose(weights[0].sum(-1), torch.ones(2, 2, 12), atol=1e-5)
    assert weights[1][..., 6:, :2].abs().max() == 0  # outside the window of 5


def test_gradient_norms_are_recorded_before_clipping_and_cached():
    clipped = T.train(small_model(), CHAIN, **dict(FAST, lr=1e-2), grad_clip=1e-3)
    assert len(clipped.grad_norms) == FAST["steps"]
    assert min(clipped.grad_norms) > 1e-3  # the recorded norm is the one before clipping
    free = T.train(small_model(), CHAIN, **dict(FAST, lr=1e-2), grad_clip=None)
    assert free.key != clipped.key and free.config["train"]["grad_clip"] is None
    assert free.grad_norms[0] == pytest.approx(clipped.grad_norms[0])  # same first step, before any update
    assert free.losses[-1] != clipped.losses[-1]  # clipping at 1e-3 changes the training
    again = T.train(small_model(), CHAIN, **dict(FAST, lr=1e-2), grad_clip=None)
    assert again.from_cache and again.grad_norms == free.grad_norms


def test_gradient_norm_is_the_global_norm():
    """One step with lr ~ 0: the recorded norm equals the norm of the gradients of the first batch's loss."""
    result = T.train(small_model(), CHAIN, **dict(FAST, steps=1, warmup=0, lr=1e-12), cache=False)
    model = small_model()
    model.reset_parameters(generator=torch.Generator().manual_seed(0))
    x, y = CHAIN.batch(FAST["batch_size"], FAST["seq_len"], torch.Generator().manual_seed(1))
    model.loss(x, y).backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()
    assert result.grad_norms[0] == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), "1"])
def test_bad_grad_clip(bad):
    with pytest.raises(ValueError, match="grad_clip"):
        T.train(small_model(), CHAIN, **FAST, grad_clip=bad)


def test_linear_attention_model_trains_and_loads_from_cache():
    """TransNormer's layout through the one trainer: cached like every other model."""
    task = pe.LaggedCopy(vocab_size=6, lag=2, p_copy=0.9)
    make = lambda: TinyLM(6, d_model=16, n_layers=2, n_heads=2, position="learned", max_len=32,
                          attention=["diag", "norm"], ffn="glu", diag_block=8)
    first = T.train(make(), task, **dict(FAST, steps=40, lr=1e-2))
    assert sum(first.losses[-5:]) / 5 < sum(first.losses[:5]) / 5 - 0.2
    assert first.config["model"]["attention"] == ["diag", "norm"]
    again = T.train(make(), task, **dict(FAST, steps=40, lr=1e-2))
    assert again.from_cache and again.losses == first.losses
    other = T.train(TinyLM(6, d_model=16, n_layers=2, n_heads=2, position="learned", max_len=32,
                           attention=["norm", "norm"], ffn="glu", diag_block=8), task, **dict(FAST, steps=40, lr=1e-2))
    assert other.key != first.key


class _Decay(pe.PositionScheme):
    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def distance_bias(self, length, *, device, dtype):
        return -self.rate * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)


def test_user_scheme_trains_and_its_settings_enter_the_cache_key():
    first = T.train(small_model(_Decay(0.5)), CHAIN, **FAST)
    again = T.train(small_model(_Decay(0.5)), CHAIN, **FAST)
    other = T.train(small_model(_Decay(0.25)), CHAIN, **FAST)
    assert again.from_cache and again.key == first.key
    assert not other.from_cache and other.key != first.key
    assert first.config["model"]["position"]["rate"] == 0.5


# ---------------------------------------------------------------------------
# The run cache never loses or blocks work
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbled", "other_run", "folder"])
def test_unusable_cache_entry_is_reported_retrained_and_replaced(tmp_path, damage):
    first = T.train(small_model(), CHAIN, **FAST)
    path = tmp_path / "runs" / f"{first.key}.pt"
    blob = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbled":
        path.write_bytes(bytes(reversed(blob)))
    elif damage == "other_run":  # a valid file of another configuration under this key
        other = T.train(small_model(), CHAIN, **dict(FAST, seed=3))
        path.write_bytes((tmp_path / "runs" / f"{other.key}.pt").read_bytes())
    else:
        path.unlink()
        path.mkdir()
    with pytest.warns(RuntimeWarning, match=str(path.name)):
        again = T.train(small_model(), CHAIN, **FAST)
    assert not again.from_cache and again.losses == first.losses  # retrained, same numbers
    if damage != "folder":
        third = T.train(small_model(), CHAIN, **FAST)  # the entry was replaced: loads, no warning
        assert third.from_cache and third.losses == first.losses


def test_unwritable_cache_keeps_the_trained_model(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("POSENC_CACHE", str(blocker / "cache"))  # cannot be created
    with pytest.warns(RuntimeWarning, match="could not write the run cache"):
        result = T.train(small_model(), CHAIN, **FAST)
    assert result.steps_run == FAST["steps"] and not result.model.training
    assert not list(tmp_path.rglob("*.tmp*"))


def test_no_home_directory_trains_without_cache(monkeypatch):
    from pathlib import Path

    monkeypatch.delenv("POSENC_CACHE", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    with pytest.warns(RuntimeWarning, match="no run cache"):
        result = T.train(small_model(), CHAIN, **FAST)
    assert result.steps_run == FAST["steps"]


def test_stray_temporary_files_of_dead_writers_are_removed(tmp_path):
    first = T.train(small_model(), CHAIN, **FAST)
    runs = tmp_path / "runs"
    dead = runs / f"{first.key}.pt.tmp999999999.deadbeef"   # no such process
    dead.write_bytes(b"half a file")
    T.train(small_model(), CHAIN, **FAST)
    assert not dead.exists()
    assert sorted(p.name for p in runs.iterdir()) == [f"{first.key}.pt"]


def test_cached_hybrid_loads_whatever_the_hash_seed(tmp_path):
    """The config of a model with several attention kinds is saved and compared independently of key order."""
    import subprocess
    import sys

    code = ("import posenc as pe; t = pe.LaggedCopy(6); m = pe.TinyLM(6, 16, 2, 2, 'learned', max_len=32, "
            "attention=['diag', 'norm'], diag_block=8); r = pe.train(m, t, steps=3, seq_len=16, batch_size=2, "
            "progress=False, device='cpu'); print(r.from_cache)")
    env = dict(os.environ, POSENC_CACHE=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=dict(env, PYTHONHASHSEED=seed),
                           capture_output=True, text=True, timeout=120) for seed in ("1", "2", "3")]
    assert [r.stdout.strip() for r in runs] == ["False", "True", "True"], [r.stderr[-500:] for r in runs]


def test_training_is_the_same_whatever_the_thread_count():
    """On the CPU, training runs on one thread: the same weights with 1 or 2 threads set outside."""
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            preset = pe.training_preset("small", steps=30)  # the book's size: its sums are split across threads
            results.append(T.train(preset.make_model(CHAIN.vocab_size, "alibi"), CHAIN, **preset.train_kwargs(),
                                   cache=False, progress=False))
            assert torch.get_num_threads() == threads  # restored
    finally:
        torch.set_num_threads(before)
    assert results[0].losses == results[1].losses
    for name, value in results[0].model.state_dict().items():
        assert torch.equal(value, results[1].model.state_dict()[name]), name
    with pytest.raises(ValueError, match="cpu_threads"):
        T.train(small_model(), CHAIN, **FAST, cpu_threads=0)


@pytest.mark.parametrize("value, shown", [("", True), ("1", True), ("0", False), ("off", False), ("False", False)])
def test_posenc_progress_zero_turns_the_bar_off(monkeypatch, value, shown):
    monkeypatch.delenv("POSENC_STATIC", raising=False)
    monkeypatch.setenv("POSENC_PROGRESS", value)
    with T._progress_bar(5, "rope", True) as bar:
        assert bar.disable is not shown
    with T._progress_bar(5, "rope", False) as bar:  # progress=False wins whatever the variable says
        assert bar.disable


def test_a_saved_notebook_shows_the_progress_bar_in_its_final_state(tmp_path):
    """Run headless (as nbconvert or a CI job would), a notebook keeps the bar's last state, not '0%| | 0/30'."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    code = ("import posenc as pe\n"
            "task = pe.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0)\n"
            "model = pe.TinyLM(task.vocab_size, 16, 1, 2, position='rope')\n"
            "result = pe.train(model, task, steps=30, seq_len=16, batch_size=4, cache=False)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    env = {k: v for k, v in os.environ.items() if k not in ("POSENC_STATIC", "POSENC_PROGRESS")}
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    texts = [o["data"]["text/plain"] for o in nb.cells[0].outputs if o["output_type"] == "display_data"]
    assert len(texts) == 1 and "30/30" in texts[0] and "100%" in texts[0], texts
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in nb.cells[0].outputs)


def test_optimiser_is_fused_adamw_where_torch_has_it_and_the_plain_loop_elsewhere(monkeypatch):
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    opt = T._adamw([dict(params=params[:1], weight_decay=0.1), dict(params=params[1:], weight_decay=0.0)], 1e-3)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.95)
    real = torch.optim.AdamW

    def no_fused_kernel(*args, fused=None, **kwargs):    # as torch < 2.4 answers on a CPU
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused_kernel)
    fallback = T._adamw([dict(params=params)], 1e-3)
    assert isinstance(fallback, real) and not fallback.defaults.get("fused")
    a = T.train(small_model(), CHAIN, **FAST, cache=False)           # trains with the plain loop ...
    monkeypatch.setattr(torch.optim, "AdamW", real)
    b = T.train(small_model(), CHAIN, **FAST, cache=False)           # ... and with the fused step: the same arithmetic
    assert a.losses == pytest.approx(b.losses, abs=1e-5)


def test_processes_training_the_same_run_side_by_side_train_it_once(tmp_path):
    """Two notebooks executed at once share the run cache: one process trains, the other waits and loads."""
    import subprocess
    import sys

    code = ("import posenc as pe, sys; t = pe.LaggedCopy(6); m = pe.TinyLM(6, 16, 1, 2, 'rope'); "
            "r = pe.train(m, t, steps=150, seq_len=32, batch_size=4, progress=False, device='cpu'); "
            "print(r.from_cache, r.steps_run, r.key)")
    env = dict(os.environ, POSENC_CACHE=str(tmp_path), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    lines = sorted(out.split() for out, _ in outs)
    assert [line[:2] for line in lines] == [["False", "150"], ["True", "0"], ["True", "0"]], lines
    assert len({line[2] for line in lines}) == 1
    # nothing but the entry is left: no lock file, no temporary
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [f"{lines[0][2]}.pt"]


def test_run_lock_is_held_by_one_holder_at_a_time_and_removed(tmp_path):
    import threading
    import time

    from posenc.runtime import _exclusive

    lock = tmp_path / "sub" / "k.lock"
    inside, overlaps = [], []

    def work():
        for _ in range(20):
            with _exclusive(lock):
                inside.append(1)
                time.sleep(0.002)  # another holder would join here
                if len(inside) > 1:
                    overlaps.append(len(inside))
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not overlaps and not lock.exists()
    with pytest.raises(KeyError):  # the lock is released and its file removed when the block raises
        with _exclusive(lock):
            raise KeyError("x")
    assert not lock.exists()
    with _exclusive(lock):  # and taken again at once
        assert lock.exists()


def test_run_lock_without_waiting_raises_while_held_and_takes_it_when_free(tmp_path):
    import threading

    from posenc.runtime import _exclusive, _RunBusy

    lock, held, release = tmp_path / "k.lock", threading.Event(), threading.Event()

    def holder():
        with _exclusive(lock):
            held.set()
            release.wait(timeout=60)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(timeout=60)
    try:
        with pytest.raises(_RunBusy):
            with _exclusive(lock, wait=False):
                pass
        assert lock.exists()  # the holder's file stays
    finally:
        release.set()
        t.join(timeout=60)
    with _exclusive(lock, wait=False):  # free now: taken at once
        assert lock.exists()
    assert not lock.exists()


def test_run_lock_in_a_read_only_folder_runs_unlocked(tmp_path):
    from posenc.runtime import _exclusive

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ran = []
    with _exclusive(blocker / "k.lock"):  # its folder cannot be created
        ran.append(1)
    assert ran == [1]
