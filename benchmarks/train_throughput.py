"""Training throughput of the tiny model with each position scheme, relative to NoPE.

For every scheme of :data:`posenc.POSITION_SCHEMES` and every training
length it times full training steps (forward, backward, AdamW update; bf16
autocast on CUDA, as :func:`posenc.train` does) of the model of the running
mode's preset (:func:`posenc.training_preset`) and reports tokens per second
relative to the NoPE model (``position="none"``) measured in the same run.
Schemes are interleaved and each is timed ``--repeats`` times; the best
(least disturbed) time is kept.

Goal: ALiBi and RoPE within 10% of NoPE. NoPE runs the fused causal kernel of
``scaled_dot_product_attention``. The rotations (RoPE, xPos) add a fixed
handful of element-wise operations on q and k per layer, which weigh most on
the smallest models. The biases go through :func:`posenc.relative_attention`:
a small stored bias up to 128 queries, beyond that read per distance through
a strided view in query chunks (ALiBi folded into one extra channel of q and
k from 4096 queries with wide heads). For reference, Press et al. (2022,
Figure 2) report on a V100: sinusoidal 28.5k words/s, rotary 20.0k, T5 bias
14.4k, ALiBi 28.3k.

Usage::

    python benchmarks/train_throughput.py                   # preset sizes, L and 4L
    python benchmarks/train_throughput.py --lengths 64 512 --steps 20

Results go to ``benchmarks/results/train_throughput.csv`` (git-ignored), or to ``--out``.
Absolute numbers depend on the machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F

import posenc as pe
from attention import machine, write_rows  # beside this file: the GPU's name, or the CPU model and threads
from posenc.scheme import POSITION_SCHEMES

RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.csv"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
               opt: torch.optim.Optimizer, device: torch.device) -> float:
    """Seconds for ``steps`` training steps on one fixed batch."""
    use_bf16 = device.type == "cuda"
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["small", "full"], default=None,
                        help="model sizes (default: posenc.running_mode())")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="training lengths (default: L and 4L of the preset)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per batch (default: the preset's batch_size * L)")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per scheme (best kept)")
    parser.add_argument("--schemes", nargs="+", default=list(POSITION_SCHEMES), choices=POSITION_SCHEMES)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    preset = pe.training_preset(args.mode)
    device = pe.pick_device()
    lengths = args.lengths or [preset.seq_len, 4 * preset.seq_len]
    tokens = args.tokens or preset.batch_size * preset.seq_len
    schemes = ["none"] + [s for s in args.schemes if s != "none"]
    vocab = 256
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mode {preset.mode}: d_model {preset.d_model}, {preset.n_layers} layers, "
          f"{preset.n_heads} heads, {tokens} tokens per batch")

    rows: List[Dict[str, object]] = []
    for n in lengths:
        batch = max(1, tokens // n)
        g = torch.Generator().manual_seed(0)
        x = torch.randint(vocab, (batch, n), generator=g).to(device)
        y = torch.randint(vocab, (batch, n), generator=g).to(device)
        models, opts = {}, {}
        for s in schemes:
            torch.manual_seed(0)
            models[s] = preset.make_model(vocab, s, max_len_factor=max(1, -(-n // preset.seq_len))).to(device)
            opts[s] = torch.optim.AdamW(models[s].parameters(), lr=1e-4)
            time_steps(models[s], x, y, args.warmup, opts[s], device)
        best = {s: float("inf") for s in schemes}
        for _ in range(args.repeats):  # interleaved, so that drifts hit every scheme alike
            for s in schemes:
                best[s] = min(best[s], time_steps(models[s], x, y, args.steps, opts[s], device))
        for s in schemes:
            tps = args.steps * batch * n / best[s]
            rows.append(dict(scheme=s, length=n, batch=batch, tokens_per_s=round(tps, 1),
                             relative_to_nope=round(best["none"] / best[s], 4),
                             device=device.type, threads=torch.get_num_threads(),
                             mode=preset.mode, machine=machine(), torch=torch.__version__))

    print(f"\n{'scheme':14s}" + "".join(f"{'L=' + str(n):>20s}" for n in lengths))
    print(f"{'':14s}" + "".join(f"{'tokens/s  vs NoPE':>20s}" for _ in lengths))
    for s in schemes:
        cells = [r for r in rows if r["scheme"] == s]
        print(f"{s:14s}" + "".join(f"{r['tokens_per_s']:>11,.0f} {r['relative_to_nope']:>7.2f}x" for r in cells))
    for s in ("alibi", "rope"):
        for r in rows:
            if r["scheme"] == s:
                verdict = "within" if r["relative_to_nope"] >= 0.9 else "NOT within"
                print(f"{s} at L={r['length']}: {r['relative_to_nope']:.2f}x NoPE ({verdict} the 10% goal)")

    write_rows(args.out, rows)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
