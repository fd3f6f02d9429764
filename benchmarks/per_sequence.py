"""CoPE and stick-breaking attention on the CPU: a whole batch at once against one sequence at a time.

Both form ``(heads, n, n)`` tensors explicitly; ``posenc`` runs them one
sequence at a time on the CPU when no gradient is recorded
(:mod:`posenc._per_sequence`). This script times, for each length, one
forward pass over a batch both ways, and causal SDPA on the same inputs, and
prints each as a ratio to SDPA (best of ``--rounds``, one thread, CPU time of
the thread). No threshold is asserted: the numbers are the machine's.

    python benchmarks/per_sequence.py                 # batch 16, 4 heads of 16, n = 128 ... 1024
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import posenc as pe
import posenc._per_sequence as per_sequence


def best_time(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        fn()
        best = min(best, time.thread_time() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    embeddings = torch.randn(64, args.head_dim, generator=g)
    kinds = {"CoPE": lambda q, k, v: pe.cope_attention(q, k, v, embeddings),
             "stick-breaking": lambda q, k, v: pe.stick_breaking_attention(q, k, v)}
    print(f"batch {args.batch}, {args.heads} heads of {args.head_dim}, forward, time / causal SDPA (one thread)")
    print(f"{'n':>6s}" + "".join(f"{name + ', whole batch':>30s}{name + ', by sequence':>30s}" for name in kinds))
    split_at = per_sequence._MIN_SCORES
    with torch.no_grad():
        for n in args.lengths:
            q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, generator=g) for _ in range(3))
            sdpa = best_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), args.rounds)
            row = f"{n:6d}"
            for fn in kinds.values():
                per_sequence._MIN_SCORES = float("inf")                     # never split: the whole batch at once
                whole = best_time(lambda: fn(q, k, v), args.rounds)
                per_sequence._MIN_SCORES = 0                                 # always split
                split = best_time(lambda: fn(q, k, v), args.rounds)
                per_sequence._MIN_SCORES = split_at
                row += f"{whole / sdpa:30.1f}{split / sdpa:30.1f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
