"""Choosing between exact implementations by timing them once, like cuDNN's benchmark mode.

Which of several exact ways to compute the same attention is fastest depends
on the machine: the CPU's kernel set (``torch.backends.cpu.get_cpu_capability()``),
its caches, the GPU. A threshold measured on one machine is a guess about every
other. :func:`choose_fastest` times the candidates on the first call of a *shape
class* (device, dtype, head size, a length bucket, what the bias is, whether a
gradient is needed: the caller's key) and keeps the fastest for the rest of the
process; later calls of that class cost a dictionary lookup.

The candidates must agree to their documented tolerances: the choice changes
rounding, never the result. ``POSENC_AUTOTUNE=0`` turns timing off: every call
then takes the caller's ``fallback``, a fixed rule, so that two runs on one
machine compute the same numbers in the same order.

>>> pick = choose_fastest(("doc", 1), {"sum": lambda: sum(range(100)), "formula": lambda: 99 * 100 // 2}, fallback="sum")
>>> pick in ("sum", "formula") and autotune_decisions()[("doc", 1)] == pick
True
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, Hashable, Mapping

import torch

__all__ = ["AUTOTUNE_ENV", "autotune_enabled", "choose_fastest", "autotune_decisions", "clear_autotune_decisions",
           "length_bucket"]

AUTOTUNE_ENV = "POSENC_AUTOTUNE"

_DECISIONS: Dict[Hashable, str] = {}
_TIMINGS: Dict[Hashable, Dict[str, float]] = {}
_LOCK = threading.Lock()


def autotune_enabled() -> bool:
    """False when ``$POSENC_AUTOTUNE`` is ``0``, ``false``, ``no`` or ``off`` (timing off: fixed rules)."""
    return os.environ.get(AUTOTUNE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def length_bucket(n: int) -> int:
    """The power of two at or above ``n``: lengths that share it share a decision."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a length must be an integer >= 1, got {n!r}")
    return 1 << (n - 1).bit_length()


def _sync(device: Any) -> None:
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(run: Callable[[], Any], device: Any, repeats: int) -> float:
    """Best of ``repeats`` timed calls of ``run``, after one untimed call (caches, compiled kernels)."""
    run()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def choose_fastest(key: Hashable, candidates: Mapping[str, Callable[[], Any]], *, fallback: str,
           device: Any = None, repeats: int = 2) -> str:
    """The fastest of ``candidates`` for the shape class ``key``, timed on its first call, then remembered.

    Args:
        key: the shape class (hashable): everything on which the fastest choice may depend.
        candidates: ``{name: run}``, each ``run()`` computing the same thing another way
            (on the caller's real inputs: what is timed is what will run).
        fallback: the name taken without timing: with one candidate, with timing
            off (``$POSENC_AUTOTUNE=0``), or when a candidate fails.
        device: synchronised around each timing (CUDA runs asynchronously).
        repeats: timed calls per candidate after one warm-up call; the best counts.

    Returns:
        a name of ``candidates``.
    """
    if not candidates:
        raise ValueError("choose_fastest needs at least one candidate")
    if fallback not in candidates:
        raise ValueError(f"fallback {fallback!r} is not one of the candidates {sorted(candidates)}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if len(candidates) == 1 or not autotune_enabled():
        return fallback
    with _LOCK:
        if key in _DECISIONS:
            return _DECISIONS[key]
    timings: Dict[str, float] = {}
    for name, run in candidates.items():
        try:
            timings[name] = _seconds(run, device, repeats)
        except (RuntimeError, MemoryError):  # e.g. out of memory on the stored-bias path: not a candidate here
            timings[name] = float("inf")
    best = min(timings, key=lambda name: (timings[name], name != fallback))
    if timings[best] == float("inf"):
        best = fallback
    with _LOCK:
        _DECISIONS.setdefault(key, best)
        _TIMINGS.setdefault(key, timings)
        return _DECISIONS[key]


def autotune_decisions(timings: bool = False) -> Dict[Hashable, Any]:
    """The choices made so far in this process: ``{key: name}``, or ``{key: (name, {name: seconds})}``."""
    with _LOCK:
        if timings:
            return {k: (v, dict(_TIMINGS.get(k, {}))) for k, v in _DECISIONS.items()}
        return dict(_DECISIONS)


def clear_autotune_decisions() -> int:
    """Forget every choice (the next call of each class times again); returns how many there were."""
    with _LOCK:
        count = len(_DECISIONS)
        _DECISIONS.clear()
        _TIMINGS.clear()
    return count
