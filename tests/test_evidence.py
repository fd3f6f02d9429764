"""Seeds, spreads and glued numbers (posenc.evidence)."""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import posenc as pe


def test_seeds_default_and_offset(monkeypatch):
    monkeypatch.delenv("POSENC_SEED", raising=False)
    assert pe.seed_offset() == 0 and pe.seeds() == [0, 1, 2] and pe.evaluation_seed() == 1234
    monkeypatch.setenv("POSENC_SEED", "1")
    assert pe.seeds() == [3, 4, 5] and pe.seeds(2) == [2, 3] and pe.evaluation_seed() == 1235
    monkeypatch.setenv("POSENC_SEED", " 2 ")
    assert pe.seeds(3) == [6, 7, 8]


@pytest.mark.parametrize("value", ["-1", "one", "1.5", "0x1"])
def test_bad_seed_variable(monkeypatch, value):
    monkeypatch.setenv("POSENC_SEED", value)
    with pytest.raises(ValueError, match="POSENC_SEED"):
        pe.seeds()


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "3"])
def test_bad_seed_count(count):
    with pytest.raises(ValueError, match="count"):
        pe.seeds(count)


@given(st.integers(0, 50), st.integers(1, 6))
def test_seed_blocks_never_overlap(block, count):
    import os
    old = os.environ.get("POSENC_SEED")
    try:
        os.environ["POSENC_SEED"] = str(block)
        a = set(pe.seeds(count))
        os.environ["POSENC_SEED"] = str(block + 1)
        assert not a & set(pe.seeds(count)) and len(a) == count
    finally:
        os.environ.pop("POSENC_SEED") if old is None else os.environ.__setitem__("POSENC_SEED", old)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=8))
def test_spread_is_mean_min_max(values):
    s = pe.spread(values)
    assert s.low == min(values) and s.high == max(values)
    assert s.low - 1e-9 * (1 + abs(s.low)) <= s.mean <= s.high + 1e-9 * (1 + abs(s.high))
    assert math.isclose(s.mean, math.fsum(values) / len(values), rel_tol=1e-12, abs_tol=1e-9)
    assert s.width == s.high - s.low >= 0


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=5), st.lists(st.floats(-10, 10), min_size=1, max_size=5))
def test_spread_versus_names_an_ordering_only_where_the_ranges_separate(a, b):
    x, y = pe.spread(a), pe.spread(b)
    word = x.versus(y)
    same = len(set(a) | set(b)) == 1                                   # one value on every seed of both
    assert word == ("below" if max(a) < min(b) else "above" if min(a) > max(b) else "equal to" if same
                    else "within seed noise of")
    assert y.versus(x) == {"below": "above", "above": "below"}.get(word, word)                     # antisymmetric
    assert x.versus(y, "lower", "higher", "tied", "same") == {"below": "lower", "above": "higher",
                                                              "equal to": "same"}.get(word, "tied")


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=4), st.sampled_from([0.0, 0.5, 1.0]))
def test_spread_versus_says_equal_only_for_one_value_on_every_seed(a, b):
    word = pe.spread(a).versus(b)                                      # against a plain number, too
    assert (word == "equal to") == (set(a) == {b})
    assert pe.spread(a).versus(pe.spread([b, b])) == word


def test_spread_of_nested_results_and_tensors():
    per_seed = [{"rope": {64: 0.1, 128: torch.tensor(0.5)}, "acc": torch.tensor([1.0, 0.5])},
                {"rope": {64: 0.3, 128: np.float64(0.7)}, "acc": torch.tensor([0.0, 0.5])}]
    s = pe.spread(per_seed)
    assert s["rope"][64].values == (0.1, 0.3) and math.isclose(s["rope"][128].mean, 0.6)
    assert [x.values for x in s["acc"]] == [(1.0, 0.0), (0.5, 0.5)]


