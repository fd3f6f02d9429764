"""Training and evaluation runs seen from the user's side: interrupts, progress, what a run reports, the cost line."""

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import posenc as pe

LINUX = sys.platform.startswith("linux")


def _children(pid: int) -> dict:
    """``{child pid: its start time}`` for the processes whose parent is ``pid`` (from /proc)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[1]) == pid:
            found[int(stat.parent.name)] = rest[19]
    return found


def _alive(pid: int, start: str) -> bool:
    """The process ``pid`` that started at ``start`` still exists and is not a zombie."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return rest[19] == start and rest[0] != "Z"


def _wait_for(condition, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not LINUX, reason="forked workers: Linux only")
def test_an_interrupt_stops_the_workers_and_frees_their_run_locks(tmp_path):
    """Jupyter's "interrupt kernel" sends SIGINT to the kernel alone: the forked trainers must stop with it."""
    code = ("import posenc as pe\n"
            "task = pe.MarkovChain(vocab_size=4, order=1, seed=0)\n"
            "make = lambda: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position='rope')\n"
            "pe.train_seeds(make, task, [0, 1], workers=2, steps=10**7, seq_len=8, batch_size=2, progress=False)\n")
    env = dict(os.environ, POSENC_CACHE=str(tmp_path), POSENC_PROGRESS="0", OMP_NUM_THREADS="2")
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    workers: dict = {}
    try:
        runs = tmp_path / "runs"
        def training():
            workers.update(_children(parent.pid))
            return len(workers) >= 2 and len(list(runs.glob("*.lock"))) >= 2
        assert _wait_for(training, 240), "the workers did not start"
        locks = sorted(runs.glob("*.lock"))
        time.sleep(0.5)  # each worker is past taking its lock
        os.kill(parent.pid, signal.SIGINT)
        parent.wait(timeout=60)
        assert _wait_for(lambda: not any(_alive(p, s) for p, s in workers.items()), 30), "workers left training"
        for lock in locks:  # the run locks can be taken at once
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while held
            finally:
                os.close(fd)
    finally:
        for pid, start in workers.items():
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)


TASK = pe.MarkovChain(vocab_size=4, order=1, seed=0)
KW = dict(steps=6, seq_len=8, batch_size=2, warmup=2)


def _make():
    return pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position="rope")


