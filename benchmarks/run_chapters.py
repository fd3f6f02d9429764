"""Execute chapters in a fresh kernel each and record how long each takes (any device, any mode).

The book's own build executes every chapter too; this script times them one by
one and keeps each executed notebook, which is what a GPU run needs::

    python benchmarks/run_chapters.py                      # every chapter, the mode of the machine
    POSENC_SIZE=full python benchmarks/run_chapters.py 07 08 --out _build/gpu

For each chapter (file-name prefixes; default: all of ``chapters/``) it writes
``<out>/<chapter>.ipynb`` with its outputs and appends a row to
``<out>/chapter_times.csv``: chapter, mode, device, seconds, status and the
first error, if any. A chapter that fails does not stop the others. The
exit status is 1 if any chapter failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def run(path: Path, timeout: int) -> tuple:
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    start, error = time.perf_counter(), ""
    try:
        client.execute()
    except Exception as err:  # report, go on with the next chapter
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()   # the kernel's traceback is coloured
        lines = text.splitlines()
        where = [line.strip() for line in lines if line.lstrip().startswith("--->")]   # the failing line
        error = f"{type(err).__name__}: {lines[-1] if lines else ''}{' at ' + where[-1] if where else ''}"[:300]
    return nb, time.perf_counter() - start, error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="file-name prefixes, e.g. 07 08 (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "chapter-runs")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args()
    import nbformat

    paths = sorted((ROOT / "chapters").glob("*.ipynb"))
    if args.chapters:
        paths = [p for p in paths if any(p.name.startswith(c) for c in args.chapters)]
        if not paths:
            parser.error(f"no chapter starts with {args.chapters}")
    args.out.mkdir(parents=True, exist_ok=True)
    mode = os.environ.get("POSENC_SIZE", "") or "auto"
    table = args.out / "chapter_times.csv"
    new = not table.exists()
    failed = 0
    with open(table, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["chapter", "mode", "device", "seconds", "status", "error"])
        for path in paths:
            nb, seconds, error = run(path, args.timeout)
            nbformat.write(nb, args.out / path.name)
            failed += bool(error)
            writer.writerow([path.stem, mode, device_name(), round(seconds, 1), "failed" if error else "ok", error])
            f.flush()
            print(f"{path.stem}: {'FAILED ' + error if error else 'ok'} in {seconds:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
