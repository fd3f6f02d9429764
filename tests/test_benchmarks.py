"""The benchmark scripts run, write what the book reads, and lose nothing when a case fails.

Each runs in-process at tiny sizes (seconds): the numbers are not checked,
only that every ratio is taken against causal SDPA of the same run, that
every case is there (or said to be missing), and that a variant is checked
against explicit scores before it is timed.
"""

import csv
import os
import sys
from pathlib import Path

import pytest
import torch

import posenc as pe

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    """Import a script of benchmarks/ by name (they import each other as plain modules)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("POSENC_PROGRESS", "0")

    def load(name, *argv):
        module = __import__(name)
        monkeypatch.setattr(sys, "argv", [f"{name}.py", *map(str, argv)])
        return module
    yield load
    pe.clear_autotune_decisions()  # the paths these tiny runs timed are not other tests' business


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_attention_benchmark_takes_every_ratio_against_sdpa_of_the_same_run(bench, tmp_path):
    out = tmp_path / "attention.csv"
    attention = bench("attention", "--lengths", 32, 64, "--rounds", 2, "--repeats", 1, "--no-memory", "--out", out)
    attention.main()
    rows = rows_of(out)
    assert {(r["scheme"], int(r["n"])) for r in rows} == {(s, n) for s in attention.SCHEMES for n in (32, 64)}
    for r in rows:
        assert r["device"] == "cpu" and r["rounds"] == "2" and r["machine"] == attention.machine()
        for column in ("forward_ratio", "forward_backward_ratio"):
            low, mid, high = (float(r[column + end]) for end in ("_min", "", "_max"))
            assert 0 < low <= mid <= high
            if r["scheme"] == "causal SDPA":
                assert low == mid == high == 1.0


def test_attention_benchmark_stops_the_explicit_kinds_at_their_cap(bench, tmp_path):
    out = tmp_path / "attention.csv"
    attention = bench("attention", "--lengths", 32, 64, "--rounds", 1, "--repeats", 1, "--no-memory",
                      "--explicit-max", 32, "--schemes", "FoX", "CoPE", "stick-breaking", "--out", out)
    attention.main()
    cases = {(r["scheme"], int(r["n"])) for r in rows_of(out)}
    assert cases == {("causal SDPA", 32), ("causal SDPA", 64), ("FoX", 32), ("FoX", 64), ("CoPE", 32),
                     ("stick-breaking", 32)}


def test_attention_benchmark_update_replaces_only_the_schemes_measured_again(bench, tmp_path):
    out = tmp_path / "attention.csv"
    bench("attention", "--lengths", 32, "--rounds", 1, "--repeats", 1, "--no-memory", "--schemes", "RoPE", "RoPE + SSMax",
          "--out", out).main()
    before = {r["scheme"]: r for r in rows_of(out)}
    bench("attention", "--lengths", 32, "--rounds", 1, "--repeats", 1, "--no-memory", "--schemes", "RoPE + SSMax", "FoX",
          "--out", out, "--update").main()
    after = rows_of(out)
    assert [r["scheme"] for r in after] == ["causal SDPA", "RoPE", "RoPE + SSMax", "FoX"]   # the file's rows first, kept
    assert after[0] == before["causal SDPA"] and after[1] == before["RoPE"]        # its baseline and RoPE untouched
    bench("attention", "--lengths", 32, "--rounds", 1, "--repeats", 1, "--no-memory", "--schemes", "FoX",
          "--out", out).main()                                                       # without --update: a new file
    assert [r["scheme"] for r in rows_of(out)] == ["causal SDPA", "FoX"]


def test_attention_benchmark_leaves_out_a_case_that_runs_out_of_memory(bench, tmp_path, monkeypatch, capsys):
    out = tmp_path / "attention.csv"
    attention = bench("attention", "--lengths", 32, 64, "--rounds", 1, "--repeats", 1, "--no-memory", "--out", out)
    made = attention.make_case

    def make_case(scheme, n, device, dtype):  # one case fails as a GPU would when it is out of memory
        if (scheme, n) == ("Sandwich [bias]", 64):
            def out_of_memory(q, k, v):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
            return out_of_memory
        return made(scheme, n, device, dtype)
    monkeypatch.setattr(attention, "make_case", make_case)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    attention.main()
    cases = {(r["scheme"], int(r["n"])) for r in rows_of(out)}
    assert ("Sandwich [bias]", 64) not in cases and ("Sandwich [bias]", 32) in cases
    assert len(cases) == 2 * len(attention.SCHEMES) - 1                         # everything else is kept
    assert "Sandwich [bias] at n=64: out of GPU memory (forward); no timing at this length" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager on a CPU
def test_flex_profile_checks_every_variant_against_explicit_scores(bench, tmp_path):
    flex_profile = bench("flex_profile", "--lengths", 48, "--repeats", 1, "--out", tmp_path)
    flex_profile.main()
    rows = {r["variant"]: r for r in rows_of(tmp_path / "flex_profile-cpu.csv")}
    assert "SDPA" in rows and rows["SDPA"]["forward_ratio"] == "1.0"
    assert not any(r.get("error") for r in rows.values())
    checked = [r for r in rows.values() if r["max_abs_error"]]
    assert len(checked) >= 8 and all(float(r["max_abs_error"]) < 1e-4 for r in checked)   # float32 on a CPU
    assert all(float(r["forward_ms"]) > 0 for r in rows.values())
    assert {"flex, constant added", "flex, read of a 512-entry table"} <= set(rows)


def test_flex_profile_runs_only_the_variants_asked_for(bench, tmp_path):
    bench("flex_profile", "--lengths", 32, "--repeats", 1, "--out", tmp_path, "--only", "constant", "log computed").main()
    rows = [r["variant"] for r in rows_of(tmp_path / "flex_profile-cpu.csv")]
    assert rows == ["SDPA", "flex, KERPLE log computed", "flex, constant added"]


def test_train_throughput_is_relative_to_nope_and_names_the_machine(bench, tmp_path):
    out = tmp_path / "train.csv"
    train_throughput = bench("train_throughput", "--mode", "small", "--lengths", 16, "--steps", 1, "--repeats", 1,
                             "--warmup", 1, "--schemes", "rope", "sinusoidal", "--out", out)
    train_throughput.main()
    rows = {r["scheme"]: r for r in rows_of(out)}
    assert set(rows) == {"none", "rope", "sinusoidal"} and rows["none"]["relative_to_nope"] == "1.0"
    assert all(r["machine"] == train_throughput.machine() and r["torch"] == torch.__version__ for r in rows.values())


def test_cost_estimate_reads_the_line_train_seeds_prints(bench):
    estimate = bench("cost_estimate")
    from posenc.evidence import _minutes
    for minutes in (0.1, 0.5, 0.77, 1.0, 1.8, 9.94, 12.4):   # as train_seeds writes T, read back to its rounding
        line = f"30 runs: 0 from the cache, 30 to train, about {_minutes(minutes)} on this device"
        assert abs(estimate.estimate_seconds(line) - 60 * minutes) <= (3 if minutes < 1 else 30)
    assert _minutes(0.01) == "a few seconds"          # a bound, not a number
    assert estimate.estimate_seconds(f"3 runs: 0 from the cache, 3 to train, about {_minutes(0.01)} on this device") is None
    assert estimate.estimate_seconds("3 runs: 3 from the cache, 0 to train") is None


def test_cost_estimate_trains_from_an_empty_cache_and_writes_its_row(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "kept"))
    out = tmp_path / "estimate.csv"
    estimate = bench("cost_estimate", "--schemes", "rope", "--steps", 3, "--out", out)
    assert estimate.main() == 0
    (row,) = rows_of(out)
    assert row["runs"] == str(len(pe.seeds())) and row["steps"] == "3" and float(row["measured_s"]) > 0
    assert not (tmp_path / "kept").exists() and os.environ["POSENC_CACHE"] == str(tmp_path / "kept")   # its own cache, then the reader's again
    with pytest.raises(SystemExit):
        bench("cost_estimate", "--steps", 0).main()


def test_step_profile_counts_two_flops_per_multiply_add(bench):
    step_profile = bench("step_profile")
    assert step_profile.matmul_flops("aten::mm", [[1024, 64], [64, 256]]) == 2 * 1024 * 64 * 256
    assert step_profile.matmul_flops("aten::addmm", [[256], [1024, 64], [64, 256], [], []]) == 2 * 1024 * 64 * 256
    assert step_profile.matmul_flops("aten::bmm", [[3, 5, 7], [3, 7, 2]]) == 2 * 3 * 5 * 7 * 2
    assert step_profile.matmul_flops("aten::mm", []) == 0.0          # shapes not recorded: nothing counted
    group = step_profile.group_of
    assert group("aten::mm") == group("aten::addmm") == "matmul"
    assert group("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert group("aten::gelu_backward") == "GELU" and group("aten::native_layer_norm_backward") == "layer norm"
    assert group("aten::_fused_adamw_") == "optimizer" and group("aten::copy_") == "copies"
    assert group("aten::embedding_dense_backward") == "other"


def test_step_profile_writes_shares_that_sum_to_one_and_gives_the_threads_back(bench, tmp_path, capsys):
    out = tmp_path / "profile.csv"
    threads = torch.get_num_threads()
    bench("step_profile").main(["--schemes", "none", "--steps", 2, "--warmup-steps", 1, "--out", out])
    assert torch.get_num_threads() == threads
    [row] = rows_of(out)
    shares = [float(v) for k, v in row.items() if k.startswith("share_")]
    assert abs(sum(shares) - 1) < 0.01 and all(0 <= s <= 1 for s in shares)
    assert float(row["step_ms"]) > 0 and float(row["matmul_gflops"]) > 0 and float(row["gemm_1024_gflops"]) > 0
    assert row["scheme"] == "none" and "ms/step" in capsys.readouterr().out


def test_step_profile_refuses_unknown_schemes_and_zero_steps(bench, tmp_path):
    for argv in (["--schemes", "rotary"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            bench("step_profile").main(argv + ["--out", tmp_path / "x.csv"])
    assert not (tmp_path / "x.csv").exists()


def test_benchmark_rows_are_written_whole_or_not_at_all(bench, tmp_path, monkeypatch):
    attention = bench("attention")
    out = tmp_path / "sub" / "rows.csv"
    attention.write_rows(out, [{"a": 1}, {"a": 2, "b": 3}])           # columns: every key, first seen first
    assert rows_of(out) == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]

    def broken(self, rows):
        raise OSError("disk full")
    monkeypatch.setattr(attention.csv.DictWriter, "writerows", broken)
    with pytest.raises(OSError):
        attention.write_rows(out, [{"a": 9}])
    assert rows_of(out) == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]  # the earlier file, whole
    assert sorted(p.name for p in out.parent.iterdir()) == ["rows.csv"]  # and nothing half-written beside it
