"""Execute the book's notebooks side by side, into the cache that ``jupyter-book build`` reads.

``jupyter-book build`` executes one notebook after the other, and a tiny
model trains on one CPU thread: on a 2-core machine half of it waits. This
script runs ``--jobs`` notebooks at once (each kernel with
``OMP_NUM_THREADS`` = cores / jobs), each exactly as the build would (in its
own folder, the build's timeout, no errors allowed), and stores every
notebook that succeeds in the build's execution cache
(``_build/.jupyter_cache-<mode>...``, the folder the build's extension
chooses for this environment), where the build then finds it and executes
nothing again. Two chapters that train the same run do not train it twice:
:func:`posenc.train` locks each run of the run cache while it trains.

Each notebook's cost is written to ``_build/build_cost.csv`` (``--costs``
to write it elsewhere): its wall-clock seconds, the runs it trained, the
core-seconds of training and of evaluation (measured by the library through
``POSENC_COST_LOG``, :mod:`posenc._costs`), the rest of its time, and the
machine, CPU kernel set, mode and seed block it ran on.

A notebook whose cells raise is not stored; the script prints its error and
exits with status 1 after the others have run. Notebooks already in the
cache (their code unchanged) are skipped. The longest ones start first (the
times of their last execution, when the cache has them; else those of the
committed cost tables, ``benchmarks/build_cost-*.csv``; else the chapters
that train models, later chapters first). Usage::

    python book/execute.py                 # every notebook of the table of contents
    python book/execute.py --jobs 1        # one at a time
    python book/execute.py 07 08           # chapters whose file names start so
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
LIB = Path(__file__).resolve().parents[1] / "src" / "lib"  # posenc's sources in this checkout


def build_cache() -> Path:
    """The build's execution cache for this environment (one per mode, seed and CPU kernel set)."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from posenc_book import execution_cache_name
    finally:
        sys.path.pop(0)
    return ROOT / "_build" / execution_cache_name(".jupyter_cache")


def book_notebooks(prefixes=()) -> list:
    """The ``.ipynb`` files listed in ``_toc.yml``, in its order, filtered by file-name prefixes."""
    files = re.findall(r"^\s*-?\s*(?:file|root):\s*(\S+)\s*$",
                       (ROOT / "_toc.yml").read_text(encoding="utf-8"), flags=re.M)
    found = [ROOT / f"{name}.ipynb" for name in files if (ROOT / f"{name}.ipynb").is_file()]
    return [p for p in found if not prefixes or p.name.startswith(tuple(prefixes))]


