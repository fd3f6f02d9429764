"""Where a notebook's time goes: training, evaluating, and the rest, appended to ``$POSENC_COST_LOG``.

The book's build (``book/execute.py``) points ``POSENC_COST_LOG`` at one file
per notebook; :func:`accounted` wraps the library's training and evaluation
calls and appends one JSON line per outermost call: its kind, wall-clock
seconds, and core-seconds (user + system time of this process and of the
worker processes it waited for, so a set of runs trained by forked workers
counts every core it used). A call inside another accounted call (an
evaluation inside a training run, a run inside ``train_seeds``) is part of the
outer one and not written again. Without the variable nothing is measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Dict, Iterator, List

COST_LOG_ENV = "POSENC_COST_LOG"
_depth = [0]  # accounted calls open in this process (a forked worker inherits its parent's, and so writes nothing)


def _core_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@contextlib.contextmanager
def accounted(kind: str, **info: Any) -> Iterator[Dict[str, Any]]:
    """Measure the block as one ``kind`` (``"train"`` or ``"evaluate"``) call; yields a dict to add fields to."""
    path = os.environ.get(COST_LOG_ENV, "").strip()
    extra: Dict[str, Any] = dict(info)
    if not path or _depth[0]:
        yield extra
        return
    _depth[0] += 1
    wall, cores = time.perf_counter(), _core_seconds()
    try:
        yield extra
    finally:
        _depth[0] -= 1
        record = dict(kind=kind, wall_s=round(time.perf_counter() - wall, 4),
                      core_s=round(_core_seconds() - cores, 4), **extra)
        line = (json.dumps(record) + "\n").encode()
        try:  # one write of one short line with O_APPEND: whole, whatever else writes to the file
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:  # the log is a measurement, never a reason for a run to fail
            pass


def read_cost_log(path: "os.PathLike[str] | str") -> Dict[str, float]:
    """The totals of one log: ``runs`` trained, ``train_wall_s``, ``train_core_s``, ``evaluate_wall_s``, ``evaluate_core_s``.

    Lines that are not whole JSON records (a process killed mid-write) are skipped.
    """
    totals = dict(runs=0.0, train_wall_s=0.0, train_core_s=0.0, evaluate_wall_s=0.0, evaluate_core_s=0.0)
    records: List[Dict[str, Any]] = []
    try:
        text = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        return totals
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") in ("train", "evaluate"):
            records.append(record)
    for r in records:
        totals[f"{r['kind']}_wall_s"] += float(r.get("wall_s", 0.0))
        totals[f"{r['kind']}_core_s"] += float(r.get("core_s", 0.0))
        if r["kind"] == "train":
            totals["runs"] += float(r.get("runs", 0))
    return totals
