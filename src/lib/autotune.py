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

:func:`time_in_turns` is the timer underneath, also used by the chapters: the
candidates take turns within each round, so that a busy spell of the machine
falls on all of them rather than on one.

>>> pick = choose_fastest(("doc", 1), {"sum": lambda: sum(range(100)), "formula": lambda: 99 * 100 // 2}, fallback="sum")
>>> pick in ("sum", "formula") and autotune_decisions()[("doc", 1)] == pick
True
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Union

import torch

from ._validate import check_int, check_number

__all__ = ["AUTOTUNE_ENV", "autotune_enabled", "choose_fastest", "time_in_turns", "autotune_decisions",
           "clear_autotune_decisions", "length_bucket"]

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


_CLOCKS = {"wall": "perf_counter", "thread": "thread_time"}  # functions of the time module, looked up per call


def time_in_turns(candidates: Union[Mapping[Any, Callable[[], Any]], Sequence[Callable[[], Any]]], *,
                  rounds: int = 5, number: int = 1, warmup: bool = True, device: Any = None,
                  clock: str = "wall", threads: Optional[int] = None) -> Union[Dict[Any, List[float]], List[List[float]]]:
    """Seconds per call of each candidate, round by round, the candidates taking turns in every round.

    Timing one function after the other lets a busy spell of the machine (another
    program, a neighbour on a shared host) fall on one of them only; in turns it
    falls on all of them, so the best round of each, or a ratio taken within each
    round, holds on a busy machine too. Garbage collection is off while timing,
    as in :mod:`timeit`.

    >>> t = time_in_turns({"short": lambda: sum(range(10)), "long": lambda: sum(range(10**5))}, rounds=3)
    >>> [len(t["short"]), len(t["long"])], min(t["short"]) < min(t["long"])
    ([3, 3], True)

    Args:
        candidates: ``{name: run}`` or a sequence of ``run``, each called without arguments.
        rounds: how many rounds; in each, every candidate runs ``number`` times in a row.
        number: calls per candidate and round (the time is divided by it).
        warmup: one untimed call of each candidate first (caches, lazily built kernels).
        device: a CUDA device is synchronised before each reading of the clock.
        clock: ``"wall"`` (``time.perf_counter``: what a user waits) or ``"thread"``
            (``time.thread_time``: the CPU time of the calling thread only, which other
            programs disturb less; pair it with ``threads=1``, as it does not see torch's
            other threads, and not with a GPU, whose work it does not see).
        threads: torch's intra-op threads while timing (restored after); ``None`` leaves them.

    Returns:
        ``{name: [seconds per call in each round]}``, or a list of such lists in the
        order of ``candidates``.
    """
    named = isinstance(candidates, Mapping)
    runs = list(candidates.values()) if named else list(candidates)
    if not runs or not all(callable(run) for run in runs):
        raise ValueError("time_in_turns needs at least one candidate, each a function called without arguments")
    rounds, number = check_int("rounds", rounds), check_int("number", number)
    if clock not in _CLOCKS:
        raise ValueError(f"clock must be one of {tuple(_CLOCKS)}, got {clock!r}")
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as error:
            raise ValueError(f"device must be a torch.device or a device name such as 'cuda:0', got {device!r}") from error
    cuda = isinstance(device, torch.device) and device.type == "cuda"
    if cuda and clock == "thread":
        raise ValueError("clock='thread' does not see a GPU's work: time a CUDA device with clock='wall'")
    threads = None if threads is None else check_int("threads", threads)
    read = getattr(time, _CLOCKS[clock])
    before, gc_was_on = torch.get_num_threads(), gc.isenabled()
    seconds: List[List[float]] = [[] for _ in runs]
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        if warmup:
            for run in runs:
                run()
            _sync(device)
        gc.disable()
        for _ in range(rounds):
            for run, times in zip(runs, seconds):
                _sync(device)
                start = read()
                for _ in range(number):
                    run()
                _sync(device)
                times.append((read() - start) / number)
    finally:
        if gc_was_on:
            gc.enable()
        if threads is not None:
            torch.set_num_threads(before)
    return dict(zip(candidates.keys(), seconds)) if named else seconds


def choose_fastest(key: Hashable, candidates: Mapping[str, Callable[[], Any]], *, fallback: str,
           device: Any = None, repeats: int = 2, margin: float = 0.05) -> str:
    """The fastest of ``candidates`` for the shape class ``key``, timed on its first call, then remembered.

    The ``fallback`` (the caller's fixed rule) is kept unless another candidate
    beats it by more than ``margin`` (a fraction of its time): a few timed calls
    on a busy machine differ by a few percent from run to run, and a difference
    that small is not worth trading the rule's choice for.

    Args:
        key: the shape class (hashable): everything on which the fastest choice may depend.
        candidates: ``{name: run}``, each ``run()`` computing the same thing another way
            (on the caller's real inputs: what is timed is what will run).
        fallback: the name taken without timing: with one candidate, with timing
            off (``$POSENC_AUTOTUNE=0``), or when a candidate fails.
        device: synchronised around each timing (CUDA runs asynchronously).
        repeats: timed rounds after one warm-up call of each (:func:`time_in_turns`); the best counts.
        margin: how much faster than the fallback another candidate must be to replace it (0: the fastest wins).

    Returns:
        a name of ``candidates``.
    """
    if not candidates:
        raise ValueError("choose_fastest needs at least one candidate")
    if fallback not in candidates:
        raise ValueError(f"fallback {fallback!r} is not one of the candidates {sorted(candidates)}")
    repeats = check_int("repeats", repeats)
    margin = check_number("margin", margin)
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be a fraction in [0, 1), got {margin}")
    if len(candidates) == 1 or not autotune_enabled():
        return fallback
    with _LOCK:
        if key in _DECISIONS:
            return _DECISIONS[key]
    timings: Dict[str, float] = {name: float("inf") for name in candidates}
    working = {}
    for name, run in candidates.items():  # the warm-up call: one that fails is not a candidate here
        try:
            run()
            _sync(device)
            working[name] = run
        except (RuntimeError, MemoryError):  # e.g. out of memory on the stored-bias path
            pass
    if working:
        try:
            rounds = time_in_turns(working, rounds=repeats, warmup=False, device=device)
            timings.update({name: min(times) for name, times in rounds.items()})
        except (RuntimeError, MemoryError):  # failed on a later call: keep the fixed rule
            pass
    best = min(timings, key=lambda name: (timings[name], name != fallback))
    if timings[best] == float("inf") or timings[best] >= (1 - margin) * timings[fallback]:
        best = fallback  # nothing ran, or nothing measurably faster than the rule
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
