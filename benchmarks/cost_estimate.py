"""How good is the line a training cell prints before it trains?

:func:`posenc.train_seeds` prints ``"N runs: M from the cache, K to train,
about T min on this device"`` before it trains, T from a probe of about ten
steps of the first run. This script trains one set of runs as a chapter does,
from an empty run cache of its own, and compares T with the time the set
then took:

* ``estimate_s``: T in seconds, as printed (to 5 seconds below a minute, to
  a tenth of a minute below ten minutes);
* ``measured_s``: the wall time of the whole ``train_seeds`` call, the probe
  included;
* ``ratio``: measured / estimate. The goal is within a factor of 2 either way.

The default set is chapter 7's: every scheme of its table, three seeds, the
running mode's preset on chapter 7's Markov chain, the workers that
``train_seeds`` chooses by itself. Time it on an idle machine: a figure
measured beside other work is not a figure.

Usage::

    python benchmarks/cost_estimate.py                       # chapter 7's set
    python benchmarks/cost_estimate.py --schemes rope alibi --steps 50

One row per call is appended to ``benchmarks/results/cost_estimate.csv``
(git-ignored), or to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

import torch

import posenc as pe
from attention import machine  # beside this file: the CPU model and threads (or the GPU's name)

RESULTS = Path(__file__).resolve().parent / "results" / "cost_estimate.csv"
CHAPTER_7 = ["none", "learned", "sinusoidal", "rope", "alibi", "kerple_power", "kerple_log", "sandwich", "xpos", "t5"]
_LINE = re.compile(r"(\d+) runs?: (\d+) from the cache, (\d+) to train, about (.+?) on this device")


def estimate_seconds(text: str) -> Optional[float]:
    """The estimate of the cost line in ``text``, in seconds; ``None`` when it prints none or only a bound.

    >>> estimate_seconds("30 runs: 0 from the cache, 30 to train, about 1.8 min on this device")
    108.0
    >>> estimate_seconds("3 runs: 0 from the cache, 3 to train, about 45 s on this device")
    45.0
    >>> estimate_seconds("3 runs: 0 from the cache, 3 to train, about a few seconds on this device") is None
    True
    """
    match = _LINE.search(text)
    if match is None:
        return None
    number = re.fullmatch(r"(\d+(?:\.\d+)?) (min|s)", match.group(4))
    if number is None:  # "a few seconds": a bound, not a number
        return None
    return float(number.group(1)) * (60 if number.group(2) == "min" else 1)


@contextlib.contextmanager
def _environment(**values: Optional[str]):
    """Set (or, for ``None``, remove) environment variables for the block, then put them back as they were."""
    def put(settings: Dict[str, Optional[str]]) -> None:
        for name, value in settings.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    before = {name: os.environ.get(name) for name in values}
    try:
        put(values)
        yield
    finally:
        put(before)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", nargs="+", default=CHAPTER_7, help="position schemes (default: chapter 7's table)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the preset's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"CSV to append to (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be a positive integer, got {args.steps}")

    P = pe.training_preset()
    task = pe.MarkovChain(vocab_size=8, order=2, alpha=0.1, seed=0)
    kwargs = dict(P.train_kwargs(), **({} if args.steps is None else dict(steps=args.steps, warmup=min(P.warmup, args.steps))))
    makers = {s: (lambda s=s: P.make_model(task.vocab_size, s)) for s in args.schemes}
    printed = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="posenc-estimate-") as cache, \
            _environment(POSENC_CACHE=cache, POSENC_STATIC=None, POSENC_PROGRESS="1"):  # an empty cache: all train
        start = time.perf_counter()
        with contextlib.redirect_stdout(printed):
            runs = pe.train_seeds(makers, task, **kwargs)
        measured = time.perf_counter() - start
    text = printed.getvalue()
    estimate = estimate_seconds(text)
    n_runs = sum(len(r) for r in runs.values())
    line = _LINE.search(text)
    print(line.group(0) if line else text.strip().splitlines()[0] if text.strip() else "(no cost line)")
    ratio = measured / estimate if estimate else float("nan")
    print(f"measured {measured:.0f} s for {n_runs} runs; estimate {estimate if estimate else float('nan'):.0f} s; "
          f"measured / estimate = {ratio:.2f} (goal: between 0.5 and 2)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new = not args.out.exists()
    with args.out.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["runs", "steps", "estimate_s", "measured_s", "ratio", "machine", "kernels", "mode", "torch"])
        writer.writerow([n_runs, kwargs["steps"], "" if estimate is None else f"{estimate:.0f}", f"{measured:.1f}",
                         f"{ratio:.3f}", machine(), torch.backends.cpu.get_cpu_capability().lower(), P.mode,
                         torch.__version__])
    return 0


if __name__ == "__main__":
    sys.exit(main())
