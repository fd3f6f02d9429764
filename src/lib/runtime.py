"""Where and how big: the device, the running mode, seeds, and the cache folder.

* :func:`pick_device` chooses CUDA, then Apple MPS, then the CPU.
* :func:`running_mode` reads the ``POSENC_SIZE`` environment variable:
  ``small`` (seconds per model on a 2-core CPU; used by the tests and the book
  build) or ``full`` (bigger models and cleaner curves, opt-in). Unset, it is
  ``small`` on every device, a GPU included: the website's configuration, a
  few seconds per model.
* :func:`cache_dir` is where downloads and trained runs are kept.
* :func:`measured_costs` reads the benchmark measurements the book draws,
  shipped with the library, and a reader's own.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import random
import re
import uuid
from importlib import resources
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np
import torch

from ._validate import check_bool, check_int, one_of

__all__ = ["pick_device", "running_mode", "seed_everything", "cache_dir", "measured_costs", "SIZE_ENV"]

SIZE_ENV = "POSENC_SIZE"
_MODES = ("small", "full")


def pick_device() -> torch.device:
    """The fastest available device: ``cuda``, else ``mps``, else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def running_mode() -> str:
    """``"small"`` or ``"full"``, from ``$POSENC_SIZE``; ``"small"`` when it is unset.

    ``small`` is the default on every device, a GPU included: it gives the
    website's figures, and on a GPU a tiny model is bound by kernel launches,
    so each trains in seconds. ``full`` (about 3M parameters, 3000 steps of
    16,384 tokens a run) is opt-in: on an H200 it costs half a minute to two
    and a half minutes per model, and chapter 7 trains 51 of them.

    Raises:
        ValueError: if ``$POSENC_SIZE`` is set to anything else.
    """
    value = os.environ.get(SIZE_ENV, "").strip().lower()
    if not value:
        return "small"
    return one_of(f"${SIZE_ENV}", value, _MODES)


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator seeded the same way.

    ``seed`` is an integer in ``[0, 2**32)`` (NumPy's range); anything else raises ``ValueError``.
    """
    seed = check_int("seed", seed, low=0)
    if seed >= 2 ** 32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


_RESOLVED: Dict[str, Path] = {}  # POSENC_CACHE as given -> the absolute folder it meant when first used


def cache_dir(sub: str = "") -> Path:
    """``$POSENC_CACHE/sub`` if set, else ``~/.cache/posenc/sub`` (not created); always absolute.

    A relative ``POSENC_CACHE`` is resolved against the working directory of
    its first use, once, so that a later ``os.chdir`` does not move the cache.
    """
    root = os.environ.get("POSENC_CACHE", "").strip()
    if root:
        base = _RESOLVED.setdefault(root, Path(root).expanduser().absolute())
    else:
        base = Path.home() / ".cache" / "posenc"
    return base / sub if sub else base


class _RunBusy(Exception):
    """Raised by :func:`_exclusive` with ``wait=False`` when another process holds the lock."""


@contextlib.contextmanager
def _exclusive(path: Path, wait: bool = True) -> Iterator[None]:
    """Run the block holding an exclusive lock on the file ``path``: one process at a time.

    ``wait=False``: raise :class:`_RunBusy` at once instead of waiting for another holder.

    Two notebooks executed side by side that train the same run then train it
    once: the second waits for the first and loads what it saved. The lock file
    is created for the block and removed at its end; the operating system drops
    the lock when its holder ends, however it ends (a file left by a killed
    holder is simply locked again). Where files cannot be locked (no ``fcntl``,
    a read-only folder) the block runs unlocked: a run may then be trained
    twice, and is written atomically either way.
    """
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    fd = None
    while fcntl is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise _RunBusy(str(path)) from None
            try:
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break  # locked, and still the file at ``path``
            except FileNotFoundError:
                pass
        except OSError:  # a read-only folder, a file system without locks
            if fd is not None:
                os.close(fd)
            fd = None
            break
        os.close(fd)  # the holder before us removed it: lock the file at ``path`` now
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            try:
                os.unlink(path)  # before the release: whoever waits on this file tries again on a new one
            except OSError:
                pass
            os.close(fd)  # closing the descriptor releases the lock


def _stray_temporaries(path: Path) -> None:
    """Remove the temporary files in ``path``'s folder left by writers that died (their process is gone)."""
    for tmp in path.parent.glob("*.pt.tmp*"):
        pid = tmp.name.split(".pt.tmp", 1)[1].split(".")[0]
        alive = pid.isdigit() and int(pid) != os.getpid() and _process_alive(int(pid))
        if not alive:
            tmp.unlink(missing_ok=True)


def _atomic_save(obj: object, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` whole or not at all: a unique temporary file beside it, then a rename.

    Whatever stops it (a read-only folder, a full disk, Ctrl-C) removes the
    temporary file and is raised; temporaries left by writers that died are
    removed first (:func:`_stray_temporaries`).
    """
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _stray_temporaries(path)
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True



# Where a reader's own measurements go: a folder benchmarks/measured/ in the working directory or above it.
_OWN_MEASURED = Path("benchmarks", "measured")


def _is_measurement(name: str, kind: str) -> bool:
    return name == f"{kind}.csv" or name.startswith(f"{kind}-") and name.endswith(".csv")


def _csv_rows(text: str) -> List[Dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def measured_costs(kind: str = "attention", *, own: bool = True) -> Dict[str, List[Dict[str, str]]]:
    """The measurements of ``benchmarks/<kind>.py``: ``{source: rows}``, one entry per CSV file.

    The measurements the book draws ship with the library as package data
    (``posenc/measured/<kind>-*.csv``), so they are found wherever ``posenc``
    is installed, whatever the working directory. With ``own=True`` a reader's
    own measurements come first: the files ``<kind>.csv`` and ``<kind>-*.csv``
    in ``benchmarks/measured/`` of the working directory or, if it has none, of
    the nearest folder above it that has one (copy the CSV that
    ``benchmarks/attention.py`` writes there to see your machine's).

    Args:
        kind: the benchmark, the stem of its CSV files (``"attention"``).
        own: also read the reader's own files (default); ``False`` gives only
            the measurements shipped with the library.

    Returns:
        ``{source: rows}``, the reader's files first (keyed by their path),
        then the shipped ones (keyed ``"posenc/measured/<file name>"``), each
        group sorted by file name; ``rows`` as :class:`csv.DictReader` reads
        them, every value a string. Files without rows are left out.

    Raises:
        ValueError: if ``kind`` is not a plain name, or no file of that kind
            is found.

    >>> runs = measured_costs("attention", own=False)
    >>> list(runs)
    ['posenc/measured/attention-cpu.csv', 'posenc/measured/attention-h200.csv']
    >>> row = runs["posenc/measured/attention-cpu.csv"][0]
    >>> row["scheme"], row["n"], row["forward_ratio"]
    ('causal SDPA', '512', '1.0')
    """
    if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z0-9_]+", kind):
        raise ValueError(f"kind must be the name of a benchmark such as 'attention', got {kind!r}")
    own = check_bool("own", own)
    runs: Dict[str, List[Dict[str, str]]] = {}
    if own:
        cwd = Path.cwd()
        folder = next((root / _OWN_MEASURED for root in (cwd, *cwd.parents) if (root / _OWN_MEASURED).is_dir()), None)
        for path in sorted(folder.iterdir()) if folder is not None else []:
            if path.is_file() and _is_measurement(path.name, kind):
                runs[str(path)] = _csv_rows(path.read_text(encoding="utf-8"))
    shipped = resources.files(__package__ or "posenc") / "measured"
    kinds = set()
    if shipped.is_dir():
        for entry in sorted(shipped.iterdir(), key=lambda e: e.name):
            if entry.is_file() and entry.name.endswith(".csv"):
                kinds.add(re.split(r"[-.]", entry.name)[0])
                if _is_measurement(entry.name, kind):
                    runs[f"posenc/measured/{entry.name}"] = _csv_rows(entry.read_text(encoding="utf-8"))
    runs = {source: rows for source, rows in runs.items() if rows}
    if not runs:
        raise ValueError(f"no measurements of kind {kind!r}: the library ships {sorted(kinds) or 'none'}, and "
                         f"there is no {kind}.csv or {kind}-*.csv with rows in {_OWN_MEASURED.as_posix()}/ here")
    return runs