def test_spread_format():
    s = pe.Spread((0.08, 0.071, 0.093))
    assert format(s, ".3f") == "0.081 (0.071–0.093)" and str(s) == "0.081 (0.071–0.093)"
    assert format(pe.Spread((2.0,)), ".1f") == "2.0" and float(s) == s.mean


@pytest.mark.parametrize("bad", [[], [{"a": 1.0}, {"b": 1.0}], [[1.0], [1.0, 2.0]], ["x", "y"], [None],
                                 [True, False], [torch.zeros(2), torch.zeros(3)], "abc"])
def test_spread_refuses_mismatched_results(bad):
    with pytest.raises(ValueError):
        pe.spread(bad)


def test_separated_and_ordering():
    a, b = pe.Spread((0.1, 0.2)), pe.Spread((0.25, 0.3))
    assert pe.separated(a, b) and pe.separated(b, a) and a.below(b) and b.above(a)
    assert not pe.separated(a, b, margin=0.1) and not a.below(b, margin=0.05)
    c = pe.Spread((0.15, 0.26))
    assert not pe.separated(a, c) and not pe.separated(c, b) and not c.below(b)
    assert a.below(0.21) and not a.below(0.2) and pe.separated(0.5, a)


def test_a_spread_with_a_nan_shows_it_and_refuses_comparisons():
    for values in [(0.1, float("nan"), 0.2), (float("nan"), 0.1, 0.2)]:  # min() alone would depend on the order
        s = pe.Spread(values)
        assert math.isnan(s.low) and math.isnan(s.high) and math.isnan(s.mean) and format(s, ".1f") == "nan (nan–nan)"
        for compare in (lambda: pe.separated(s, 0.5), lambda: pe.separated(0.5, s), lambda: s.below(0.5),
                        lambda: s.above(0.0), lambda: s.versus(1.0), lambda: pe.Spread((0.1, 0.2)).below(s)):
            with pytest.raises(ValueError, match="NaN"):
                compare()


@pytest.mark.parametrize("bad", [dict(b="5"), dict(b=True), dict(margin=None), dict(margin=-0.1),
                                 dict(margin=float("inf")), dict(margin=True), dict(margin=torch.tensor([0.1, 0.2]))])
def test_separated_refuses_what_is_not_a_number(bad):
    kw = dict(a=pe.Spread((0.1, 0.2)), b=1.0, margin=0.0)
    kw.update(bad)
    with pytest.raises(ValueError):
        pe.separated(kw["a"], kw["b"], kw["margin"])


@pytest.mark.parametrize("margin", [0.65, np.float32(0.65), torch.tensor(0.65), torch.tensor([0.65], dtype=torch.float64)])
def test_a_margin_may_be_any_real_scalar(margin):
    a, b = pe.Spread((0.1, 0.2)), pe.Spread((0.8, 0.9))
    assert pe.separated(a, b, margin=0.55) and not pe.separated(a, b, margin=margin)
    assert a.below(b, margin=0.55) and not a.below(b, margin=margin)


@pytest.mark.parametrize("bad", [3, "012", 2.5, torch.tensor(3)])
def test_per_seed_refuses_a_seed_list_that_is_not_a_list(bad):
    with pytest.raises(ValueError, match="seed"):
        pe.per_seed(lambda seed: seed, bad)


def test_a_repeated_seed_is_refused_everywhere_seeds_are_listed():
    """[0, 0, 0] is one run three times: its zero-width spread would pass for three seeds that agree."""
    for call in (lambda: pe.per_seed(lambda seed: seed, [0, 0, 1]), lambda: pe.over_seeds(lambda seed: seed, [4, 4]),
                 lambda: pe.train_seeds(lambda: pe.TinyLM(8, 16, 1, 2), pe.MarkovChain(vocab_size=8), [3, 1, 3], steps=1)):
        with pytest.raises(ValueError, match=r"must not repeat a seed, got .* \(.*more than once\)"):
            call()


