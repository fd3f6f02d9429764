"""Where the time of FlexAttention goes, for the biases of the book (run on a CUDA GPU).

The attention benchmark (``attention.py``) found on an H200, at n = 16384 in
bfloat16: ALiBi through FlexAttention 1.95x causal SDPA forward, the tables
(KERPLE, Sandwich, T5) 10-11x, rotations a fixed 0.2-0.4 ms. This script
separates the parts, each timed against causal SDPA in the same run:

* the kernel itself: FlexAttention with no ``score_mod`` (the causal block mask only),
  and SDPA with each backend forced (flash, efficient, cuDNN);
* the ``score_mod``: ALiBi's multiply-add, a table read at ``i - j`` (what
  ``posenc`` does for every table), and KERPLE's log and power kernels computed
  in the ``score_mod`` from their two parameters per head (no table);
* the library's overhead: ``pe.relative_attention`` against the bare compiled call;
* Sandwich as extra channels (a fold): SDPA with ``head_dim`` doubled, the cost
  of its ``lambda p_i . p_j`` as 64 more channels;
* the rotation alone (``pe.RotaryEmbedding`` on q and k);
* block sizes of the FlexAttention kernel (``kernel_options``), for ALiBi;
* what in a ``score_mod`` costs: a constant added, one transcendental of the
  distance with no captured tensor (``log1p``, ``exp``), a table read from a
  short (512-entry) table, a table in float32.

Every variant is checked against the explicit formula before it is timed
(its largest difference is printed), and a variant that fails is reported
and skipped. A profile of one forward call of the main variants (the CUDA
kernels by time) is written beside the CSV.

Usage (on the GPU machine; ``bash benchmarks/on_gpu.sh profile`` runs it)::

    python benchmarks/flex_profile.py --out _build/gpu           # n = 16384, forward and forward+backward
    python benchmarks/flex_profile.py --lengths 8192 --batch 4 --heads 16
    python benchmarks/flex_profile.py --only constant nothing 512-entry   # some variants (and SDPA)

On a CPU it runs too (eager FlexAttention, forward only, small n), to check the script itself.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import posenc as pe
from attention import machine  # beside this file: the GPU's name, or the CPU model and threads

HEAD_DIM = 64


def timer(device: torch.device) -> Callable[[Callable[[], None], int], float]:
    """``time(fn, repeats)``: the median time of one call in seconds (CUDA events on a GPU)."""
    def cuda_time(fn, repeats):
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def cpu_time(fn, repeats):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    return cuda_time if device.type == "cuda" else cpu_time


def variants(n: int, heads: int, device: torch.device, dtype: torch.dtype) -> Dict[str, tuple]:
    """``{name: (fn(q, k, v) -> out, reference(q, k, v) -> out, or None where there is nothing to check)}``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_attention
    mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, n, n, device=device)
    slopes = pe.alibi_slopes(heads).to(device, dtype)
    r1 = torch.linspace(0.5, 2.0, heads, device=device, dtype=torch.float32)
    r2 = torch.linspace(0.1, 1.0, heads, device=device, dtype=torch.float32)
    table_log = pe.kerple_log_bias(r1.cpu(), r2.cpu(), 1, n)[:, 0].flip(-1).to(device, dtype)   # (heads, n): b(d)
    table_power = pe.kerple_power_bias(r1.cpu(), r2.cpu().clamp(max=2.0), 1, n)[:, 0].flip(-1).to(device, dtype)
    dist = (torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)).float()

    def reference(bias_of_dist):  # explicit scores, for the check only: O(n^2) memory
        def ref(q, k, v):
            b = bias_of_dist(dist.clamp(min=0)).to(torch.float32)   # (heads, n, n)
            s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1]) + b
            return s.masked_fill(dist < 0, float("-inf")).softmax(-1) @ v.float()
        return ref

    def alibi_mod(score, b, h, i, j):
        return score - slopes[h] * (i - j)

    def table_mod(table):
        def mod(score, b, h, i, j):
            return score + table[h, torch.clamp(i - j, 0, n - 1)]
        return mod

    def log_mod(score, b, h, i, j):  # KERPLE log, computed: -r1 log(1 + r2 (i - j))
        return score - r1[h] * torch.log1p(r2[h] * (i - j))

    def power_mod(score, b, h, i, j):  # KERPLE power, computed: -r1 (i - j)^r2
        d = (i - j).to(torch.float32)
        return score - r1[h] * torch.where(d > 0, torch.exp(r2[h] * torch.log(d.clamp(min=1))), d * 0)

    short = table_log[:, :512].contiguous()
    table_f32 = table_log.float()

    def const_mod(score, b, h, i, j):
        return score + 1.0

    def log1p_mod(score, b, h, i, j):  # one transcendental, nothing captured
        return score - torch.log1p((i - j).to(torch.float32))

    def exp_mod(score, b, h, i, j):
        return score - torch.exp(-(i - j).to(torch.float32) / n)

    def short_mod(score, b, h, i, j):  # the same read, from a table that fits in L1
        return score + short[h, torch.clamp(i - j, 0, 511)]

    def flex(mod, **options):
        kw = dict(kernel_options=options) if options else {}
        return lambda q, k, v: compiled(q, k, v, score_mod=mod, block_mask=mask, **kw)

    def backend(which):
        def run(q, k, v):
            with sdpa_kernel(which):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return run

    alibi_ref = reference(lambda d: -slopes.float()[:, None, None] * d)
    log_ref = reference(lambda d: -r1[:, None, None] * torch.log1p(r2[:, None, None] * d))
    power_ref = reference(lambda d: -r1[:, None, None] * d.pow(r2[:, None, None]))
    rope = pe.RotaryEmbedding(HEAD_DIM).to(device)
    plain_ref = reference(lambda d: 0 * d)
    out = {
        "SDPA": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), plain_ref),
        "SDPA, head_dim doubled (Sandwich folded)": (None, None),  # run on inputs of twice the width in main()
        "flex, no score_mod": (flex(None), plain_ref),
        "flex, ALiBi score_mod": (flex(alibi_mod), alibi_ref),
        "flex, table read (KERPLE log)": (flex(table_mod(table_log)), log_ref),
        "flex, KERPLE log computed": (flex(log_mod), log_ref),
        "flex, KERPLE power computed": (flex(power_mod), power_ref),
        "flex, table read (KERPLE power)": (flex(table_mod(table_power)), power_ref),
        "flex, constant added": (flex(const_mod), None),
        "flex, log1p of distance (nothing captured)": (flex(log1p_mod), None),
        "flex, exp of distance (nothing captured)": (flex(exp_mod), None),
        "flex, read of a 512-entry table": (flex(short_mod), None),
        "flex, table read, float32 table": (flex(table_mod(table_f32)), log_ref),
        "pe.relative_attention, ALiBi": (lambda q, k, v: pe.relative_attention(q, k, v, slopes=slopes), alibi_ref),
        "pe.relative_attention, table": (lambda q, k, v: pe.relative_attention(q, k, v, distance_bias=table_log),
                                         log_ref),
        "rotation alone (RoPE on q and k)": (lambda q, k, v: rope(q, k)[0], None),
        "rotation, tiny q and k (launch and Python only)": (lambda q, k, v: rope(q[:, :, :1], k[:, :, :1])[0], None),
    }
    if device.type == "cuda":  # the same rotation as one fused kernel per tensor
        fused = torch.compile(lambda q, k: rope(q, k), dynamic=False)
        out["rotation alone, compiled"] = (lambda q, k, v: fused(q, k)[0], None)
        for name, which in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                            ("cuDNN", getattr(SDPBackend, "CUDNN_ATTENTION", None))):
            if which is not None:
                out[f"SDPA, {name} backend"] = (backend(which), None)
        for bm, bn in ((128, 128), (128, 64), (64, 64)):
            out[f"flex, ALiBi, blocks {bm}x{bn}"] = (flex(alibi_mod, BLOCK_M=bm, BLOCK_N=bn), alibi_ref)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="default: 16384 on a GPU, 512 on a CPU")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="run only the variants whose names contain one of these (SDPA always runs)")
    args = parser.parse_args()
    import torch._dynamo  # one compiled flex_attention per score_mod: past the default limit (8) dynamo runs eager
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = args.lengths or ([16384] if device.type == "cuda" else [512])
    backward_too = device.type == "cuda" and not args.no_backward   # eager FlexAttention has no backward
    time_of = timer(device)
    args.out.mkdir(parents=True, exist_ok=True)
    where = machine()
    print(f"{where}, torch {torch.__version__}, {dtype}, batch {args.batch}, {args.heads} heads, head_dim {HEAD_DIM}",
          flush=True)
    rows: List[Dict[str, object]] = []
    profiles: List[str] = []
    for n in lengths:
        g = torch.Generator().manual_seed(0)
        shape = (args.batch, args.heads, n, HEAD_DIM)
        q, k, v, dy = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(4))
        wide = [torch.cat([t, t], -1) for t in (q, k, v)]
        cases = variants(n, args.heads, device, dtype)
        if args.only:
            cases = {k: c for k, c in cases.items() if k == "SDPA" or any(t in k for t in args.only)}
        base: Dict[bool, float] = {}
        for name, (fn, ref) in cases.items():
            inputs = (q, k, v)
            if fn is None:  # Sandwich folded: SDPA on the doubled width
                fn, inputs = cases["SDPA"][0], tuple(wide)
            row: Dict[str, object] = dict(variant=name, n=n, batch=args.batch, heads=args.heads, machine=where,
                                          torch=torch.__version__, dtype=str(dtype).replace("torch.", ""))
            try:
                if ref is not None:  # explicit scores: (batch, heads, n, n) in float32, 8.6 GB at n = 16384
                    with torch.no_grad():
                        row["max_abs_error"] = float((fn(*inputs).float() - ref(*inputs)).abs().max())
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                for backward in (False, True) if backward_too else (False,):
                    leaves = [t.detach().requires_grad_(backward) for t in inputs]

                    def call(fn=fn, leaves=leaves, backward=backward):
                        with torch.set_grad_enabled(backward):
                            out = fn(*leaves)
                            if backward:
                                out.backward(dy if out.shape == dy.shape else torch.ones_like(out))
                    for _ in range(3):  # compile, caches
                        call()
                    t = time_of(call, args.repeats)
                    key = "forward_backward" if backward else "forward"
                    if name == "SDPA":
                        base[backward] = t
                    row[f"{key}_ms"] = round(1e3 * t, 4)
                    row[f"{key}_ratio"] = round(t / base[backward], 3) if backward in base else None
                if device.type == "cuda" and name in ("SDPA", "flex, no score_mod", "flex, ALiBi score_mod",
                                                      "flex, table read (KERPLE log)", "flex, KERPLE log computed"):
                    with torch.no_grad(), torch.profiler.profile(
                            activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        fn(*inputs)
                        torch.cuda.synchronize()
                    profiles.append(f"== {name}, n = {n}\n"
                                    + prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
            except Exception as err:  # report and go on: one variant must not cost the others
                row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
            rows.append(row)
            shown = [k for k in ("forward_ms", "forward_ratio", "forward_backward_ms", "forward_backward_ratio",
                                 "max_abs_error", "error") if row.get(k) is not None]
            print(f"n={n:6d} {name:48s} " + "  ".join(f"{k} {row[k]}" for k in shown), flush=True)
    stem = f"flex_profile-{where.split()[-1].lower() if device.type == 'cuda' else 'cpu'}"
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if profiles:
        (args.out / f"{stem}-kernels.txt").write_text("\n\n".join(profiles))
    print(f"wrote {args.out / (stem + '.csv')}" + (f" and {stem}-kernels.txt" if profiles else ""))
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
