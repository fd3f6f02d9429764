"""The README's examples run as written: every ```python block, in order, in one namespace."""

import csv
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE)


def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    """Nothing is defined behind the reader's back; training is cached in a fresh folder, so it really runs."""
    assert len(BLOCKS) >= 3, "the README's python examples were not found"
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    for number, block in enumerate(BLOCKS, 1):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    out, weights = namespace["out"], namespace["weights"]
    assert out.shape == namespace["q"].shape and weights.shape == (2, 8, 512, 512)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 8, 512))
    run = namespace["run"]
    assert not run.from_cache and run.steps_run == 100 and len(namespace["losses"]) == 4
    assert run.losses[-1] < run.losses[0], "the example's model learns"


def quoted_tables(pattern, what):
    """The README with its line breaks folded, and the committed ``benchmarks/`` tables matching ``pattern``.

    Fails unless there is at least one such table and the README names each one.
    """
    root = Path(__file__).resolve().parents[1]
    readme = " ".join((root / "README.md").read_text(encoding="utf-8").split())
    tables = sorted((root / "benchmarks").glob(pattern))
    assert tables, f"no measured {what} in benchmarks/"
    for table in tables:
        assert f"`benchmarks/{table.name}`" in readme
    return readme, tables


def test_how_long_quotes_the_measured_cost_table():
    """The README's "How long" numbers are the committed cost table's, not typed guesses."""
    quoted, tables = quoted_tables("build_cost-*.csv", "cost table")
    for table in tables:
        rows = list(csv.DictReader(table.open(encoding="utf-8")))
        total = lambda column: sum(float(r[column]) for r in rows)  # noqa: E731
        assert f"{len(rows)} notebooks take {total('seconds'):.0f} kernel-seconds" in quoted
        assert f"{total('train_core_s'):.0f} of those core-seconds train {total('runs_trained'):.0f} tiny models" in quoted
        assert f"{total('evaluate_core_s'):.0f} evaluate them" in quoted and f"{total('rest_s'):.0f} seconds are" in quoted
        assert {r["mode"] for r in rows} == {"small"} and {r["seed"] for r in rows} == {"0"}


def test_readme_quotes_the_measured_cost_estimates():
    """Each shipped comparison of the announced training time with the time taken is quoted as measured."""
    readme, tables = quoted_tables("cost_estimate-*.csv", "cost estimate")
    for table in tables:
        for row in csv.DictReader(table.open(encoding="utf-8")):
            assert f"{row['runs']} runs took {float(row['ratio']):.2f} times" in readme or \
                f"{row['runs']} runs {float(row['ratio']):.2f} times" in readme
            assert 0.5 <= float(row["ratio"]) <= 2, "the estimate line misses the goal of a factor of 2"


def test_readme_quotes_the_measured_step_profile():
    """The README's account of a training step is the committed profile's RoPE row."""
    readme, tables = quoted_tables("step_profile-*.csv", "step profile")
    for table in tables:
        rope = next(r for r in csv.DictReader(table.open(encoding="utf-8")) if r["scheme"] == "rope")
        assert f"takes {float(rope['step_ms']):.1f} ms, {float(rope['share_matmul']):.0%}".replace("%", " %") in readme
        assert f"run at {float(rope['matmul_gflops']):.0f} GFLOP/s, against {float(rope['gemm_1024_gflops']):.0f} GFLOP/s" in readme
        assert f"attention takes {float(rope['share_attention']):.0%} and GELU {float(rope['share_GELU']):.0%}".replace("%", " %") in readme
        assert float(rope["matmul_gflops"]) <= float(rope["gemm_1024_gflops"]) * 1.1  # a small matmul is not faster than a large one