def test_over_seeds_calls_every_seed(monkeypatch):
    monkeypatch.delenv("POSENC_SEED", raising=False)
    seen = []
    s = pe.over_seeds(lambda seed: seen.append(seed) or {"x": float(seed)}, workers=1)  # here: seen is filled
    assert seen == [0, 1, 2] and s["x"].values == (0.0, 1.0, 2.0)
    assert pe.over_seeds(lambda seed: {"x": float(seed)})["x"].values == (0.0, 1.0, 2.0)  # in forked copies
    assert pe.over_seeds(lambda seed: seed * 2.0, [5, 7]).values == (10.0, 14.0)
    with pytest.raises(ValueError):
        pe.over_seeds(lambda s: 1.0, [])


def test_train_seeds_trains_a_run_another_process_holds_last(tmp_path, monkeypatch):
    # Two notebooks side by side: a run whose lock another holder has is not waited for while other runs of the
    # same call are free; they are trained first, then the call waits for the busy run (here: trains it after
    # the holder lets go without writing it), and the results keep their order.
    import threading
    import time

    from posenc.runtime import _exclusive

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    task = pe.MarkovChain(vocab_size=4, order=1, seed=0)
    makers = {name: (lambda s=s: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position=s))
              for name, s in [("busy", "rope"), ("free", "alibi")]}
    kw = dict(steps=3, seq_len=8, batch_size=2, progress=False)
    keys = {name: pe.train(make(), task, seed=0, cache=False, **kw).key for name, make in makers.items()}
    runs_dir = tmp_path / "runs"
    held, release, result = threading.Event(), threading.Event(), {}

    def holder():
        with _exclusive(runs_dir / f"{keys['busy']}.lock"):
            held.set()
            release.wait(timeout=120)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert held.wait(timeout=60)
    threads.append(threading.Thread(target=lambda: result.update(pe.train_seeds(makers, task, [0], workers=1, **kw))))
    threads[1].start()
    deadline = time.monotonic() + 120
    while not (runs_dir / f"{keys['free']}.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    free_first = (runs_dir / f"{keys['free']}.pt").exists() and not (runs_dir / f"{keys['busy']}.pt").exists()
    release.set()
    for t in threads:
        t.join(timeout=120)
    assert free_first and list(result) == ["busy", "free"]
    assert [result[name][0].key for name in result] == [keys["busy"], keys["free"]]
    assert not any(r[0].from_cache for r in result.values())       # each trained here, once
    assert pe.train(makers["busy"](), task, seed=0, **kw).from_cache


def test_train_seeds_trains_one_model_per_seed_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "serial"))
    task = pe.MarkovChain(vocab_size=4, order=1, seed=0)
    make = lambda: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position="rope")  # noqa: E731
    kw = dict(steps=3, seq_len=8, batch_size=2, progress=False)
    runs = pe.train_seeds(make, task, [0, 1], workers=1, **kw)
    assert [r.config["train"]["seed"] for r in runs] == [0, 1] and runs[0].model is not runs[1].model
    assert runs[0].losses != runs[1].losses and not any(r.from_cache for r in runs)
    again = pe.train_seeds(make, task, [0, 1], **kw)
    assert all(r.from_cache for r in again) and [r.losses for r in again] == [r.losses for r in runs]
    one = pe.train(make(), task, seed=1, **kw)
    assert one.from_cache and one.losses == runs[1].losses
    same = pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position="rope")
    with pytest.raises(ValueError, match="new model"):
        pe.train_seeds(lambda: same, task, [0, 1], **kw)
    with pytest.raises(ValueError, match="seed_list"):
        pe.train_seeds(make, task, [0], seed=3, **kw)
    with pytest.raises(ValueError, match="every seed"):
        pe.train_seeds(make, task, [-1], **kw)
    with pytest.raises(ValueError, match="make_model"):
        pe.train_seeds(same, task, [0], **kw)
    with pytest.raises(ValueError, match="init"):
        pe.train_seeds(make, task, [0, 1], init=runs[:1], **kw)
    with pytest.raises(ValueError, match="workers"):
        pe.train_seeds(make, task, [0, 1], workers=0, **kw)


