"""The evidence check's choice of CPU kernels: the other set when it is affordable, measured here."""

import importlib.util
from pathlib import Path

import pytest


def _check():
    path = Path(__file__).resolve().parents[1] / "book" / "evidence_check.py"
    spec = importlib.util.spec_from_file_location("evidence_check_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("native, other", [("avx512", "avx2"), ("avx2", "default")])
@pytest.mark.parametrize("slowdown", [1.0, 1.5, 1.51, 2.9])
def test_the_other_kernels_are_chosen_only_when_affordable(monkeypatch, native, other, slowdown):
    check = _check()
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
    check = _check()
    seconds = check.probe_seconds(check.native_kernels())
    assert 0 < seconds < 600


def test_a_failing_probe_says_so(monkeypatch):
    check = _check()
    monkeypatch.setattr(check, "_PROBE", "raise SystemExit('no posenc here')")
    with pytest.raises(RuntimeError, match="kernel probe failed under ATEN_CPU_CAPABILITY=avx2"):
        check.probe_seconds("avx2")