def execution_settings() -> dict:
    """The build's ``timeout`` and ``allow_errors`` (``_config.yml``'s ``execute`` section)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8")) or {}
    execute = config.get("execute") or {}
    return dict(timeout=execute.get("timeout", 30), allow_errors=bool(execute.get("allow_errors", False)))


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container or ``taskset`` may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def committed_seconds() -> dict:
    """Each notebook's wall-clock seconds in the committed cost tables (``benchmarks/build_cost-*.csv``; the
    newest measurement where several tables have it), by its path relative to the repository root: what the
    schedulers here start first on a fresh clone."""
    newest: dict = {}
    for table in sorted((ROOT / "benchmarks").glob("build_cost-*.csv")):
        with table.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    measured = (str(row["date"]), float(row["seconds"]))
                except (KeyError, TypeError, ValueError):
                    continue
                newest[row["notebook"]] = max(measured, newest.get(row["notebook"], measured))
    return {notebook: seconds for notebook, (_, seconds) in newest.items()}


def longest_first(paths, last_time=None) -> list:
    """``paths`` ordered to start the longest first (their ``last_time`` by resolved path where given, else
    the committed cost tables, else: the chapters that train models, later chapters first), so that two
    workers taking the next one in turn end close together."""
    last_time, committed = last_time or {}, committed_seconds()

    def expected(order_path):
        order, path = order_path
        known = last_time.get(str(path.resolve()))
        if known is None:
            known = committed.get(path.resolve().relative_to(ROOT).as_posix())
        if known is None:
            known = 1e6 + order if _trains(nbformat.read(path, as_version=4)) else order
        return -known

    return [path for _, path in sorted(enumerate(paths), key=expected)]


def _trains(nb) -> bool:
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return "pe.train(" in code or "pe.train_seeds(" in code


def _poll_in_slices() -> None:
    """Make jupyter_client wait for a kernel's reply in half-second slices.

    Its asynchronous poll can miss a reply that has already arrived and sleep
    until the cell's whole timeout (seen with ipykernel 7 and pyzmq 27 after widget
    cells, and when two kernels run side by side): the cell then fails, or passes a
    timeout later. ``colab_check.py`` runs this function's source in its environment.
    """
    from queue import Empty

    from jupyter_client.channels import AsyncZMQSocketChannel

    get_msg = AsyncZMQSocketChannel.get_msg
    if getattr(get_msg, "_in_slices", False):
        return

    async def sliced_get_msg(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
            try:
                return await get_msg(self, timeout=step)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    sliced_get_msg._in_slices = True
    AsyncZMQSocketChannel.get_msg = sliced_get_msg


SLOW_CELL = 60  # seconds: cells that take longer are named in the output, to see where a build's time goes


def _cost_log_reader():
    """``posenc._costs.read_cost_log``, loaded from this checkout without importing torch."""
    spec = importlib.util.spec_from_file_location("posenc_costs", LIB / "_costs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_cost_log


COST_COLUMNS = ["notebook", "seconds", "runs_trained", "train_core_s", "evaluate_core_s", "rest_s", "threads",
                "machine", "kernels", "mode", "seed", "torch", "date"]


def machine_facts() -> dict:
    """The CPU's model name, PyTorch's CPU kernel set here (``ATEN_CPU_CAPABILITY`` applied) and its version."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability().lower(), torch.__version__)"
    try:
        kernels, version = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                          check=True).stdout.split()
    except (subprocess.CalledProcessError, ValueError, OSError):
        kernels, version = "unknown", "unknown"
    return dict(machine=f"{model}, {usable_cores()} cores", kernels=kernels, torch=version,
                mode=os.environ.get("POSENC_SIZE", "") or "small", seed=os.environ.get("POSENC_SEED", "") or "0",
                date=datetime.date.today().isoformat())


def cost_row(name: str, seconds: float, totals: dict, threads: int, facts: dict) -> dict:
    """One row of the cost table: the rest is the notebook's time not spent training or evaluating."""
    rest = max(0.0, seconds - totals["train_wall_s"] - totals["evaluate_wall_s"])
    return dict(notebook=name, seconds=f"{seconds:.1f}", runs_trained=int(totals["runs"]),
                train_core_s=f"{totals['train_core_s']:.1f}", evaluate_core_s=f"{totals['evaluate_core_s']:.1f}",
                rest_s=f"{rest:.1f}", threads=threads, **facts)


