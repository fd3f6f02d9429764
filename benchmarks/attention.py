"""What position costs: attention with each position scheme, relative to fused causal SDPA.

For every scheme and length it measures forward time, forward+backward time
and peak memory of one multi-head causal attention call (queries and keys
already projected), each reported as a ratio to
``scaled_dot_product_attention(q, k, v, is_causal=True)`` measured in the same
run, plus a naive implementation (explicit scores, mask, softmax) for contrast.
Timings are repeated in ``--rounds`` rounds over every length (each the best
of ``--repeats`` calls, interleaved across schemes): a ratio is the median
over the rounds, and ``*_ratio_min`` / ``*_ratio_max`` give its spread, how
much a ratio moves from run to run on the machine.

========================  ====================================================
``causal SDPA``           the baseline: PyTorch's fused causal kernel, no position
``naive``                 ``softmax(q k^T / sqrt(d) + mask) v`` written out
``RoPE``, ``xPos``        cached cos/sin (and xPos scales) on q and k, then the baseline
``ALiBi``                 :func:`posenc.relative_attention` with the slopes (auto path)
``ALiBi, stored bias``    :func:`posenc.attention` with the ``(heads, n, n)`` bias
``KERPLE log/power``      :func:`posenc.relative_attention`, learned table per distance
``Sandwich``, ``T5 bias``     the same with their tables
``window 512``            :func:`posenc.relative_attention` with ``window=512``
``ReRoPE 512``            :func:`posenc.rerope_attention`, window 512 (rotations included)
``Self-Extend 4, 512``    :func:`posenc.self_extend_attention`, groups of 4, window 512
``FoX``                   :func:`posenc.forgetting_attention`, gates ``log sigmoid`` of
                          ``N(3, 1)`` per head and token (their gradient included)
``RoPE + SSMax``          RoPE, then queries times :func:`posenc.ssmax_factors` (``s`` learned), then
                          the baseline: Scalable-Softmax as the book trains it
``stick-breaking``        :func:`posenc.stick_breaking_attention` (explicit ``n x n``)
``CoPE``                  :func:`posenc.cope_attention`, 64 position embeddings (explicit ``n x n``)
========================  ====================================================

Stick-breaking and CoPE form several ``(heads, n, n)`` tensors (CoPE at
n = 4096, 8 heads: about 5 GiB forward, 9 GiB with the backward pass), so they
stop at ``--explicit-max`` (default 4096 on a CPU, 8192 on a GPU). A call that
takes longer than a second is repeated only as often as fits in two seconds
(at least twice): the best of a few multi-second calls is as steady as the best
of five short ones.

Memory is the peak of what one call allocates beyond its inputs: from the
CUDA allocator on a GPU; on a CPU from the peak resident size of a fresh
process per case, reset before the call (``peak_rss.py``; Linux only), so it
is approximate (allocator slack).

Usage::

    python benchmarks/attention.py                         # n = 512 ... 8192 (... 32768 on a GPU)
    python benchmarks/attention.py --lengths 1024 4096 --no-memory
    python benchmarks/attention.py --kernel-sets default avx2  # one CSV per CPU kernel set
    python benchmarks/attention.py --schemes FoX CoPE --update  # measure some schemes again, keep the other rows

Each row records the machine (CPU model, threads) and the CPU kernel set. The
rows ``ALiBi [key_bias]``, ``ALiBi [fold]``, ``ALiBi [chunked]``, ``Sandwich [chunked]`` and
``Sandwich [bias]`` force one path of :func:`posenc.relative_attention`; the
report compares the scheme's own row (path ``"auto"``, timed per shape class by
:mod:`posenc.autotune` unless ``POSENC_AUTOTUNE=0``) with the best of them.

Writes ``benchmarks/results/attention.csv`` (``--out``). The book's appendix
"What position costs" draws the measurements that ship with the library,
``src/lib/measured/attention-*.csv`` (package data, read by
:func:`posenc.measured_costs`), and before them any ``attention.csv`` or
``attention-*.csv`` in a folder ``benchmarks/measured/`` of the folder the
chapter runs in or one above it: copy the CSV there to see your machine's
(at the top of a checkout, for instance), or into ``src/lib/measured/`` to ship it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import posenc as pe

RESULTS = Path(__file__).resolve().parent / "results" / "attention.csv"
SCHEMES = ("causal SDPA", "naive", "RoPE", "xPos", "ALiBi", "ALiBi, stored bias",
           "KERPLE log", "KERPLE power", "Sandwich", "T5 bias", "window 512", "ReRoPE 512", "Self-Extend 4, 512",
           "FoX", "RoPE + SSMax", "stick-breaking", "CoPE",
           "ALiBi [key_bias]", "ALiBi [fold]", "ALiBi [chunked]", "Sandwich [chunked]", "Sandwich [bias]")
#: Schemes that form several ``(heads, n, n)`` tensors: measured up to ``--explicit-max`` only (naive: ``--naive-max``).
EXPLICIT = ("stick-breaking", "CoPE")
#: ``"<scheme> [path]"``: the scheme through one explicit path of :func:`posenc.relative_attention`,
#: to check that "auto" (the scheme's own row) is never much slower than the best of them.
PATH_ROWS = {s: s.split(" [")[0] for s in SCHEMES if s.endswith("]")}
HEADS, HEAD_DIM, BATCH = 8, 64, 1


def write_rows(path: Path, rows: List[Dict[str, Any]]) -> None:
    """Write ``rows`` as a CSV (columns: every key, in order of first appearance) whole or not at all.

    The rows go to a temporary file beside ``path`` that then replaces it, so
    an interrupted run leaves the earlier file, never half of a new one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(key for r in rows for key in r))
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def machine() -> str:
    """A short description of where this ran."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    return f"{name}, {threads} thread{'' if threads == 1 else 's'}"


def kernel_set() -> str:
    """The CPU kernels ATen dispatches to (``default``, ``avx2``, ``avx512``, ...): timings depend on them."""
    try:
        return torch.backends.cpu.get_cpu_capability().lower()
    except AttributeError:  # torch < 2.1
        return os.environ.get("ATEN_CPU_CAPABILITY", "unknown")


def make_case(scheme: str, n: int, device: torch.device, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """``fn(q, k, v) -> out`` for one scheme at length ``n``; tables are built (and cached) here, once."""
    if scheme in PATH_ROWS:
        base, path = PATH_ROWS[scheme], scheme.split("[")[1].rstrip("]")
        table = (pe.sandwich_bias(HEADS, 1, n, dim=HEAD_DIM, device=device)[:, 0].flip(-1).to(dtype)
                 if base == "Sandwich" else None)
        slopes = pe.alibi_slopes(HEADS).to(device) if base == "ALiBi" else None
        return lambda q, k, v: pe.relative_attention(q, k, v, slopes=slopes, distance_bias=table, path=path)
    if scheme == "causal SDPA":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if scheme == "naive":
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()

        def naive(q, k, v):
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return naive
    if scheme in ("RoPE", "xPos"):
        rotate = (pe.RotaryEmbedding(HEAD_DIM) if scheme == "RoPE" else pe.XPos(HEAD_DIM)).to(device)

        def rotated(q, k, v):
            q, k = rotate(q, k)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return rotated
    if scheme == "ALiBi":
        slopes = pe.alibi_slopes(HEADS).to(device)
        return lambda q, k, v: pe.relative_attention(q, k, v, slopes=slopes)
    if scheme == "ALiBi, stored bias":
        bias = pe.alibi_bias(HEADS, n, device=device).to(dtype)
        return lambda q, k, v: pe.attention(q, k, v, bias=bias)
    if scheme == "window 512":
        return lambda q, k, v: pe.relative_attention(q, k, v, window=512)
    if scheme == "ReRoPE 512":  # exact two-pass forms: one flash call per pass at inference on a CPU
        return lambda q, k, v: pe.rerope_attention(q, k, v, 512)
    if scheme == "Self-Extend 4, 512":
        return lambda q, k, v: pe.self_extend_attention(q, k, v, 4, 512)
    if scheme == "FoX":  # the gates' logs, one per head and token, learned in the model: their gradient is timed too
        log_forget = F.logsigmoid(3 + torch.randn(BATCH, HEADS, n, generator=torch.Generator().manual_seed(1)))
        log_forget = log_forget.to(device, dtype).requires_grad_()
        return lambda q, k, v: pe.forgetting_attention(q, k, v, log_forget)
    if scheme == "RoPE + SSMax":  # s learned per head (ones, as at initialisation): factors rebuilt at every call
        rotate = pe.RotaryEmbedding(HEAD_DIM).to(device)
        s = torch.ones(HEADS, device=device, dtype=dtype, requires_grad=True)

        def scalable(q, k, v):
            q, k = rotate(q, k)
            return F.scaled_dot_product_attention(q * pe.ssmax_factors(n, s), k, v, is_causal=True)
        return scalable
    if scheme == "stick-breaking":
        return lambda q, k, v: pe.stick_breaking_attention(q, k, v)
    if scheme == "CoPE":  # 64 position embeddings, learned
        embeddings = torch.randn(64, HEAD_DIM, generator=torch.Generator().manual_seed(2)).to(device, dtype)
        embeddings.requires_grad_()
        return lambda q, k, v: pe.cope_attention(q, k, v, embeddings)
    if scheme.startswith("KERPLE"):
        kernel = pe.KerpleBias(HEADS, kind=scheme.split()[1], generator=torch.Generator().manual_seed(0)).to(device)
        # learned: the table is rebuilt from r1, r2 at every call, as in training
        return lambda q, k, v: pe.relative_attention(q, k, v, distance_bias=kernel(1, n)[:, 0].flip(-1).to(dtype))
    if scheme == "Sandwich":
        table = pe.sandwich_bias(HEADS, 1, n, dim=HEAD_DIM, device=device)[:, 0].flip(-1).to(dtype)
        return lambda q, k, v: pe.relative_attention(q, k, v, distance_bias=table)
    if scheme == "T5 bias":
        t5 = pe.T5RelativeBias(HEADS, generator=torch.Generator().manual_seed(0)).to(device)
        return lambda q, k, v: pe.relative_attention(q, k, v, distance_bias=t5(1, n)[:, 0].flip(-1).to(dtype))
    raise ValueError(f"unknown scheme {scheme!r}; choose from {SCHEMES}")


def inputs(n: int, device: torch.device, dtype: torch.dtype, grad: bool, width: int = HEAD_DIM):
    g = torch.Generator().manual_seed(0)
    q, k, v, dy = (torch.randn(BATCH, HEADS, n, width, generator=g).to(device, dtype) for _ in range(4))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, dy


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds(fn: Callable[[], None], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def step(case, q, k, v, dy, backward: bool) -> Callable[[], None]:
    def forward():
        with torch.no_grad():
            case(q, k, v)

    def forward_backward():
        out = case(q, k, v)
        out.backward(dy)
        q.grad = k.grad = v.grad = None
    return forward_backward if backward else forward


def peak_memory_cuda(case, n, device, dtype, backward) -> float:
    q, k, v, dy = inputs(n, device, dtype, backward)
    step(case, q, k, v, dy, backward)()  # warm up (tables, compiled kernels)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(case, q, k, v, dy, backward)()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _memory_case(scheme: str, n: int, backward: bool) -> None:
    """Child process: print the peak resident memory (MiB) one call adds beyond its inputs."""
    import peak_rss  # beside this file

    device, dtype = torch.device("cpu"), torch.float32
    case = make_case(scheme, n, device, dtype)
    q, k, v, dy = inputs(n, device, dtype, backward)
    step(case, q, k, v, dy, backward)()  # the first call also loads code, starts threads, fills caches
    added = peak_rss.start()
    step(case, q, k, v, dy, backward)()
    print(json.dumps(added() / 2**20))


def peak_memory_cpu(scheme: str, n: int, backward: bool) -> Optional[float]:
    if not Path("/proc/self/clear_refs").exists():  # peak_rss resets the peak there (Linux)
        return None
    cmd = [sys.executable, __file__, "--_memory-case", scheme, str(n), str(int(backward))]
    # glibc returns every large block to the system when it is freed (a fixed mmap threshold, no trimming
    # slack): else the warm-up call's freed blocks stay resident and the measured call reuses them unseen
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()),
           "MALLOC_MMAP_THRESHOLD_": str(1 << 17), "MALLOC_TRIM_THRESHOLD_": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:  # report, keep the timings measured so far
        print(f"\nmemory of {scheme!r} at n={n} not measured:\n{done.stderr[-800:]}", file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def sdpa_width_cost(n: int, device: torch.device, backward: bool, repeats: int) -> float:
    """Time of causal SDPA with one more channel per head (ALiBi's fold) over that of ``HEAD_DIM`` channels."""
    best = {}
    for width in (HEAD_DIM, HEAD_DIM + 1):
        q, k, v, dy = inputs(n, device, torch.float32, backward, width)
        run = step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, dy, backward)
        run()
        best[width] = min(seconds(run, device) for _ in range(repeats))
    return best[HEAD_DIM + 1] / best[HEAD_DIM]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="sequence lengths (default 512..8192 on CPU, 512..32768 on CUDA)")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES, metavar="SCHEME")
    parser.add_argument("--repeats", type=int, default=5, help="timings per case and round (the best is kept)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over every length and scheme: the median ratio is reported, with its min and max")
    parser.add_argument("--naive-max", type=int, default=None,
                        help="skip the naive reference above this length (default 4096 CPU, 16384 CUDA)")
    parser.add_argument("--explicit-max", type=int, default=None,
                        help=f"skip {', '.join(EXPLICIT)} above this length "
                             "(default 4096 CPU, 8192 CUDA)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--update", action="store_true",
                        help="keep the rows of --out for schemes not measured now (their ratios are to the causal "
                             "SDPA of their own run, as these are to this run's), replace the others")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--kernel-sets", nargs="+", default=None, metavar="SET",
                        help="run once per CPU kernel set (ATEN_CPU_CAPABILITY: default, avx2, avx512), "
                             "each in a fresh process, writing attention-<set>.csv beside --out")
    parser.add_argument("--_memory-case", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1 or args.rounds < 1:
        parser.error("--repeats and --rounds must be at least 1")
    if args._memory_case:
        scheme, n, backward = args._memory_case
        _memory_case(scheme, int(n), bool(int(backward)))
        return

    if args.kernel_sets:
        forwarded, skip = [], False
        for arg in sys.argv[1:]:  # everything but --kernel-sets and its values, and --out
            if skip and arg.startswith("--"):
                skip = False
            if arg in ("--kernel-sets", "--out") or arg.startswith(("--kernel-sets=", "--out=")):
                skip = arg in ("--kernel-sets", "--out")
                continue
            if not skip:
                forwarded.append(arg)
        for name in args.kernel_sets:
            out = args.out.with_name(f"{args.out.stem}-{name}{args.out.suffix}")
            print(f"\n=== ATEN_CPU_CAPABILITY={name} -> {out}", flush=True)
            done = subprocess.run([sys.executable, __file__, *forwarded, "--out", str(out)],
                                  env={**os.environ, "ATEN_CPU_CAPABILITY": name})
            if done.returncode != 0:
                sys.exit(done.returncode)
        return

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = args.lengths or ([512, 1024, 2048, 4096, 8192] + ([16384, 32768] if device.type == "cuda" else []))
    naive_max = args.naive_max or (16384 if device.type == "cuda" else 4096)
    explicit_max = args.explicit_max or (8192 if device.type == "cuda" else 4096)

    def measured_at(scheme: str, n: int) -> bool:
        return not ((scheme == "naive" and n > naive_max) or (scheme in EXPLICIT and n > explicit_max))
    schemes = ["causal SDPA"] + [s for s in args.schemes if s != "causal SDPA"]
    where, kernels = machine(), kernel_set() if device.type == "cpu" else "cuda"
    print(f"{where}; CPU kernel set {kernels}; torch {torch.__version__}; {dtype}; batch {BATCH}, {HEADS} heads, "
          f"head_dim {HEAD_DIM}; attention paths {'timed per shape' if pe.autotune_enabled() else 'by fixed rule'}")

    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    total = args.rounds * len(lengths) * len(schemes)
    bar = tqdm(total=total, desc="cases") if tqdm else None
    rows: List[Dict[str, object]] = []
    # best[r, s, n, backward]: the best of `repeats` interleaved timings in round r. Rounds run one after
    # the other over every length, so that their spread shows how much a ratio moves from run to run.
    best: Dict[tuple, float] = {}
    too_big: set = set()  # (scheme, n) that ran out of GPU memory: left out of the CSV, said in the output
    out_of_memory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)

    def fits(call, scheme, n, what, timing=True):
        """``call()``, or None if it ran out of GPU memory (a timing: ``(scheme, n)`` is left out from then on)."""
        try:
            return call()
        except out_of_memory:
            if timing:
                too_big.add((scheme, n))
            print(f"\n{scheme} at n={n}: out of GPU memory ({what}); "
                  f"{'no timing at this length' if timing else 'not measured'}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            return None

    for r in range(args.rounds):
        for n in lengths:
            todo = [s for s in schemes if measured_at(s, n) and (s, n) not in too_big]
            cases = {}
            for s in todo:
                cases[s] = fits(lambda: make_case(s, n, device, dtype), s, n, "its tables")
            for backward in (False, True):
                todo = [s for s in todo if (s, n) not in too_big]
                q, k, v, dy = inputs(n, device, dtype, backward)
                steps = {s: step(cases[s], q, k, v, dy, backward) for s in todo}
                for s in todo:  # warm-up: caches, compiled kernels
                    fits(steps[s], s, n, "forward+backward" if backward else "forward")
                todo = [s for s in todo if (s, n) not in too_big]
                for s in todo:
                    best[r, s, n, backward] = float("inf")
                spent = dict.fromkeys(todo, 0.0)
                for repeat in range(args.repeats):  # interleaved, so that drifts hit every scheme alike
                    for s in todo:
                        if repeat >= 2 and spent[s] > 2.0:  # slow calls: as many as fit in 2 s, at least two
                            continue
                        took = seconds(steps[s], device)
                        spent[s] += took
                        best[r, s, n, backward] = min(best[r, s, n, backward], took)
            del cases, steps, q, k, v, dy
            if bar:
                bar.update(len(schemes))
    for n in lengths:
        for s in [s for s in schemes if measured_at(s, n) and (s, n) not in too_big]:
            row: Dict[str, object] = dict(scheme=s, n=n)
            for backward, name in ((False, "forward"), (True, "forward_backward")):
                times = [best[r, s, n, backward] for r in range(args.rounds)]
                ratios = sorted(best[r, s, n, backward] / best[r, "causal SDPA", n, backward] for r in range(args.rounds))
                row[f"{name}_ms"] = round(1e3 * min(times), 3)
                row[f"{name}_ratio"] = round(statistics.median(ratios), 4)
                row[f"{name}_ratio_min"], row[f"{name}_ratio_max"] = round(ratios[0], 4), round(ratios[-1], 4)
            if not args.no_memory:
                for backward, key in ((False, "forward_mib"), (True, "forward_backward_mib")):
                    if device.type == "cuda":
                        mib = fits(lambda: peak_memory_cuda(make_case(s, n, device, dtype), n, device, dtype, backward),
                                   s, n, "its peak memory", timing=False)
                    else:
                        mib = peak_memory_cpu(s, n, backward)
                    row[key] = None if mib is None else round(mib, 1)
            row.update(device=device.type, machine=where, kernel_set=kernels, dtype=str(dtype).replace("torch.", ""),
                       torch=torch.__version__, batch=BATCH, heads=HEADS, head_dim=HEAD_DIM, rounds=args.rounds)
            rows.append(row)
    if bar:
        bar.close()

    print(f"\n{'forward time / causal SDPA':28s}" + "".join(f"{n:>8d}" for n in lengths))
    for s in schemes:
        cells = {r["n"]: r for r in rows if r["scheme"] == s}
        print(f"{s:28s}" + "".join(f"{cells[n]['forward_ratio']:>8.2f}" if n in cells else f"{'-':>8s}"
                                   for n in lengths))
    print(f"\n{'forward+backward / causal':28s}" + "".join(f"{n:>8d}" for n in lengths))
    for s in schemes:
        cells = {r["n"]: r for r in rows if r["scheme"] == s}
        print(f"{s:28s}" + "".join(f"{cells[n]['forward_backward_ratio']:>8.2f}" if n in cells else f"{'-':>8s}"
                                   for n in lengths))
    if not args.no_memory:
        print(f"\n{'forward peak memory (MiB)':28s}" + "".join(f"{n:>8d}" for n in lengths))
        for s in schemes:
            cells = {r["n"]: r for r in rows if r["scheme"] == s}
            print(f"{s:28s}" + "".join(f"{cells[n]['forward_mib']:>8.0f}" if n in cells and cells[n]["forward_mib"]
                                       is not None else f"{'-':>8s}" for n in lengths))
    spread = [r[f"{name}_ratio_max"] - r[f"{name}_ratio_min"] for r in rows if r["scheme"] != "causal SDPA"
              for name in ("forward", "forward_backward")]
    if args.rounds > 1:
        print(f"\nspread of a ratio over {args.rounds} rounds (max - min): median {statistics.median(spread):.3f}, "
              f"largest {max(spread):.3f}")
    print()
    for base in dict.fromkeys(PATH_ROWS.values()):  # "auto" against the best explicit path of this run
        for n in lengths:
            auto = next((r for r in rows if r["scheme"] == base and r["n"] == n), None)
            paths = [r for r in rows if PATH_ROWS.get(r["scheme"]) == base and r["n"] == n]
            for name in ("forward", "forward_backward"):
                if auto and paths:
                    best = min(paths, key=lambda r: r[f"{name}_ms"])
                    slower = auto[f"{name}_ms"] / best[f"{name}_ms"] - 1
                    print(f"{base} auto at n={n}, {name}: {100 * slower:+.0f}% against the best path "
                          f"({best['scheme']}){'' if slower <= 0.05 else '  <-- more than 5% slower'}")
    for key, path in pe.autotune_decisions().items():
        if not (isinstance(key, tuple) and key[0] == "relative_attention"):  # another caller's choice, another key
            continue
        print(f"auto chose {path!r} for head_dim {key[4]}, lengths up to {key[5]}, "
              f"{'ALiBi' if key[7] else ''}{' + ' if key[7] and key[8] else ''}{'a table' if key[8] else ''}"
              f"{', a window' if key[9] else ''}, {'with' if key[-1] else 'no'} gradient")
    goals = {"ALiBi": 1.2, "RoPE": 1.1, "xPos": 1.1, "KERPLE log": 1.2, "KERPLE power": 1.2, "Sandwich": 1.2,
             "T5 bias": 1.2}
    probe = 4096 if 4096 in lengths else max(lengths)
    print()
    for s, goal in goals.items():
        for r in rows:
            if r["scheme"] == s and r["n"] == probe:
                for name in ("forward", "forward_backward"):
                    ok = "within" if r[f"{name}_ratio"] <= goal else "NOT within"
                    print(f"{s} at n={probe}: {name} {r[f'{name}_ratio']:.2f}x causal SDPA "
                          f"({r[f'{name}_ratio_min']:.2f}-{r[f'{name}_ratio_max']:.2f}; {ok} {goal}x)")
    alibi = next((r for r in rows if r["scheme"] == "ALiBi" and r["n"] == probe), None)
    if alibi and device.type == "cpu" and max(alibi["forward_ratio"], alibi["forward_backward_ratio"]) > goals["ALiBi"]:
        wider = [sdpa_width_cost(probe, device, backward, args.repeats) for backward in (False, True)]
        print(f"\nALiBi at n={probe} on these kernels ({kernels}): as a bias per key (path 'key_bias', where this "
              f"torch's CPU flash kernel takes a mask with its causal flag) it is causal SDPA plus one broadcast "
              f"addition per score; folded, it is causal SDPA with head_dim {HEAD_DIM + 1} (the bias as one more "
              f"channel), and that width alone takes {wider[0]:.2f}x the time of head_dim {HEAD_DIM} forward and "
              f"{wider[1]:.2f}x forward+backward, for {(HEAD_DIM + 1) / HEAD_DIM:.3f}x the arithmetic. The rest "
              "(the copies that add the channel, or the bias block the chunked path adds to every tile of scores) "
              "is not broken down here; 'auto' takes the faster path.")
    fixed = next((r for r in rows if r["scheme"] == "Sandwich" and r["n"] == probe), None)
    learned = [r for r in rows if r["scheme"] in ("KERPLE log", "KERPLE power", "T5 bias") and r["n"] == probe
               and r["forward_backward_ratio"] > goals[r["scheme"]]]
    if fixed and learned and device.type == "cpu":  # why: the same path with and without the table's gradient
        print(f"\nwhy the learned tables miss forward+backward at n={probe}: Sandwich runs the same chunked path "
              f"with a fixed table, {fixed['forward_backward_ratio']:.2f}x; "
              + ", ".join(f"{r['scheme']} {r['forward_backward_ratio']:.2f}x" for r in learned)
              + ". The difference is the table's gradient: it needs the score gradient dS, which PyTorch's fused "
                "CPU attention does not return, so posenc's own backward recomputes the weights and dS chunk by "
                "chunk with separate matrix products and element-wise passes over each block of scores (which "
                "the fused kernel keeps in its tiles).")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.update and args.out.exists():  # the rows of the schemes not measured now, in the file's order
        now = {r["scheme"] for r in rows if r["scheme"] != "causal SDPA"}
        with open(args.out, newline="") as f:
            kept = [r for r in csv.DictReader(f) if r["scheme"] not in now]
        if any(r["scheme"] == "causal SDPA" for r in kept):  # the file's baseline rows stay; this run's go
            rows = [r for r in rows if r["scheme"] != "causal SDPA"]
        rows = kept + rows
    write_rows(args.out, rows)
    print(f"\nwrote {args.out}; copy it to benchmarks/measured/ to see it in the book's appendix")


if __name__ == "__main__":
    main()