def test_workers_give_the_runs_of_training_one_after_the_other(tmp_path, monkeypatch):
    """Forked workers fill the cache; the parent loads exactly what training here gives (configs x seeds, init)."""
    task = pe.MarkovChain(vocab_size=4, order=1, seed=0)
    makers = {s: (lambda s=s: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position=s)) for s in ["rope", "alibi"]}
    kw = dict(steps=4, seq_len=8, batch_size=2, progress=False)
    results = {}
    for workers in (1, 2):
        monkeypatch.setenv("POSENC_CACHE", str(tmp_path / str(workers)))
        runs = pe.train_seeds(makers, task, [0, 1, 2], workers=workers, **kw)
        tuned = pe.train_seeds(makers["rope"], task, [0, 1, 2], init=runs["rope"], workers=workers,
                               **dict(kw, steps=2, seq_len=16))
        results[workers] = ({k: [r.losses for r in v] for k, v in runs.items()}, [r.losses for r in tuned],
                            [r.model.state_dict()["tok.weight"] for r in tuned])
        if workers == 2 and __import__("sys").platform.startswith("linux"):  # trained by the workers, loaded here:
            assert not any(r.from_cache for v in runs.values() for r in v)  # reported as trained in this call
            assert all(r.steps_run == kw["steps"] for v in runs.values() for r in v)
    assert results[1][0] == results[2][0] and results[1][1] == results[2][1]
    assert all(torch.equal(a, b) for a, b in zip(results[1][2], results[2][2]))
    assert list(results[1][0]) == ["rope", "alibi"] and results[1][0]["rope"][0] != results[1][0]["rope"][1]


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="forked workers: Linux only")
def test_workers_are_forked_after_the_optimizers_imports(tmp_path):
    """The parent imports torch._dynamo (what the first optimizer imports, about a second) before forking, once,
    instead of every forked trainer importing it again."""
    import subprocess
    import sys
    code = ("import sys, posenc as pe\n"
            "assert 'torch._dynamo' not in sys.modules\n"
            "task = pe.MarkovChain(vocab_size=4, order=1, seed=0)\n"
            "make = lambda: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position='rope')\n"
            "runs = pe.train_seeds(make, task, [0, 1], workers=2, steps=2, seq_len=8, batch_size=2, progress=False)\n"
            "assert not any(r.from_cache for r in runs) and 'torch._dynamo' in sys.modules\n")
    env = dict(__import__("os").environ, POSENC_CACHE=str(tmp_path), POSENC_PROGRESS="0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_glue_returns_the_text_outside_a_kernel():
    assert pe.glue("x", pe.Spread((1.0, 3.0)), ".1f") == "2.0 (1.0–3.0)"
    assert pe.glue("y", 0.12345, ".2f") == "0.12" and pe.glue("z", np.float32(2.5), ".1f") == "2.5"
    assert pe.glue("w", "as is") == "as is" and pe.glue("t", torch.tensor(0.5), ".1f") == "0.5"
    for bad_name in ["", "a b", "a:b", "a`b", 3]:
        with pytest.raises(ValueError, match="name"):
            pe.glue(bad_name, 1.0)
    with pytest.raises(ValueError, match="glue takes"):
        pe.glue("v", [1.0])
    for math in ["at $L$", "$8L$", "costs $"]:  # the page would show the dollars: math stays in the markdown
        with pytest.raises(ValueError, match="math is not rendered"):
            pe.glue("m", math)


def test_glue_reaches_myst_nb_in_a_kernel():
    """In a kernel with myst-nb, the text is displayed under myst-nb's glue prefix for the page to read."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("myst_nb")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import posenc as pe\npe.glue('k', pe.Spread((0.25, 0.75)), '.2f')")])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    glued = [o for o in outputs if o.get("metadata", {}).get("scrapbook", {}).get("name") == "k"]
    assert len(glued) == 1
    text = next(v for k, v in glued[0]["data"].items() if k.endswith("text/plain"))
    assert text == repr("0.50 (0.25–0.75)")


def test_curves_draw_ranges_as_error_bars():
    fig = pe.viz.curves([1, 2], {"a": [1.0, 2.0], "b": [0.5, 0.5]}, ranges={"a": ([0.5, 2.0], [1.5, 2.5])})
    err = fig.data[0].error_y
    assert list(err.array) == [0.5, 0.5] and list(err.arrayminus) == [0.5, 0.0] and not fig.data[1].error_y.array
    with pytest.raises(ValueError, match="enclose"):
        pe.viz.curves([1, 2], {"a": [1.0, 2.0]}, ranges={"a": ([1.5, 2.0], [1.5, 2.5])})
    with pytest.raises(ValueError, match="shape"):
        pe.viz.curves([1, 2], {"a": [1.0, 2.0]}, ranges={"a": ([1.0], [2.0])})
    with pytest.raises(ValueError, match="not drawn"):
        pe.viz.curves([1, 2], {"a": [1.0, 2.0]}, ranges={"b": ([1.0, 2.0], [1.0, 2.0])})
    with pytest.raises(ValueError, match="pair"):
        pe.viz.curves([1, 2], {"a": [1.0, 2.0]}, ranges={"a": [1.0, 2.0, 3.0]})


def _evidence_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "book" / "evidence_check.py"
    spec = importlib.util.spec_from_file_location("evidence_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_evidence_check_finds_the_training_chapters_and_the_other_kernels():
    check = _evidence_check()
    names = [p.stem for p in check.training_chapters()]
    assert "07_local_attention" in names and "08_stretching" in names and "01_why_position" not in names
    assert names == sorted(names) and [p.stem for p in check.training_chapters(["08"])] == ["08_stretching"]
    other = check.other_kernels()
    assert other in ("avx2", "default") and other != torch.backends.cpu.get_cpu_capability().lower()
    with pytest.raises(SystemExit):
        check.main(["99"])
    with pytest.raises(SystemExit):
        check.main(["--seed", "x"])
    with pytest.raises(SystemExit):
        check.main(["--jobs", "0"])


def test_evidence_check_lists_the_chapters_it_would_run(capsys):
    """`--list` (what `make test` leaves to the check) prints the training chapters' paths and runs nothing."""
    check = _evidence_check()
    assert check.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [p.relative_to(check.ROOT).as_posix() for p in check.training_chapters()]
    assert all(line.startswith("chapters/") and line.endswith(".ipynb") for line in listed)
    assert check.main(["--list", "08"]) == 0 and capsys.readouterr().out.split() == ["chapters/08_stretching.ipynb"]


# the evidence check's kernel set: the other one only where a probe measured here says it is affordable

@pytest.mark.parametrize("native, other", [("avx512", "avx2"), ("avx2", "default")])
@pytest.mark.parametrize("slowdown", [1.0, 1.5, 1.51, 2.9])
def test_the_other_kernels_are_chosen_only_when_affordable(monkeypatch, native, other, slowdown):
    check = _evidence_check()
    monkeypatch.setattr(check, "native_kernels", lambda: native)
    calls = []

    def measure(kernels):
        calls.append(kernels)
        # one busy turn each: the fastest turn decides, not the first
        base = 2.0 if len(calls) <= 2 else 1.0
        return base * (slowdown if kernels == other else 1.0)

    kernels, why = check.choose_kernels(measure, rounds=2)
    assert sorted(calls) == sorted([native, other] * 2) and calls[:2] == [native, other]  # in turns
    assert kernels == (other if slowdown <= check.MAX_SLOWDOWN else native)
    assert f"{slowdown:.2f}x" in why and other in why and native in why


def test_the_probe_measures_a_positive_time_under_each_kernel_set():
    check = _evidence_check()
    seconds = check.probe_seconds(check.native_kernels())
    assert 0 < seconds < 600


def test_a_failing_probe_says_so(monkeypatch):
    check = _evidence_check()
    monkeypatch.setattr(check, "_PROBE", "raise SystemExit('no posenc here')")
    with pytest.raises(RuntimeError, match="kernel probe failed under ATEN_CPU_CAPABILITY=avx2"):
        check.probe_seconds("avx2")


def test_slider_axis_ranges_hold_the_error_bars():
    """A slider figure keeps one axis range over its steps: wide enough for every step's error bars."""
    def make(k):
        return pe.viz.curves([1, 2], {"a": [1.0, k]}, ranges={"a": ([0.5, k - 1], [1.5, k + 3])})
    fig = pe.viz.slider_figure(make, [2.0, 4.0], name="k")
    low, high = fig.layout.yaxis.range
    assert low <= 0.5 and high >= 7.0


def test_per_seed_side_by_side_equals_one_after_the_other(tmp_path, monkeypatch):
    """Forked copies evaluate trained models to exactly the numbers of the serial loop (one thread each)."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    task = pe.MarkovChain(8, order=1, seed=0)
    runs = pe.train_seeds(lambda: pe.TinyLM(8, 16, 1, 2, position="alibi"), task, [0, 1, 2], workers=1,
                          steps=3, seq_len=8, batch_size=2, progress=False)

    def measure(i):
        r = pe.evaluate_lengths(runs[i].model, task, [8, 32], batches=1, batch_size=2)
        return {n: (x.loss, x.position_loss) for n, x in r.items()}

    threads = torch.get_num_threads()
    forked, serial = pe.per_seed(measure, [0, 1, 2], workers=2), pe.per_seed(measure, [0, 1, 2], workers=1)
    assert torch.get_num_threads() == threads
    for a, b in zip(forked, serial):
        for n in (8, 32):
            assert a[n][0] == b[n][0] and torch.equal(a[n][1], b[n][1])
    assert forked[0] != forked[1]


def test_per_seed_passes_warnings_and_raises_errors_here():
    def warn(s):
        warnings.warn(f"seed {s} says hello", UserWarning)
        return s

    with pytest.warns(RuntimeWarning) as caught:
        assert pe.per_seed(warn, [0, 1], workers=2) == [0, 1]
    assert sorted(str(w.message) for w in caught) == ["seed 0 says hello", "seed 1 says hello"]

    def fail(s):
        if s == 1:
            raise KeyError("no such length")
        return s

    with pytest.raises(KeyError, match="no such length"):
        pe.per_seed(fail, [0, 1, 2], workers=2)
    with pytest.raises(ValueError, match="measure must be a function"):
        pe.per_seed(3)


def test_forked_trainers_keep_to_the_process_s_share_of_the_cores(monkeypatch):
    """OMP_NUM_THREADS (set per kernel by book/execute.py and by `make test`) caps the default number of workers."""
    from posenc.evidence import _usable_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = _usable_cores()
    assert cores >= 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert _usable_cores() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 5))
    assert _usable_cores() == cores                    # never more than the process may use
    for junk in ("0", "two", ""):
        monkeypatch.setenv("OMP_NUM_THREADS", junk)
        assert _usable_cores() == cores


@given(st.floats(-1e-3, 1e-3, allow_nan=False), st.sampled_from(["+.2f", ".2f", "+.3f", ".1%", "+.0f", ".2e"]))
def test_spread_format_never_writes_minus_zero(value, spec):
    """A value that rounds to zero is written without a minus sign; every other one as format() writes it, with the
    typographic minus sign (U+2212) for the hyphen."""
    text = format(pe.spread([value]), spec)
    plain = format(value, spec)
    if float(plain.rstrip("%")) == 0.0:
        assert not text.startswith(("-", "−")) and text.lstrip("+") == plain.lstrip("+-")
        assert text.startswith("+") == ("+" in spec)
    else:
        assert text == ("−" + plain[1:] if plain.startswith("-") else plain)


def test_spread_format_drops_the_sign_of_each_rounded_zero_only():
    assert format(pe.spread([-0.004, -0.001, 0.002]), "+.2f") == "+0.00 (+0.00 to +0.00)"
    assert format(pe.spread([-0.02, -0.01, -0.006]), ".2f") == "−0.01 (−0.02 to −0.01)"   # U+2212, "to" between signs
    assert format(pe.spread([-0.02, 0.01, 0.03]), ".2f") == "0.01 (−0.02–0.03)" and format(pe.Spread((-1.0,)), ".1f") == "−1.0"


def test_the_evidence_check_starts_the_longest_chapters_first_in_that_order(monkeypatch):
    """The chapters go to pytest longest first (by the committed cost tables) with xdist's own reordering (by
    number of cells) switched off: in file-name order the longest chapter, the last, ran alone for minutes."""
    check = _evidence_check()
    calls = []
    monkeypatch.setattr(check, "choose_kernels", lambda: ("avx2", "stubbed"))
    monkeypatch.setattr(check.subprocess, "call", lambda args, **kw: calls.append((args, kw)) or 0)
    assert check.main(["--jobs", "2"]) == 0
    (args, kw), = calls
    given = [a for a in args if a.endswith(".ipynb")]
    seconds = check.longest_first.__globals__["committed_seconds"]()
    expected = sorted(check.training_chapters(), key=lambda p: -seconds[p.relative_to(check.ROOT).as_posix()])
    assert given == [str(p) for p in expected] != [str(p) for p in check.training_chapters()]
    assert args[args.index("--dist") + 1] == "loadfile" and "--no-loadscope-reorder" in args
    assert kw["env"]["ATEN_CPU_CAPABILITY"] == "avx2" and kw["env"]["POSENC_SEED"] == "1"


def test_train_seeds_takes_one_list_of_starting_runs_per_configuration(tmp_path, monkeypatch):
    """init={name: runs}: each configuration and seed fine-tunes its own earlier run, as pe.train(init=) would."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    task = pe.MarkovChain(vocab_size=4, order=1, seed=0)
    warmup = pe.PeriodicSequence(4, min_period=2, max_period=3)
    makers = {s: (lambda s=s: pe.TinyLM(4, d_model=16, n_layers=1, n_heads=2, position=s)) for s in ["rope", "alibi"]}
    kw = dict(steps=3, seq_len=8, batch_size=2, progress=False)
    warm = pe.train_seeds(makers, warmup, [0, 1], **kw)
    tuned = pe.train_seeds(makers, task, [0, 1], init=warm, **dict(kw, steps=2, warmup=0))
    for name in makers:
        for i, seed in enumerate([0, 1]):
            alone = pe.train(makers[name](), task, seed=seed, init=warm[name][i], cache=False, **dict(kw, steps=2, warmup=0))
            assert tuned[name][i].losses == alone.losses
            assert torch.equal(tuned[name][i].model.state_dict()["tok.weight"], alone.model.state_dict()["tok.weight"])
    assert tuned["rope"][0].losses != tuned["alibi"][0].losses
    with pytest.raises(ValueError, match=r"make_model's names \['alibi', 'rope'\]"):
        pe.train_seeds(makers, task, [0, 1], init={"rope": warm["rope"]}, **kw)
    with pytest.raises(ValueError, match=r"init\['alibi'\] must be a list of 2"):
        pe.train_seeds(makers, task, [0, 1], init={"rope": warm["rope"], "alibi": warm["alibi"][:1]}, **kw)
    with pytest.raises(ValueError, match=r"init must be a list of 2"):
        pe.train_seeds(makers, task, [0, 1], init=warm["rope"][:1], **kw)
