"""posenc.autotune and relative_attention's "auto": paths chosen by timing, once per shape class."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import posenc as pe
import posenc.attention as A
import posenc.autotune as T


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(T.AUTOTUNE_ENV, raising=False)
    T.clear_autotune_decisions()
    yield
    T.clear_autotune_decisions()


def test_choose_times_each_candidate_once_per_key_and_keeps_the_fastest(monkeypatch):
    calls = {"slow": 0, "fast": 0}
    clock = iter(range(10**6))
    cost = {"slow": 5, "fast": 1}

    def fake_perf_counter():            # time advances by the cost of whatever ran last
        return next(clock)

    monkeypatch.setattr(T.time, "perf_counter", fake_perf_counter)

    def run(name):
        def f():
            calls[name] += 1
            for _ in range(cost[name] - 1):
                next(clock)
        return f

    pick = T.choose_fastest("k", {"slow": run("slow"), "fast": run("fast")}, fallback="slow", repeats=2)
    assert pick == "fast" and calls == {"slow": 3, "fast": 3}          # a warm-up and two timed calls each
    assert T.choose_fastest("k", {"slow": run("slow"), "fast": run("fast")}, fallback="slow") == "fast"
    assert calls == {"slow": 3, "fast": 3}                              # remembered: nothing timed again
    name, timings = T.autotune_decisions(timings=True)["k"]
    assert name == "fast" and timings["fast"] < timings["slow"]
    assert T.choose_fastest("other", {"slow": run("slow"), "fast": run("fast")}, fallback="slow") == "fast"
    assert calls == {"slow": 6, "fast": 6}                              # another key is timed on its own
    assert T.clear_autotune_decisions() == 2 and T.autotune_decisions() == {}


@pytest.mark.parametrize("fast_cost,margin,expected", [(96, 0.05, "rule"), (94, 0.05, "fast"), (99, 0.0, "fast"),
                                                        (50, 0.6, "rule"), (100, 0.0, "rule")])
def test_the_rule_is_kept_unless_another_candidate_is_faster_by_the_margin(monkeypatch, fast_cost, margin, expected):
    clock = iter(range(10**6))
    monkeypatch.setattr(T.time, "perf_counter", lambda: next(clock))
    cost = {"rule": 100, "fast": fast_cost}

    def run(name):
        def f():
            for _ in range(cost[name] - 1):
                next(clock)
        return f

    key = ("margin", fast_cost, margin)
    assert T.choose_fastest(key, {"rule": run("rule"), "fast": run("fast")}, fallback="rule", margin=margin) == expected
    _, timings = T.autotune_decisions(timings=True)[key]
    assert timings == {"rule": 100, "fast": fast_cost}                  # what was measured, whichever was kept
    for bad in (-0.1, 1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="margin"):
            T.choose_fastest(("bad", bad), {"rule": run("rule"), "fast": run("fast")}, fallback="rule", margin=bad)


def test_the_off_switch_and_a_single_candidate_time_nothing(monkeypatch):
    ran = []
    candidates = {"a": lambda: ran.append("a"), "b": lambda: ran.append("b")}
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv(T.AUTOTUNE_ENV, off)
        assert not T.autotune_enabled() and T.choose_fastest("k", candidates, fallback="b") == "b"
    monkeypatch.setenv(T.AUTOTUNE_ENV, "1")
    assert T.choose_fastest("k1", {"a": candidates["a"]}, fallback="a") == "a"
    assert ran == [] and T.autotune_decisions() == {}


def test_a_failing_candidate_is_not_chosen():
    def out_of_memory():
        raise RuntimeError("out of memory")

    assert T.choose_fastest("k", {"big": out_of_memory, "small": lambda: None}, fallback="big") == "small"
    assert T.choose_fastest("k2", {"big": out_of_memory}, fallback="big") == "big"


def test_choose_refuses_bad_arguments():
    with pytest.raises(ValueError, match="at least one candidate"):
        T.choose_fastest("k", {}, fallback="a")
    with pytest.raises(ValueError, match="fallback 'c' is not one of"):
        T.choose_fastest("k", {"a": lambda: None}, fallback="c")
    with pytest.raises(ValueError, match="repeats"):
        T.choose_fastest("k", {"a": lambda: None, "b": lambda: None}, fallback="a", repeats=0)
    with pytest.raises(ValueError, match="length"):
        T.length_bucket(0)
    assert [T.length_bucket(n) for n in (1, 2, 3, 129, 256, 257)] == [1, 2, 4, 256, 256, 512]


def test_time_in_turns_takes_turns_round_by_round():
    order = []
    runs = {"a": lambda: order.append("a"), "b": lambda: order.append("b"), "c": lambda: order.append("c")}
    t = T.time_in_turns(runs, rounds=2, number=2)
    assert order == list("abc") + list("aabbcc") * 2                     # a warm-up call each, then two rounds in turn
    assert list(t) == ["a", "b", "c"] and all(len(v) == 2 and min(v) >= 0 for v in t.values())
    order.clear()
    t = T.time_in_turns(list(runs.values()), rounds=3, warmup=False)
    assert order == list("abc") * 3 and [len(v) for v in t] == [3, 3, 3]   # a list in, a list out


def test_time_in_turns_divides_by_number_and_reads_the_chosen_clock(monkeypatch):
    clock = iter(range(10**6))
    cost = {"slow": 7, "fast": 3}

    def run(name):
        return lambda: [next(clock) for _ in range(cost[name])]

    monkeypatch.setattr(T.time, "thread_time", lambda: next(clock))
    t = T.time_in_turns({n: run(n) for n in cost}, rounds=2, number=4, clock="thread", warmup=False)
    assert t == {"slow": [7.25, 7.25], "fast": [3.25, 3.25]}          # (4 calls x cost + 1 clock tick) / 4


@settings(max_examples=20, deadline=None)
@given(rounds=st.integers(1, 4), number=st.integers(1, 3), warmup=st.booleans(), k=st.integers(1, 4),
       threads=st.sampled_from([None, 1, 2]))
def test_time_in_turns_calls_each_candidate_as_asked_and_restores_the_process(rounds, number, warmup, k, threads):
    import gc
    calls = [0] * k
    runs = [lambda i=i: calls.__setitem__(i, calls[i] + 1) for i in range(k)]
    before = torch.get_num_threads()
    t = T.time_in_turns(runs, rounds=rounds, number=number, warmup=warmup, threads=threads)
    assert calls == [rounds * number + warmup] * k and [len(v) for v in t] == [rounds] * k
    assert torch.get_num_threads() == before and gc.isenabled()


def test_time_in_turns_restores_threads_and_gc_when_a_candidate_raises():
    import gc
    before = torch.get_num_threads()

    def boom():
        raise RuntimeError("inside the candidate")

    with pytest.raises(RuntimeError, match="inside the candidate"):
        T.time_in_turns([lambda: None, boom], threads=1, warmup=False)
    assert torch.get_num_threads() == before and gc.isenabled()
    gc.disable()
    try:
        T.time_in_turns([lambda: None], rounds=1)
        assert not gc.isenabled()                                        # left as it was found
    finally:
        gc.enable()


def test_time_in_turns_refuses_bad_arguments():
    for kwargs, match in [(dict(rounds=0), "rounds"), (dict(number=1.5), "number"), (dict(clock="cpu"), "clock"),
                          (dict(threads=0), "threads"), (dict(device="cuda", clock="thread"), "GPU"),
                          (dict(device="no such device"), "device")]:
        with pytest.raises(ValueError, match=match):
            T.time_in_turns([lambda: None], **kwargs)
    for candidates in ([], {}, [1]):
        with pytest.raises(ValueError, match="at least one candidate"):
            T.time_in_turns(candidates)


def _qkv(n, heads=2, d=16, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, d, generator=g).requires_grad_(grad) for _ in range(3)]


@settings(max_examples=12, deadline=None)
@given(n=st.sampled_from([129, 200, 300]), kind=st.sampled_from(["alibi", "table", "both", "window"]),
       grad=st.booleans())
def test_auto_equals_the_fixed_rule_and_the_reference(n, kind, grad):
    """Whatever the timing picks, "auto" gives the reference's output (and gradients) to float32 rounding."""
    T.clear_autotune_decisions()
    slopes = pe.alibi_slopes(2) if kind in ("alibi", "both", "window") else None
    table = torch.randn(2, n, generator=torch.Generator().manual_seed(1)) if kind in ("table", "both") else None
    window = 40 if kind == "window" else None
    outs, grads = [], []
    for path in ("auto", "naive"):
        q, k, v = _qkv(n, grad=grad)
        out = pe.relative_attention(q, k, v, slopes=slopes, distance_bias=table, window=window, path=path)
        outs.append(out.detach())
        if grad:
            out.square().sum().backward()
            grads.append(torch.cat([t.grad for t in (q, k, v)]))
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=1e-4)
    if grad:
        torch.testing.assert_close(grads[0], grads[1], atol=1e-4, rtol=1e-3)
    chosen = list(T.autotune_decisions().values())
    assert len(chosen) == 1 and chosen[0] in ("chunked", "bias", "fold", "key_bias")
    key = next(iter(T.autotune_decisions()))
    assert key[-1] == grad and key[5] == T.length_bucket(n)           # the class: grad or not, the length bucket


