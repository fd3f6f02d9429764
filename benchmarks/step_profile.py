"""Where one training step of the tiny model spends its time, and how close its matmuls run to this core's peak.

The book's build time is almost all training (``benchmarks/build_cost-*.csv``),
and a run is a fixed number of small-preset steps, so the step is what a
cheaper build would have to cut. This script trains the small preset's model
(one CPU thread, as :func:`posenc.train` does) under ``torch.profiler`` for a
few steps after a warm-up, sorts the operators' own time into groups (matmuls,
attention, GELU, layer norm, the optimizer, copies and the rest) and reports:

* the share of each group in the step, and the step's time;
* the matmuls' rate in GFLOP/s (their FLOPs counted from the shapes the
  profiler records), next to the rate of one large square float32 matmul
  measured in the same run on the same thread: the ceiling a small matmul
  can approach but not pass.

Usage::

    python benchmarks/step_profile.py                      # RoPE and ALiBi, 40 steps each
    python benchmarks/step_profile.py --schemes none --steps 100

Results go to ``benchmarks/results/step_profile.csv`` (git-ignored), or to
``--out``. Numbers depend on the machine; the shares and the ratio of the two
rates are what carries over.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch.profiler import ProfilerActivity, profile

import posenc as pe
from attention import machine, write_rows  # beside this file: the GPU's name, or the CPU model and threads

RESULTS = Path(__file__).resolve().parent / "results" / "step_profile.csv"

# Operator name (as the profiler prints it) -> group; the first matching prefix wins.
GROUPS = [("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")),
          ("attention", ("aten::_scaled_dot_product", "aten::_flash_attention")),
          ("GELU", ("aten::gelu",)),
          ("layer norm", ("aten::native_layer_norm",)),
          ("optimizer", ("aten::_fused_adamw", "aten::_foreach", "aten::addcmul", "aten::lerp", "Optimizer.")),
          ("copies", ("aten::copy_", "aten::cat", "aten::contiguous", "aten::clone"))]


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return "other"


def matmul_flops(name: str, shapes: List[List[int]]) -> float:
    """FLOPs of one mm / addmm / bmm call from its input shapes (0 where they are not recorded)."""
    dims = [s for s in shapes if s]
    if name == "aten::addmm" and len(dims) >= 3:  # bias, (m, k), (k, n)
        (m, k), (_, n) = dims[1], dims[2]
        return 2.0 * m * k * n
    if name == "aten::mm" and len(dims) >= 2:
        (m, k), (_, n) = dims[0], dims[1]
        return 2.0 * m * k * n
    if name == "aten::bmm" and len(dims) >= 2:
        (b, m, k), (_, _, n) = dims[0], dims[1]
        return 2.0 * b * m * k * n
    return 0.0


def gemm_ceiling(size: int = 1024, repeats: int = 20) -> float:
    """GFLOP/s of a (size x size) @ (size x size) float32 matmul on this thread, the best of ``repeats``."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2.0 * size ** 3 / best / 1e9


def profile_scheme(scheme: str, steps: int, warmup_steps: int) -> Dict[str, Any]:
    """One row: the step's time (ms), each group's share, the matmuls' GFLOP/s."""
    preset = pe.training_preset("small")
    task = pe.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0)  # chapter 7's chain
    kwargs = dict(preset.train_kwargs(), cache=False, progress=False, cpu_threads=1)
    pe.train(preset.make_model(task.vocab_size, scheme), task, **dict(kwargs, steps=warmup_steps, warmup=0))
    kwargs.update(steps=steps, warmup=min(preset.warmup, steps))  # the preset's schedule, as far as it fits
    model = preset.make_model(task.vocab_size, scheme)  # the step without the profiler's own cost
    start = time.perf_counter()
    pe.train(model, task, **kwargs)
    step_ms = 1e3 * (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # the operators' time: without shapes, which
        pe.train(preset.make_model(task.vocab_size, scheme), task, **kwargs)  # slow some operators 2x
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as shaped:  # the matmuls' shapes only
        pe.train(preset.make_model(task.vocab_size, scheme), task, **kwargs)
    groups: Dict[str, float] = {}  # microseconds of the operators' own time, by group
    for event in prof.key_averages():
        group = group_of(event.key)
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total
    total, mm_us = sum(groups.values()), groups.get("matmul", 0.0)
    flops = sum(matmul_flops(e.key, e.input_shapes) * e.count
                for e in shaped.key_averages(group_by_input_shape=True) if group_of(e.key) == "matmul")
    row: Dict[str, Any] = dict(scheme=scheme, step_ms=round(step_ms, 2),
                               profiled_step_ms=round(total * 1e-3 / steps, 2),
                               matmul_gflops=round(flops / (mm_us * 1e-6) / 1e9, 1) if mm_us else 0.0)
    for group in [g for g, _ in GROUPS] + ["other"]:
        row[f"share_{group.replace(' ', '_')}"] = round(groups.get(group, 0.0) / total, 3)
    return row


def main(argv: Optional[List[Any]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", nargs="+", default=["rope", "alibi"])
    parser.add_argument("--steps", type=int, default=40, help="profiled steps per scheme (default 40)")
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(None if argv is None else [str(a) for a in argv])
    if args.steps < 1 or args.warmup_steps < 1:
        parser.error("--steps and --warmup-steps must be at least 1")
    unknown = [s for s in args.schemes if s not in pe.scheme.POSITION_SCHEMES]
    if unknown:
        parser.error(f"unknown schemes {unknown}; choose from {sorted(pe.scheme.POSITION_SCHEMES)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ceiling, where = gemm_ceiling(), machine()  # the machine as it ran: one thread
        rows = [profile_scheme(s, args.steps, args.warmup_steps) for s in args.schemes]
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        row.update(gemm_1024_gflops=round(ceiling, 1), machine=where, kernels=torch.backends.cpu.get_cpu_capability(),
                   torch=torch.__version__)
        shares = ", ".join(f"{k[6:].replace('_', ' ')} {v:.0%}" for k, v in row.items() if k.startswith("share_"))
        print(f"{row['scheme']:8s} {row['step_ms']:.1f} ms/step; {shares}; matmuls {row['matmul_gflops']:.0f} GFLOP/s "
              f"against {ceiling:.0f} for a 1024 x 1024 matmul on this thread")
    write_rows(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
