"""Run the chapters that train models again, on other CPU kernels and other seeds, from an empty run cache.

A tiny model trained on another CPU, with another set of CPU kernels, or from
another seed ends at other numbers. The chapters state only claims that hold
over seeds, with margins taken from the seed spread; this check executes
every chapter that trains (its cells call ``pe.train`` or ``pe.train_seeds``)
under nbval with

* the other kernel set of this machine: ``ATEN_CPU_CAPABILITY=avx2`` when
  PyTorch's default here is something else (AVX-512, say), else ``default``
  (no vector kernels);
* ``POSENC_SEED=1`` (three seeds none of the default build used);
* a new, empty run cache (``POSENC_CACHE`` in a temporary folder, removed after),

``--jobs`` chapters at a time (pytest-xdist, each kernel with
``OMP_NUM_THREADS`` = cores / jobs); a run that two chapters train is trained
once (:func:`posenc.train` locks it while it trains) and loaded by the other,
as in the book's build. Usage::

    python book/evidence_check.py                # every training chapter
    python book/evidence_check.py 07 08          # chapters whose file names start so
    python book/evidence_check.py --seed 2 --kernels default
    python book/evidence_check.py --jobs 1       # one chapter after the other
    python book/evidence_check.py --list         # only print the chapters it would run
    make test-evidence

The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book"))
from execute import usable_cores  # noqa: E402  (the cores the kernels share, as the book's build counts them)


def training_chapters(prefixes=()) -> list:
    """The chapters (in file-name order) whose code cells train models, filtered by file-name prefixes."""
    found = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        if prefixes and not path.name.startswith(tuple(prefixes)):
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        if "pe.train(" in code or "pe.train_seeds(" in code:
            found.append(path)
    return found


def other_kernels() -> str:
    """``avx2`` where PyTorch's default CPU kernel set is another one, else ``default``."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    native = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                            check=True).stdout.strip().lower()
    return "default" if native == "avx2" else "avx2"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="file-name prefixes, e.g. 07 08 (default: every training chapter)")
    parser.add_argument("--seed", default="1", help="POSENC_SEED for the run (default 1)")
    parser.add_argument("--kernels", default=None,
                        help="ATEN_CPU_CAPABILITY for the run (default: the other kernel set of this machine)")
    parser.add_argument("--jobs", type=int, default=2, help="chapters executed at once (default 2)")
    parser.add_argument("--list", action="store_true",
                        help="print the chapters it would run (paths from the repository root), run nothing")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive integer, got {args.jobs}")
    if not args.seed.isdigit():
        parser.error(f"--seed must be a non-negative integer, got {args.seed!r}")
    chapters = training_chapters(args.chapters)
    if not chapters:
        parser.error(f"no chapter that trains models matches {args.chapters}")
    if args.list:
        print("\n".join(p.relative_to(ROOT).as_posix() for p in chapters))
        return 0
    kernels = args.kernels or other_kernels()
    with tempfile.TemporaryDirectory(prefix="posenc-evidence-") as cache:
        jobs = min(args.jobs, len(chapters))
        env = dict(os.environ, ATEN_CPU_CAPABILITY=kernels, POSENC_SEED=args.seed, POSENC_CACHE=cache,
                   POSENC_PROGRESS="0",  # no progress widgets: nbval reads no messages while a cell runs
                   POSENC_SIZE=os.environ.get("POSENC_SIZE", "small"),
                   OMP_NUM_THREADS=str(max(1, usable_cores() // jobs)))
        parallel = ["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else []
        names = " ".join(p.stem for p in chapters)
        print(f"evidence check: {names}\n  ATEN_CPU_CAPABILITY={kernels} POSENC_SEED={args.seed}, "
              f"empty run cache, {env['POSENC_SIZE']} mode, {jobs} at a time", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", "pytest", *map(str, chapters), "--nbval-lax",
                                "-p", "no:cacheprovider", "-ra", *parallel,
                                "--durations=0"], cwd=ROOT, env=env)
        print(f"evidence check: {'passed' if code == 0 else 'FAILED'} in {time.perf_counter() - start:.0f} s "
              f"(ATEN_CPU_CAPABILITY={kernels}, POSENC_SEED={args.seed})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
