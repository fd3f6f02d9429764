"""Run the chapters that train models again, on other CPU kernels and other seeds, from an empty run cache.

A tiny model trained on another CPU, with another set of CPU kernels, or from
another seed ends at other numbers. The chapters state only claims that hold
over seeds, with margins taken from the seed spread; this check executes
every chapter that trains (its cells call ``pe.train`` or ``pe.train_seeds``)
under nbval with

* the other kernel set of this machine: ``ATEN_CPU_CAPABILITY=avx2`` when
  PyTorch's default here is something else (AVX-512, say), else ``default``
  (no vector kernels), if it costs at most ``MAX_SLOWDOWN`` times the native
  kernels' time on a probe measured here first (a few training steps and one
  long forward pass of a small-mode model, each set timed twice in turns).
  PyTorch's scalar ``default`` set, the only other one of an AVX2-only CPU,
  took 2.2 times the native time on the probe of an idle AMD EPYC without
  AVX-512 (its long forward pass 2.6 to 2.9 times: ``exp`` is scalar there),
  and the check 38 minutes (2269 s), which put CI past 80: there the check
  keeps the native kernels and moves the seeds only (18 minutes, 1081 s), and
  says so; the kernel-set comparison is left to machines with AVX-512
  (``--kernels default`` forces it);
* ``POSENC_SEED=1`` (three seeds none of the default build used);
* a new, empty run cache (``POSENC_CACHE`` in a temporary folder, removed after),

``--jobs`` chapters at a time (pytest-xdist, each kernel with
``OMP_NUM_THREADS`` = cores / jobs); a run that two chapters train is trained
once (:func:`posenc.train` locks it while it trains) and loaded by the other,
as in the book's build. Usage::

    python book/evidence_check.py                # every training chapter
    python book/evidence_check.py 07 08          # chapters whose file names start so
    python book/evidence_check.py --seed 2 --kernels default   # a kernel set, whatever it costs
    python book/evidence_check.py --kernels native            # this machine's own kernels
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
from execute import longest_first, usable_cores  # noqa: E402  (as the book's build counts cores and orders notebooks)


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


def native_kernels() -> str:
    """PyTorch's own CPU kernel set on this machine (``avx512``, ``avx2``, ``default``, ...), lower case."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().lower()


def other_kernels() -> str:
    """``avx2`` where PyTorch's default CPU kernel set is another one, else ``default``."""
    return "default" if native_kernels() == "avx2" else "avx2"


#: The other kernel set is used when it costs at most this many times the native set's time on the probe.
MAX_SLOWDOWN = 1.5

# A small-mode model: 20 training steps, then one forward pass at 16 L (what the chapters' evaluations cost).
_PROBE = """
import time, torch, posenc as pe
torch.set_num_threads(1)
P = pe.training_preset("small")
data = pe.MarkovChain(vocab_size=16, order=2, seed=0)
model = P.make_model(16, "alibi")
kw = dict(P.train_kwargs(), steps=20, warmup=2)
pe.train(model, data, cache=False, progress=False, **kw)
start = time.perf_counter()
pe.train(model, data, cache=False, progress=False, **kw)
x = torch.randint(0, 16, (P.eval_batch_size, 16 * P.seq_len))
with torch.no_grad():
    model(x)
print(time.perf_counter() - start)
"""


def probe_seconds(kernels: str) -> float:
    """Seconds of the probe (:data:`_PROBE`) on one thread under ``ATEN_CPU_CAPABILITY=kernels``."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=kernels, OMP_NUM_THREADS="1", POSENC_PROGRESS="0")
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"the kernel probe failed under ATEN_CPU_CAPABILITY={kernels}:\n{out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def choose_kernels(measure=probe_seconds, rounds: int = 2) -> tuple:
    """The kernel set of the check and the reason, decided by measurement on this machine.

    The other set (:func:`other_kernels`) when its probe takes at most
    :data:`MAX_SLOWDOWN` times the native set's (the fastest of ``rounds``
    turns each, so that a busy moment does not decide), else the native set.
    Returns ``(kernels, reason)``.
    """
    native, other = native_kernels(), other_kernels()
    times: dict = {native: [], other: []}
    for _ in range(rounds):
        for kernels in (native, other):
            times[kernels].append(measure(kernels))
    ratio = min(times[other]) / min(times[native])
    if ratio <= MAX_SLOWDOWN:
        return other, f"the other kernel set, {other}, took {ratio:.2f}x the native {native} on the probe"
    return native, (f"the other kernel set, {other}, took {ratio:.2f}x the native {native} on the probe "
                    f"(more than {MAX_SLOWDOWN}x): the native kernels, other seeds only")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="file-name prefixes, e.g. 07 08 (default: every training chapter)")
    parser.add_argument("--seed", default="1", help="POSENC_SEED for the run (default 1)")
    parser.add_argument("--kernels", default=None,
                        help="ATEN_CPU_CAPABILITY for the run, or 'native' (default: the other kernel set of this "
                             f"machine where it costs at most {MAX_SLOWDOWN}x the native one on a probe, else native)")
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
    if args.kernels == "native":
        kernels, why = native_kernels(), "asked for"
    elif args.kernels:
        kernels, why = args.kernels, "asked for"
    else:
        kernels, why = choose_kernels()
    print(f"evidence check: ATEN_CPU_CAPABILITY={kernels} ({why})", flush=True)
    with tempfile.TemporaryDirectory(prefix="posenc-evidence-") as cache:
        jobs = min(args.jobs, len(chapters))
        env = dict(os.environ, ATEN_CPU_CAPABILITY=kernels, POSENC_SEED=args.seed, POSENC_CACHE=cache,
                   POSENC_PROGRESS="0",  # no progress widgets: nbval reads no messages while a cell runs
                   POSENC_SIZE=os.environ.get("POSENC_SIZE", "small"),
                   OMP_NUM_THREADS=str(max(1, usable_cores() // jobs)))
        # The longest chapters first, in this order (xdist would otherwise order them by their number of cells):
        # with two workers taking the next in turn, the check then ends about when the chapters' time, shared
        # out, does (in file-name order the last chapter, the longest, ran alone for minutes).
        chapters = longest_first(chapters)
        parallel = ["-n", str(jobs), "--dist", "loadfile", "--no-loadscope-reorder"] if jobs > 1 else []
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