def test_auto_times_a_class_once_and_leaves_the_inputs_gradients_alone(monkeypatch):
    timed = []
    real = T.time_in_turns
    monkeypatch.setattr(T, "time_in_turns", lambda runs, **kw: timed.extend(runs) or real(runs, **dict(kw, rounds=1)))
    q, k, v = _qkv(300, grad=True)
    slopes = pe.alibi_slopes(2).requires_grad_(True)
    out = pe.relative_attention(q, k, v, slopes=slopes)
    assert len(timed) >= 2 and all(t.grad is None for t in (q, k, v, slopes))   # timing ran on copies
    before = len(timed)
    for n in (260, 400, 512):                                              # the same bucket (512)
        pe.relative_attention(*_qkv(n, grad=True), slopes=slopes)
    assert len(timed) == before
    with torch.no_grad():                                                  # no gradient: another class
        pe.relative_attention(*_qkv(300), slopes=slopes)
    assert len(timed) > before and len(T.autotune_decisions()) == 2
    out.sum().backward()
    assert q.grad is not None and slopes.grad is not None


@pytest.mark.parametrize("key_bias", [True, False], ids=["key-bias-kernel", "older-torch"])
def test_auto_without_timing_follows_the_fixed_rule(monkeypatch, key_bias):
    monkeypatch.setenv(T.AUTOTUNE_ENV, "0")
    monkeypatch.setattr(A, "key_bias_available", lambda: key_bias)
    chosen = []
    for name in ("key_bias", "fold", "chunked", "bias"):
        real = getattr(A, f"_path_{name}")
        monkeypatch.setattr(A, f"_path_{name}", lambda *a, _n=name, _r=real, **kw: chosen.append(_n) or _r(*a, **kw))
    q, k, v = _qkv(4096, heads=1, d=64)
    with torch.no_grad():
        pe.relative_attention(q, k, v, slopes=pe.alibi_slopes(1))               # ALiBi per key, else (long, wide heads) the fold
        pe.relative_attention(*_qkv(300), slopes=pe.alibi_slopes(2))             # ALiBi per key, else the chunked view
        pe.relative_attention(*_qkv(300), distance_bias=torch.zeros(2, 300))     # a table: the chunked view
        pe.relative_attention(*_qkv(100), slopes=pe.alibi_slopes(2))             # short: the stored bias
    expected = ["key_bias", "key_bias"] if key_bias else ["fold", "chunked"]
    assert chosen == [*expected, "chunked", "bias"] and T.autotune_decisions() == {}