def write_costs(path: Path, rows: list) -> None:
    """Write the cost table whole (a temporary file renamed over it: never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", newline="", dir=path.parent, suffix=".tmp", delete=False) as f:
        writer = csv.DictWriter(f, fieldnames=COST_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # as a file written by open(), not the temporary file's 0600
    os.replace(f.name, path)


def _forget_exit_cleanup(exc: BaseException) -> None:
    """Drop the exit hook that nbclient left for a kernel that failed to start.

    nbclient has already cleaned that kernel up, and at interpreter exit its hook would fail
    with an ``AssertionError`` that reads like a failure of the build.
    """
    import atexit

    from nbclient import NotebookClient

    tb = exc.__traceback__
    while tb is not None:
        client = tb.tb_frame.f_locals.get("self")
        if isinstance(client, NotebookClient):
            atexit.unregister(client._cleanup_kernel)
        tb = tb.tb_next


KERNEL_STARTS = 3  # tries per notebook when its kernel dies before running a cell


def _execute(path: str, settings: dict, threads: int, cost_log: str = "") -> tuple:
    """Run one notebook (in a worker process); returns ``(path, notebook, seconds, error text or None)``.

    A kernel that dies before its first cell is started again, up to ``KERNEL_STARTS`` times: kernels
    started side by side in separate processes each pick free TCP ports, and two can pick the same
    one (``zmq.error.ZMQError: Address already in use``). Any other failure is returned as the
    notebook's error text, never raised, so that the notebooks beside it still finish and are cached.
    """
    from jupyter_cache.executors.utils import single_nb_execution

    _poll_in_slices()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by the kernel
    if cost_log:
        os.environ["POSENC_COST_LOG"] = cost_log  # the library appends its training and evaluation times there
    name, started, began = Path(path).name, {}, time.perf_counter()

    def on_start(cell_index, **_):
        started[cell_index] = time.perf_counter()
        cells_started.append(cell_index)

    def on_done(cell_index, **_):
        seconds = time.perf_counter() - started.pop(cell_index, time.perf_counter())
        if seconds >= SLOW_CELL:
            print(f"execute: {name} cell {cell_index}: {seconds:.0f} s", flush=True)

    for attempt in range(1, KERNEL_STARTS + 1):
        nb, cells_started = nbformat.read(path, as_version=4), []
        try:
            result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=settings["timeout"],
                                         allow_errors=settings["allow_errors"], meta_override=True,
                                         on_cell_start=on_start, on_cell_executed=on_done)
        except Exception as exc:  # the kernel died or never started; a cell's own error is in result.err
            _forget_exit_cleanup(exc)
            if not cells_started and attempt < KERNEL_STARTS:
                print(f"execute: {name}: the kernel died before its first cell ({exc}); "
                      f"starting another ({attempt + 1} of {KERNEL_STARTS})", flush=True)
                continue
            return path, nb, time.perf_counter() - began, traceback.format_exc()
        return path, result.nb, result.time, result.exc_string if result.err is not None else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="file-name prefixes, e.g. 07 08 (default: every notebook)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    parser.add_argument("--costs", type=Path, default=None,
                        help="where to write the cost of each notebook (default: _build/build_cost.csv)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive integer, got {args.jobs}")
    notebooks = book_notebooks(args.chapters)
    if not notebooks:
        parser.error(f"no notebook of the table of contents matches {args.chapters}")

    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(build_cache()))
    last_time = {}
    for record in cache.list_cache_records():
        seconds = (record.data or {}).get("execution_seconds")
        if record.uri and seconds is not None:
            uri = str(Path(record.uri).resolve())
            last_time[uri] = max(float(seconds), last_time.get(uri, 0.0))
    todo = []
    for path in notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            todo.append(path)
    todo = longest_first(todo, last_time)
    skipped = len(notebooks) - len(todo)
    if not todo:
        print(f"execute: all {len(notebooks)} notebooks are in the execution cache", flush=True)
        return 0
    threads = max(1, usable_cores() // args.jobs)
    print(f"execute: {len(todo)} notebook{'s' * (len(todo) != 1)}, {args.jobs} at a time, {threads} thread(s) each"
          + (f" ({skipped} already in the cache)" if skipped else ""), flush=True)
    settings = execution_settings()
    failed, start, costs = [], time.perf_counter(), []
    read_cost_log, facts = _cost_log_reader(), machine_facts()
    with tempfile.TemporaryDirectory(prefix="posenc-costs-") as logs, \
            ProcessPoolExecutor(max_workers=min(args.jobs, len(todo))) as pool:
        log_of = {str(path): os.path.join(logs, f"{i}.jsonl") for i, path in enumerate(todo)}
        futures = {pool.submit(_execute, str(path), settings, threads, log_of[str(path)]): str(path) for path in todo}
        for future in as_completed(futures):
            try:
                path, nb, seconds, error = future.result()
            except Exception as exc:  # the worker process itself died (killed, out of memory): its time is unknown
                path, nb, seconds, error = futures[future], None, math.nan, repr(exc)
            name = Path(path).relative_to(ROOT).as_posix()
            costs.append(cost_row(name, seconds, read_cost_log(log_of[path]), threads, facts))
            if error is not None:
                failed.append(name)
                print(f"execute: {name} FAILED after {seconds:.0f} s\n{error}", flush=True)
                continue
            stage = cache.add_nb_to_project(path)
            cache.cache_notebook_bundle(CacheBundleIn(nb, stage.uri, data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            row = costs[-1]
            print(f"execute: {name} in {seconds:.0f} s ({row['runs_trained']} runs trained: "
                  f"{row['train_core_s']} core-s training, {row['evaluate_core_s']} evaluating)", flush=True)
    order = {Path(p).relative_to(ROOT).as_posix(): i for i, p in enumerate(notebooks)}
    costs.sort(key=lambda row: order.get(row["notebook"], len(order)))
    out = args.costs or ROOT / "_build" / "build_cost.csv"
    write_costs(out, costs)
    print(f"execute: {len(todo) - len(failed)} of {len(todo)} notebooks executed and cached in "
          f"{time.perf_counter() - start:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
          + f"; their costs in {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