@pytest.fixture
def shown(tmp_path, monkeypatch):
    """A fresh run cache, progress reported (as in a notebook)."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    monkeypatch.delenv("POSENC_PROGRESS", raising=False)
    monkeypatch.delenv("POSENC_STATIC", raising=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_false_draws_no_bar_and_prints_nothing(shown, capfd, workers):
    pe.train_seeds(_make, TASK, [0, 1], workers=workers, progress=False, **KW)
    out, err = capfd.readouterr()
    assert "run" not in out and "run" not in err and "it/s" not in err, (out, err)


@pytest.mark.parametrize("workers", [1, 2])
def test_runs_trained_in_this_call_are_reported_as_trained(shown, workers):
    runs = pe.train_seeds(_make, TASK, [0, 1], workers=workers, progress=False, **KW)
    assert [(r.from_cache, r.steps_run) for r in runs] == [(False, KW["steps"])] * 2
    again = pe.train_seeds(_make, TASK, [0, 1, 2], workers=workers, progress=False, **KW)
    assert [(r.from_cache, r.steps_run) for r in again] == [(True, 0)] * 2 + [(False, KW["steps"])]
    assert [r.losses for r in again[:2]] == [r.losses for r in runs]


def _counts(out: str):
    import re
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out  # one line, before the training
    found = re.fullmatch(r"(\d+) runs?: (\d+) from the cache, (\d+) to train(, about .+ on this device)?", lines[0])
    assert found, lines[0]
    return int(found[1]), int(found[2]), int(found[3]), found[4] is not None


@pytest.mark.parametrize("workers", [1, 2])
def test_train_seeds_says_how_many_runs_are_cached_and_to_train_and_draws_one_bar(shown, capfd, workers):
    makers = {"a": _make, "b": lambda: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position="alibi")}
    pe.train_seeds(makers, TASK, [0, 1], workers=workers, **KW)
    out, err = capfd.readouterr()
    assert _counts(out) == (4, 0, 4, True)
    assert "4 runs" in err and "rope" not in err and "alibi" not in err  # one bar over the set, none per model
    pe.train_seeds(makers, TASK, [0, 1, 2], workers=workers, **KW)
    assert _counts(capfd.readouterr().out) == (6, 4, 2, True)
    pe.train_seeds(makers, TASK, [1, 2], workers=workers, **KW)
    out, err = capfd.readouterr()
    assert _counts(out) == (4, 4, 0, False) and "it/s" not in err  # nothing to train: no time, no bar


def test_posenc_progress_zero_silences_the_line_and_the_bar(shown, capfd, monkeypatch):
    monkeypatch.setenv("POSENC_PROGRESS", "0")
    pe.train_seeds(_make, TASK, [0, 1], workers=1, **KW)
    out, err = capfd.readouterr()
    assert out == "" and "run" not in err and "it/s" not in err, (out, err)


def test_warmup_longer_than_the_run_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"warmup=50.*steps=5"):
        pe.train(_make(), TASK, steps=5, seq_len=8, batch_size=2, warmup=50, progress=False)
    with pytest.raises(ValueError, match=r"warmup=7.*steps=6"):  # refused before any run of the set trains
        pe.train_seeds(_make, TASK, [0, 1], workers=1, progress=False, **dict(KW, warmup=7))
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.pt"))
    # warmup == steps: the rate rises over the whole run and reaches lr at its last step
    result = pe.train(_make(), TASK, steps=5, seq_len=8, batch_size=2, warmup=5, progress=False)
    assert result.steps_run == 5 and len(result.losses) == 5


def test_default_warmup_fits_a_short_run_and_keeps_the_key_of_a_long_one(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    short = pe.train(_make(), TASK, steps=5, seq_len=8, batch_size=2, progress=False)
    assert short.config["train"]["warmup"] == 5
    assert pe.train(_make(), TASK, steps=5, seq_len=8, batch_size=2, warmup=5, progress=False).from_cache
    long = pe.train(_make(), TASK, steps=30, seq_len=8, batch_size=2, progress=False, cache=False)
    assert long.key == pe.train(_make(), TASK, steps=30, seq_len=8, batch_size=2, warmup=25, progress=False,
                                cache=False).key


def test_another_cpu_thread_count_is_another_run(tmp_path, monkeypatch):
    """Thread counts split the sums differently: a run on 2 threads is not served the run of 1 thread."""
    import torch
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    kw = dict(steps=3, seq_len=8, batch_size=2, progress=False, device="cpu")
    one = pe.train(_make(), TASK, cpu_threads=1, **kw)
    two = pe.train(_make(), TASK, cpu_threads=2, **kw)
    assert not two.from_cache and two.key != one.key
    assert pe.train(_make(), TASK, cpu_threads=2, **kw).from_cache
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert pe.train(_make(), TASK, cpu_threads=None, **kw).key == one.key  # None: the count in effect
        torch.set_num_threads(2)
        assert pe.train(_make(), TASK, cpu_threads=None, **kw).key == two.key
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not LINUX, reason="forked workers: Linux only")
def test_runs_on_the_threads_in_effect_train_with_the_numbers_their_key_says(tmp_path, monkeypatch):
    """cpu_threads=None keys a run by the threads in effect (2 here): a one-thread worker must not train it."""
    import torch
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    kw = dict(steps=10, seq_len=64, batch_size=16, progress=False, device="cpu", cpu_threads=None)
    make = lambda: pe.TinyLM(4, d_model=64, n_layers=2, n_heads=4, position="alibi")  # noqa: E731 (sums split)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        runs = pe.train_seeds(make, TASK, [0, 1], workers=2, **kw)
        for seed, run in zip([0, 1], runs):
            again = pe.train(make(), TASK, seed=seed, cache=False, **kw)
            assert run.key == again.key and run.config["train"]["cpu_threads"] == 2
            assert run.losses == again.losses
    finally:
        torch.set_num_threads(before)


SCHEME = '''
import torch
import posenc as pe

RATE = {rate}


class Decay(pe.PositionScheme):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def distance_bias(self, length, *, device, dtype):
        return -RATE * self.scale * torch.arange(length, device=device, dtype=dtype).expand(self.n_heads, length)
'''


def _scheme_module(folder, name, rate=0.5):
    """A user's scheme class, in a module of its own (as a notebook's class moved into a file, or a copy)."""
    import importlib.util
    path = folder / f"{name}.py"
    path.write_text(SCHEME.format(rate=rate))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_scheme_class_imported_from_another_module_is_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    kw = dict(steps=4, seq_len=8, batch_size=2, progress=False)
    here, moved, changed = (_scheme_module(tmp_path, name, rate) for name, rate in
                            [("notebook_cell", 0.5), ("task2", 0.5), ("task3", 0.25)])
    first = pe.train(pe.TinyLM(4, 16, 1, 2, position=here.Decay()), TASK, **kw)
    again = pe.train(pe.TinyLM(4, 16, 1, 2, position=moved.Decay()), TASK, **kw)
    assert again.from_cache and again.key == first.key and again.losses == first.losses
    assert again.config["model"]["position"]["scheme"] == "task2.Decay"  # the result names the class it was given
    other = pe.train(pe.TinyLM(4, 16, 1, 2, position=changed.Decay()), TASK, **kw)  # same name, other code
    assert not other.from_cache and other.key != first.key
    tuned = pe.train(pe.TinyLM(4, 16, 1, 2, position=moved.Decay()), TASK, init=first, **dict(kw, warmup=0))
    assert tuned.config["init"] == first.key  # a fine-tune across the move is the same architecture
