"""Cost of causal linear attention and DiagAttention against softmax attention (SDPA).

For each length n (default 1k ... 16k) it times one forward pass of

* ``sdpa``      softmax attention, ``F.scaled_dot_product_attention(is_causal=True)``;
* ``chunked``   causal linear attention, chunked form (``posenc.linear_attention``);
* ``recurrent`` the same, one RNN step per token (a Python loop);
* ``cumsum``    the same, all states ``S_i`` at once (``O(n d e)`` memory);
* ``quadratic`` the same, masked ``n x n`` matrix (the reference);
* ``diag``      DiagAttention, block-diagonal softmax (``posenc.diag_attention``);

and reports the time relative to SDPA at the same length, the log-log slope
of time against n (least squares from 2k to 16k: 1 = linear, 2 = quadratic),
the crossover length beyond which a method stays faster than SDPA, and the
peak memory.

Memory. On CUDA: ``torch.cuda.max_memory_allocated`` above the inputs. On the
CPU PyTorch has no allocator statistics, so each case is run once more in a
fresh process and the growth of its peak resident set size over the inputs
is reported (Linux: ``VmHWM`` after resetting it through
``/proc/self/clear_refs``; elsewhere ``ru_maxrss``, which can hide
allocations smaller than the peak of the imports); ``--memory analytic`` reports
instead the size of the largest intermediate tensor computed from the shapes.
The analytic size is printed next to the measurement in any case.

Time is the best of ``--rounds`` sweeps over all cases times ``--repeats``
runs each. On the CPU with one thread (the
default) it is the CPU time of that thread (``time.thread_time``), which other
programs on a shared machine disturb much less than wall-clock time; with
several threads or on a GPU it is wall-clock time.

Forms that would take too long or too much memory are skipped (``--max-matrix-gib``
for quadratic and cumsum, ``--max-recurrent`` for the loop); the table says so.

Usage::

    python benchmarks/linear_attention.py                 # CPU, n = 1k..16k
    python benchmarks/linear_attention.py --lengths 256 512 1024 --repeats 5

Results go to ``benchmarks/results/linear_attention.csv`` (git-ignored).
Absolute times depend on the machine; compare ratios and slopes.
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from posenc import linear as lin

METHODS = ["sdpa", "chunked", "recurrent", "cumsum", "quadratic", "diag"]


def make_inputs(n: int, args, device: torch.device):
    gen = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, n, args.dim)
    return tuple(torch.randn(shape, generator=gen).to(device) for _ in range(3))


def run_case(method: str, q, k, v, args) -> torch.Tensor:
    if method == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method == "diag":
        return lin.diag_attention(q, k, v, block_size=args.block)
    return lin.linear_attention(q, k, v, method=method, chunk_size=args.chunk)


def largest_intermediate_bytes(method: str, n: int, args) -> int:
    """Size of the largest tensor the method creates (float32), from the shapes."""
    b, h, d = args.batch, args.heads, args.dim
    e = d
    if method == "sdpa":  # fused kernel: the output (and per-block scratch), never n x n
        return 4 * b * h * n * e
    if method == "quadratic":
        return 4 * b * h * n * n
    if method == "cumsum":
        return 4 * b * h * n * d * e
    if method == "recurrent":
        return 4 * b * h * n * e  # the stacked outputs; the state is d x e
    chunks = math.ceil(n / args.chunk) if method == "chunked" else math.ceil(n / args.block)
    width = args.chunk if method == "chunked" else args.block
    states = 4 * b * h * chunks * d * e if method == "chunked" else 0
    return max(4 * b * h * n * width, states, 4 * b * h * n * e)


def skip_reason(method: str, n: int, args) -> str:
    gib = 2.0 ** 30
    if method in ("quadratic", "cumsum"):
        size = largest_intermediate_bytes(method, n, args)
        if size > args.max_matrix_gib * gib:
            return f"skipped: {size / gib:.1f} GiB intermediate"
    if method == "recurrent" and n > args.max_recurrent:
        return f"skipped: n > {args.max_recurrent} Python steps"
    return ""


def time_case(method: str, n: int, args, device: torch.device) -> float:
    """Best of ``args.repeats`` runs, in seconds (wall clock, or CPU time of this thread)."""
    q, k, v = make_inputs(n, args, device)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    best = float("inf")
    with torch.no_grad():
        run_case(method, q, k, v, args)  # warm-up
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = clock()
            run_case(method, q, k, v, args)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, clock() - start)
    return best


def _rss_child(method, n, args, queue):  # runs in a fresh process
    import peak_rss  # beside this file

    torch.set_num_threads(args.threads)
    q, k, v = make_inputs(n, args, torch.device("cpu"))
    added = peak_rss.start()
    with torch.no_grad():
        out = run_case(method, q, k, v, args)
    peak = added()
    del out
    queue.put(peak)


def peak_memory(method: str, n: int, args, device: torch.device) -> float:
    """Peak extra bytes of one forward pass (see the module docstring)."""
    if device.type == "cuda":
        q, k, v = make_inputs(n, args, device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad():
            out = run_case(method, q, k, v, args)
        torch.cuda.synchronize()
        del out
        return float(torch.cuda.max_memory_allocated() - base)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_rss_child, args=(method, n, args, queue))
    proc.start()
    proc.join()
    return float(queue.get()) if proc.exitcode == 0 else float("nan")


def loglog_slope(lengths, times) -> float:
    pts = [(math.log(n), math.log(t)) for n, t in zip(lengths, times) if t == t and t > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def crossover(lengths, times, sdpa) -> str:
    """Smallest measured n from which the method is faster than SDPA at every larger n."""
    faster = [t == t and t < s for t, s in zip(times, sdpa)]
    for i in range(len(lengths)):
        if all(faster[i:]):
            return str(lengths[i])
    return "none measured"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="sweeps over all cases; the minimum over rounds and repeats is kept, so a burst of "
                             "load on a shared machine does not hit every measurement of a case")
    parser.add_argument("--clock", choices=["auto", "wall", "cpu"], default="auto",
                        help="cpu: CPU time of the calling thread (steady on a shared machine; needs --threads 1); "
                             "auto: cpu on the CPU with one thread, else wall")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: stable timings on a shared machine)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory", choices=["measured", "analytic"], default="measured")
    parser.add_argument("--max-matrix-gib", type=float, default=1.0)
    parser.add_argument("--max-recurrent", type=int, default=16384)
    parser.add_argument("--slope-from", type=int, default=2048)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "linear_attention.csv"))
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.clock == "auto":
        args.clock = "cpu" if device.type == "cpu" and args.threads == 1 else "wall"
    if args.clock == "cpu" and (device.type != "cpu" or args.threads != 1):
        parser.error("--clock cpu measures one CPU thread: use it with --device cpu --threads 1")
    lengths = sorted(args.lengths)
    methods = ["sdpa"] + [m for m in args.methods if m != "sdpa"]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, device {device}, "
          f"threads {args.threads}; batch {args.batch}, heads {args.heads}, head_dim {args.dim}, "
          f"chunk {args.chunk}, block {args.block}, float32, forward only, best of {args.rounds} x {args.repeats}, "
          f"{'CPU time of one thread' if args.clock == 'cpu' else 'wall-clock time'}")
    mem_kind = "measured (CUDA allocator)" if device.type == "cuda" else (
        "measured (peak RSS growth in a fresh process)" if args.memory == "measured" else "analytic")
    print(f"memory: {mem_kind}; 'largest' = largest intermediate from the shapes\n")

    cases = [(n, method) for n in lengths for method in methods]
    best = {case: float("nan") for case in cases}
    for round_ in range(args.rounds):
        for n, method in cases:
            if skip_reason(method, n, args):
                continue
            t = time_case(method, n, args, device)
            best[(n, method)] = t if round_ == 0 else min(best[(n, method)], t)
            print(f"  round {round_ + 1}/{args.rounds} n={n:6d} {method:10s} {t * 1e3:9.2f} ms",
                  file=sys.stderr, flush=True)

    rows, times = [], {m: [] for m in methods}
    for n, method in cases:
        reason = skip_reason(method, n, args)
        mem = float("nan")
        if not reason and (args.memory == "measured" or device.type == "cuda"):
            mem = peak_memory(method, n, args, device)
        times[method].append(best[(n, method)])
        rows.append(dict(n=n, method=method, time_s=best[(n, method)], peak_bytes=mem,
                         largest_bytes=largest_intermediate_bytes(method, n, args), note=reason))

    sdpa = times["sdpa"]
    header = f"{'n':>6s} {'method':10s} {'time ms':>10s} {'/ SDPA':>8s} {'peak MiB':>9s} {'largest MiB':>11s}  note"
    print(header)
    print("-" * len(header))
    for row in rows:
        i = lengths.index(row["n"])
        ratio = row["time_s"] / sdpa[i] if sdpa[i] == sdpa[i] else float("nan")
        row["ratio_to_sdpa"] = ratio
        t = "-" if row["note"] else f"{row['time_s'] * 1e3:10.2f}"
        r = "-" if row["note"] else f"{ratio:8.3f}"
        m = "-" if row["peak_bytes"] != row["peak_bytes"] else f"{row['peak_bytes'] / 2 ** 20:9.1f}"
        print(f"{row['n']:6d} {row['method']:10s} {t:>10s} {r:>8s} {m:>9s} "
              f"{row['largest_bytes'] / 2 ** 20:11.1f}  {row['note']}")

    print(f"\nlog-log slope of time vs n for n >= {args.slope_from} (1 = linear, 2 = quadratic), "
          "and crossover with SDPA:")
    summary = {}
    for method in methods:
        pick = [(n, t) for n, t in zip(lengths, times[method]) if n >= args.slope_from]
        slope = loglog_slope([p[0] for p in pick], [p[1] for p in pick])
        cross = "-" if method == "sdpa" else crossover(lengths, times[method], sdpa)
        summary[method] = (slope, cross)
        print(f"  {method:10s} slope {slope:5.2f}   faster than SDPA from n = {cross}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["n", "method", "time_s", "ratio_to_sdpa", "peak_bytes",
                                                "largest_bytes", "note", "slope", "crossover"])
        writer.writeheader()
        for row in rows:
            slope, cross = summary[row["method"]]
            writer.writerow({**row, "slope": f"{slope:.4f}", "crossover": cross})
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
