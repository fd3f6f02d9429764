"""Evidence that holds on any machine: seeds, their spread, and numbers quoted from the run.

A tiny model trained once gives one number. Another seed, another CPU or
another set of CPU kernels (``ATEN_CPU_CAPABILITY``) rounds in another order
and trains to another number. The book therefore compares schemes only over
several seeds, reports the mean with the min-max range, states an ordering
only where the ranges separate, and quotes numbers from the run itself:

* :func:`seed_offset` reads ``$POSENC_SEED`` (default 0); :func:`seeds` gives
  the training seeds of a comparison and :func:`evaluation_seed` the seed of
  the evaluation batches, both moved by it, so anyone can rerun a chapter on
  other seeds.
* :func:`train_seeds` trains one configuration on every seed (cached like any
  :func:`~posenc.train` run); :func:`per_seed` runs any measurement per seed
  (side by side on a CPU), :func:`spread` aggregates per-seed results, leaf
  by leaf, into :class:`Spread` values (mean, min, max), and
  :func:`over_seeds` does both.
* :func:`separated` says whether two ranges separate, the first condition
  for a verdict (:func:`posenc.judge` weighs the others); :func:`glue` hands
  a number to the page's prose (myst-nb's ``{glue:text}`` role) and returns
  its text.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ._costs import accounted
from ._validate import check_int
from .runtime import _RunBusy, pick_device
from .train import (_SET_BAR, TrainResult, _busy_runs_raise, _plan, _progress_bar, _progress_shown, _run,
                    train)

__all__ = ["SEED_ENV", "seed_offset", "seeds", "evaluation_seed", "Spread", "spread", "per_seed", "over_seeds",
           "train_seeds", "separated", "glue"]

SEED_ENV = "POSENC_SEED"
#: The evaluation batches' seed at ``$POSENC_SEED = 0`` (the default of :func:`posenc.evaluate_lengths`).
EVALUATION_SEED = 1234


def seed_offset() -> int:
    """``$POSENC_SEED`` as an integer >= 0 (0 when unset).

    Raises:
        ValueError: if the variable is set to anything but a non-negative integer.
    """
    value = os.environ.get(SEED_ENV, "").strip()
    if not value:
        return 0
    if not value.isdigit():
        raise ValueError(f"${SEED_ENV} must be a non-negative integer, got {value!r}")
    return int(value)


def seeds(count: int = 3) -> List[int]:
    """The training seeds of a comparison: ``count`` consecutive seeds, block ``$POSENC_SEED``.

    Block ``k`` is ``k * count, ..., k * count + count - 1``, so that
    ``POSENC_SEED=1`` gives seeds that ``POSENC_SEED=0`` did not use.

    >>> seeds(3)  # with POSENC_SEED unset
    [0, 1, 2]
    """
    count = check_int("count", count, 1)
    first = seed_offset() * count
    return list(range(first, first + count))


def evaluation_seed() -> int:
    """The seed of the evaluation batches: 1234 plus ``$POSENC_SEED``.

    Pass it as ``seed=`` to :func:`~posenc.evaluate_lengths` and
    :func:`~posenc.evaluation_batches`; every model of a comparison is then
    evaluated on the same sequences, and another ``POSENC_SEED`` draws others.
    """
    return EVALUATION_SEED + seed_offset()


Number = Union[int, float]


@dataclass(frozen=True)
class Spread:
    """A quantity measured once per seed: its ``values``, ``mean``, ``low`` (min) and ``high`` (max).

    ``format(s, ".3f")`` and ``str(s)`` give ``"mean (low–high)"``, the form
    the book's tables and prose use; comparisons of two spreads go through
    :func:`separated` or :meth:`below`, never through the means alone.

    A NaN among the values (a seed whose measurement failed) makes ``mean``,
    ``low`` and ``high`` NaN, so the table shows it; comparing such a spread
    (:meth:`below`, :meth:`above`, :meth:`versus`, :func:`separated`) raises
    ``ValueError`` rather than answer from the other seeds.
    """

    values: Tuple[float, ...]

    def __post_init__(self):
        if not self.values:
            raise ValueError("a Spread needs at least one value")

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def low(self) -> float:
        return math.nan if self.has_nan else min(self.values)  # min() of a list with a NaN depends on its order

    @property
    def high(self) -> float:
        return math.nan if self.has_nan else max(self.values)

    @property
    def has_nan(self) -> bool:
        """Whether a seed's value is NaN."""
        return any(math.isnan(v) for v in self.values)

    @property
    def width(self) -> float:
        """``high - low``: how much the seeds disagree."""
        return self.high - self.low

    def below(self, other: Union["Spread", Number], margin: float = 0.0) -> bool:
        """Every value of ``self`` is below every value of ``other`` by more than ``margin``."""
        return _high(self) + _margin(margin) < _low(other)

    def above(self, other: Union["Spread", Number], margin: float = 0.0) -> bool:
        """Every value of ``self`` is above every value of ``other`` by more than ``margin``."""
        return _low(self) - _margin(margin) > _high(other)

    def versus(self, other: Union["Spread", Number], below: str = "below", above: str = "above",
               tie: str = "within seed noise of", equal: str = "equal to") -> str:
        """The word for ``self`` against ``other``: ``below`` or ``above`` where the seed ranges separate,
        ``equal`` where every seed of both gave one and the same value (1.00 against 1.00 is not noise), else ``tie``.

        >>> Spread((0.2, 0.3)).versus(Spread((0.5, 0.6))), Spread((1.0, 1.0)).versus(1.0)
        ('below', 'equal to')
        """
        if self.below(other):
            return below
        if self.above(other):
            return above
        return equal if _low(other) == _high(other) == self.low == self.high else tie

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        if len(self.values) == 1:
            return _format_number(self.mean, spec)
        return f"{_format_number(self.mean, spec)} ({_format_number(self.low, spec)}–{_format_number(self.high, spec)})"

    def __str__(self) -> str:
        return format(self, "")

    def __float__(self) -> float:
        return self.mean


def _format_number(x: float, spec: str) -> str:
    """``format(x, spec)``, without the minus sign of a value that rounds to zero ("-0.00" reads "0.00", "+0.00" with "+")."""
    text = format(x, spec)
    if text.startswith("-"):
        try:
            zero = float(text.rstrip("%")) == 0.0
        except ValueError:
            zero = False
        if zero:
            text = ("+" if "+" in spec else "") + text[1:]
    return text


def _compared(x: Any) -> Union[Spread, float]:
    """``x`` as something to compare: a :class:`Spread` or a number, neither with a NaN (``ValueError`` otherwise)."""
    value = x if isinstance(x, Spread) else _leaf(x)
    if value is None:
        raise ValueError(f"a comparison takes Spreads or numbers, got {x!r}")
    if (value.has_nan if isinstance(value, Spread) else math.isnan(value)):
        raise ValueError(f"cannot compare {x!r}: a seed's value is NaN (its measurement failed)")
    return value


def _low(x: Union[Spread, Number]) -> float:
    x = _compared(x)
    return x.low if isinstance(x, Spread) else x


def _high(x: Union[Spread, Number]) -> float:
    x = _compared(x)
    return x.high if isinstance(x, Spread) else x


def _leaf(x: Any) -> Optional[float]:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.is_floating_point():
        return float(x.item())
    if hasattr(x, "dtype") and getattr(x, "shape", None) == () and hasattr(x, "item"):  # NumPy scalars
        item = x.item()
        return float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else None
    return None


def spread(per_seed: Sequence[Any]) -> Any:
    """Aggregate per-seed results of the same structure into :class:`Spread` leaves.

    ``per_seed[i]`` is the result of seed ``i``: a number, a dict or a
    list/tuple of them, nested any depth (dict keys and list lengths must agree
    across seeds). A per-element tensor becomes a tensor-shaped list of
    spreads. Anything else is refused.

    >>> s = spread([{"a": 1.0, "b": [2.0, 3.0]}, {"a": 3.0, "b": [2.0, 5.0]}])
    >>> s["a"].mean, s["a"].low, s["a"].high, format(s["b"][1], ".1f")
    (2.0, 1.0, 3.0, '4.0 (3.0–5.0)')
    """
    if not isinstance(per_seed, (list, tuple)) or not per_seed:
        raise ValueError(f"per_seed must be a non-empty list of per-seed results, got {per_seed!r}")
    return _aggregate(list(per_seed), "result")


def _aggregate(items: List[Any], where: str) -> Any:
    first = items[0]
    numbers = [_leaf(x) for x in items]
    if all(v is not None for v in numbers):
        return Spread(tuple(numbers))
    if isinstance(first, Mapping):
        keys = list(first)
        for x in items:
            if not isinstance(x, Mapping) or list(x) != keys:
                raise ValueError(f"{where}: every seed must give the same keys {keys}, got {x!r}")
        return {k: _aggregate([x[k] for x in items], f"{where}[{k!r}]") for k in keys}
    if isinstance(first, torch.Tensor):
        for x in items:
            if not isinstance(x, torch.Tensor) or x.shape != first.shape:
                raise ValueError(f"{where}: every seed must give a tensor of shape {tuple(first.shape)}")
        return _aggregate([x.tolist() for x in items], where)
    if isinstance(first, (list, tuple)):
        for x in items:
            if not isinstance(x, (list, tuple)) or len(x) != len(first):
                raise ValueError(f"{where}: every seed must give a sequence of length {len(first)}, got {x!r}")
        return [_aggregate([x[i] for x in items], f"{where}[{i}]") for i in range(len(first))]
    raise ValueError(f"{where}: a per-seed result must be numbers, dicts, lists or tensors, got {first!r}")


def per_seed(measure: Callable[[int], Any], seed_list: Optional[Sequence[int]] = None, *,
             workers: Optional[int] = None) -> List[Any]:
    """``[measure(s) for s in seed_list]``, side by side on a CPU; ``seed_list`` defaults to :func:`seeds`.

    Each ``measure(s)`` runs on one torch thread (tiny models are dominated by
    per-operation overhead, and the numbers then do not depend on the
    machine's thread count). On Linux, without CUDA in use, up to ``workers``
    (default: the usable cores) run at once in forked copies of this process,
    which send their results back (anything :func:`torch.save` can write);
    elsewhere they run here one after the other, with the same results. What
    ``measure`` changes (a model's window, a global) is not seen by the other
    calls or by the caller: return what you need. A call that fails in a copy
    runs again here, so its error is raised as usual.
    """
    if not callable(measure):
        raise ValueError(f"measure must be a function of a seed, got {type(measure).__name__}")
    seed_list = _seed_list(seed_list)
    workers = min(_usable_cores(), len(seed_list)) if workers is None else check_int("workers", workers, 1)
    done: Dict[int, Any] = {}
    if (workers > 1 and len(seed_list) > 1 and hasattr(os, "fork") and sys.platform.startswith("linux")
            and not torch.cuda.is_initialized()):
        done = _measure_in_workers(measure, seed_list, workers)
    return [done[i] if i in done else _on_one_thread(measure, s) for i, s in enumerate(seed_list)]


def _seed_list(seed_list: Optional[Sequence[int]]) -> List[int]:
    """``seed_list`` checked (a non-empty list of integers >= 0), or :func:`seeds` for ``None``."""
    if seed_list is None:
        return seeds()
    if isinstance(seed_list, (str, bytes)) or not hasattr(seed_list, "__iter__"):
        raise ValueError(f"seed_list must be a list of seeds (integers >= 0), got {seed_list!r}")
    checked = [check_int("every seed", s, 0) for s in seed_list]
    if not checked:
        raise ValueError("seed_list must not be empty")
    return checked


def over_seeds(measure: Callable[[int], Any], seed_list: Optional[Sequence[int]] = None, *,
               workers: Optional[int] = None) -> Any:
    """``spread(per_seed(measure, seed_list))``: the spread of a measurement over the seeds (:func:`per_seed`)."""
    return spread(per_seed(measure, seed_list, workers=workers))


def _on_one_thread(measure: Callable[[int], Any], seed: int) -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure(seed)
    finally:
        torch.set_num_threads(threads)


def _measure_in_workers(measure: Callable[[int], Any], seed_list: List[int], workers: int) -> Dict[int, Any]:
    """``{i: measure(seed_list[i])}`` from forked processes; a call whose process failed is left out."""
    return _in_workers(measure, seed_list, workers, stacklevel=5)


def _in_workers(call: Callable[[Any], Any], items: List[Any], workers: int,
                finished_one: Optional[Callable[[int], Any]] = None, stacklevel: int = 4) -> Dict[int, Any]:
    """``{i: call(items[i])}``, each call in a forked copy of this process on one thread, ``workers`` at a time.

    A child silences its output, runs its call, writes the result and its
    warnings whole to a temporary file (anything :func:`torch.save` can
    write) and exits without the parent's exit handlers; the warnings are
    raised here. A call whose process failed is left out, for the caller to
    run again here (and raise its error). ``finished_one(i)`` is called as call ``i`` ends.
    """
    results: Dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="posenc-workers-") as folder:
        running: Dict[int, int] = {}  # pid -> index
        todo = list(enumerate(items))
        parent = os.getpid()
        try:
            while todo or running:
                while todo and len(running) < workers:
                    i, item = todo.pop(0)
                    pid = os.fork()
                    if pid == 0:
                        _child(call, item, os.path.join(folder, f"{i}.pt"), parent)
                    running[pid] = i
                finished = [pid for pid in running if os.waitpid(pid, os.WNOHANG)[0] == pid]  # only our children
                if not finished:
                    time.sleep(0.02)
                for pid in finished:
                    i = running.pop(pid)
                    path = os.path.join(folder, f"{i}.pt")
                    if os.path.exists(path):
                        value, caught = torch.load(path, weights_only=False)  # written by our own child
                        for message in caught:
                            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)
                        results[i] = value
                    if finished_one is not None:
                        finished_one(i)
        finally:  # an interrupt (Jupyter's stops this process only) or an error here: no worker trains on
            _stop_workers(running)
    return results


def _stop_workers(pids: Any) -> None:
    """Kill the forked workers ``pids`` and reap them.

    A worker killed mid-run leaves no cache entry (entries are written whole,
    by a rename) and its run lock is dropped by the operating system as the
    process ends, so the next call trains that run at once instead of
    waiting for an orphan. SIGKILL, not SIGTERM: the run is lost either way,
    and a forked copy of a kernel may have inherited a handler that ignores
    SIGTERM.
    """
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # returns at once: a killed process ends without running any code


def _child(call: Callable[[Any], Any], item: Any, path: str, parent: int) -> None:  # pragma: no cover (a child)
    code = 1
    try:
        _die_with(parent)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = _on_one_thread(call, item)
        torch.save((value, [str(w.message)[:2000] for w in caught[:16]]), path + ".tmp")
        os.replace(path + ".tmp", path)
        code = 0
    finally:
        os._exit(code)


def _die_with(parent: int) -> None:  # pragma: no cover (a child)
    """Ask Linux to kill this worker when its parent ends, however it ends (``kill -9`` included)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # no prctl: the parent's own clean-up (an interrupt, an error) still stops the workers
        pass
    if os.getppid() != parent:  # the parent ended before the request was made
        os._exit(1)


def train_seeds(make_model: Union[Callable[[], Any], Mapping[str, Callable[[], Any]]], data: Any,
                seed_list: Optional[Sequence[int]] = None, *, init: Optional[Sequence[TrainResult]] = None,
                workers: Optional[int] = None, **train_kwargs: Any) -> Any:
    """Train a fresh model on ``data`` once per seed (or every configuration of a dict, once per seed).

    ``make_model`` is a function returning a new model, or a dict ``{name:
    function}``; the result is ``[pe.train(make_model(), data, seed=s, ...)
    for s in seed_list]``, or ``{name: that list}``. Every run is cached by
    its configuration, the seed included, so a re-run loads them.

    Before it trains, it prints one line: ``"N runs: M from the cache, K to
    train, about T min on this device"`` (T from a timed probe of about ten
    steps of the first run to train), then draws one progress bar over the
    steps of the whole set instead of one per model; ``progress=False``, the
    static website build and ``$POSENC_PROGRESS=0`` silence both. A run
    trained in this call (here or by a worker) is reported as trained
    (``from_cache=False``, ``steps_run`` its steps), one loaded from an
    earlier call as ``from_cache=True``.

    Args:
        seed_list: the seeds, default :func:`seeds` (``seed=`` is refused).
        init: fine-tune: one earlier :class:`~posenc.TrainResult` per seed
            (``init[i]`` starts the run of ``seed_list[i]``), e.g. the list an
            earlier ``train_seeds`` returned.
        workers: processes that train side by side on a CPU (default: the
            cores this process may use, its CPU affinity capped by
            ``$OMP_NUM_THREADS`` when set, at most one per run). Each trains on
            one thread and writes the run cache, which this process then reads,
            so the results are those of training one after the other. Used on
            Linux with the run cache, the CPU and ``cpu_threads=1`` (the
            default) only; elsewhere the runs train here, one after the other.
        train_kwargs: the other arguments of :func:`~posenc.train`.
    """
    if isinstance(make_model, Mapping):
        if not make_model:
            raise ValueError("make_model must not be an empty dict")
        makers = dict(make_model)
    else:
        makers = {None: make_model}
    for name, maker in makers.items():
        if not callable(maker) or isinstance(maker, torch.nn.Module):
            raise ValueError(f"make_model{'' if name is None else f'[{name!r}]'} must be a function returning a new "
                             "model, e.g. lambda: P.make_model(task.vocab_size, 'rope')")
    if "seed" in train_kwargs:
        raise ValueError("pass the seeds as seed_list, not seed=")
    seed_list = _seed_list(seed_list)
    if init is not None:
        init = list(init) if isinstance(init, (list, tuple)) else init
        if not isinstance(init, list) or len(init) != len(seed_list):
            raise ValueError(f"init must be a list of {len(seed_list)} earlier runs, one per seed")
    jobs = []
    for name, maker in makers.items():
        for i, s in enumerate(seed_list):
            model = maker()
            if any(model is job[1] for job in jobs):
                raise ValueError("make_model must return a new model on every call")
            kwargs = dict(train_kwargs, seed=s, **({} if init is None else {"init": init[i]}))
            jobs.append((name, model, kwargs))
    progress = train_kwargs.pop("progress", True)
    # every run checked, and its cache entry looked up, before any trains
    plans = [_plan(model, data, **{k: v for k, v in kwargs.items() if k != "progress"}, warn_stacklevel=4)
             for _, model, kwargs in jobs]
    todo = [i for i, plan in enumerate(plans) if plan.path is None or not plan.path.is_file()]
    shown = _progress_shown(progress)
    side_by_side = _side_by_side(plans, todo, workers)
    if shown:
        print(_cost_line(plans, todo, side_by_side), flush=True)
    with accounted("train") as cost, _progress_bar(sum(plans[i].steps for i in todo),
                                                   f"{len(todo)} run{'s' if len(todo) != 1 else ''}"
                                                   + (f", {side_by_side} at a time" if side_by_side > 1 else ""),
                                                   shown and bool(todo)) as bar:
        trained = _train_in_workers(plans, todo, side_by_side, bar) if side_by_side > 1 else {}
        done: Dict[int, TrainResult] = {}
        token = _SET_BAR.set(bar)  # the runs trained here advance the one bar
        try:
            with _busy_runs_raise():  # a run another process trains (a notebook beside this one) comes last
                for i, plan in enumerate(plans):
                    try:
                        done[i] = _run(plan, False)
                    except _RunBusy:
                        pass
            for i, plan in enumerate(plans):
                if i not in done:
                    done[i] = _run(plan, False)  # waits for it, then loads it
        finally:
            _SET_BAR.reset(token)
        cost["runs"] = sum(1 for i in done if i in trained or not done[i].from_cache)  # trained in this call
    runs: Dict[Any, List[TrainResult]] = {name: [] for name in makers}
    for i, (name, _, _) in enumerate(jobs):
        result = done[i]
        if i in trained and result.from_cache:  # trained in this call, by a worker: reported as trained
            result = replace(result, from_cache=False, steps_run=trained[i])
        runs[name].append(result)
    return runs[None] if None in runs else runs


def _side_by_side(plans: List[Any], todo: List[int], workers: Optional[int]) -> int:
    """How many forked workers train the runs ``todo`` at once: 1 (train here) unless it is safe and useful."""
    workers = min(_usable_cores(), max(1, len(todo))) if workers is None else check_int("workers", workers, 1)
    if (workers < 2 or len(todo) < 2 or not hasattr(os, "fork") or not sys.platform.startswith("linux")
            or any(plans[i].path is None for i in todo) or any(plans[i].device.type != "cpu" for i in todo)
            or any(plans[i].cpu_threads != 1 for i in todo)):  # a worker trains on one thread: that run's numbers
        return 1
    return min(workers, len(todo))


def _cost_line(plans: List[Any], todo: List[int], side_by_side: int) -> str:
    """``"N runs: M from the cache, K to train, about T min on this device"``: what a set of runs will cost.

    T comes from a timed probe: the first run to train, trained here without
    the cache for 2 and then 8 steps, gives the seconds per step on this
    device (the difference of the two) and the start-up cost of a run (what
    the 2-step run took beyond its 2 steps). Every run to train costs its
    steps and one start-up, shared among the workers; the probe itself, about
    ten steps of one run, is added.
    """
    n, k = len(plans), len(todo)
    line = f"{n} run{'s' if n != 1 else ''}: {n - k} from the cache, {k} to train"
    if not k:
        return line
    try:
        per_step, start_up, probe = _seconds_per_step(plans[todo[0]])
    except Exception:  # the run itself will raise it, with its own message
        return line + ", time unknown"
    seconds = (per_step * sum(plans[i].steps for i in todo) + start_up * k) / side_by_side + probe
    return line + f", about {_minutes(seconds / 60)} on this device"


def _seconds_per_step(plan: Any) -> Tuple[float, float, float]:
    """``(seconds per step, seconds to start a run, seconds the probe took)`` from runs of 2 and 8 steps."""
    probe = replace(plan, model=copy.deepcopy(plan.model), path=None)
    seconds = []
    started = time.perf_counter()
    for steps in (2, 8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seconds.append(_run(replace(probe, steps=steps, warmup=min(plan.warmup, steps)), False).seconds)
    per_step = (seconds[1] - seconds[0]) / 6
    if per_step <= 0:  # too noisy to split: all of it steps
        return seconds[1] / 8, 0.0, time.perf_counter() - started
    return per_step, max(0.0, seconds[0] - 2 * per_step), time.perf_counter() - started


def _minutes(minutes: float) -> str:
    if minutes < 1:
        seconds = 5 * round(12 * minutes)  # to 5 s: the probe is not finer than that
        return f"{seconds} s" if seconds >= 5 else "a few seconds"
    return f"{minutes:.0f} min" if minutes >= 10 else f"{minutes:.1f} min"


def _usable_cores() -> int:
    """The cores this process may use: its CPU affinity, at most ``$OMP_NUM_THREADS`` when that is set.

    ``OMP_NUM_THREADS`` is this process's share of the machine when several
    share it (notebooks executed side by side by ``book/execute.py``, pytest
    workers): forked trainers stay within it instead of oversubscribing the cores.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    share = os.environ.get("OMP_NUM_THREADS", "").strip()
    return max(1, min(cores, int(share))) if share.isdigit() and int(share) > 0 else cores


def _train_in_workers(plans: List[Any], todo: List[int], workers: int, bar: Any) -> Dict[int, int]:
    """Fill the run cache for the runs ``todo`` of ``plans`` with ``workers`` forked processes.

    A child trains one run on one thread with its output silenced and exits
    (:func:`_in_workers`); its warnings are raised here. A child that fails
    leaves no entry, so the caller trains that run again here and raises its
    error. Returns ``{index: steps}`` for the runs a child trained (not
    loaded); ``bar`` advances by a run's steps as it ends.
    """
    _import_what_training_imports()
    ran = _in_workers(lambda plan: (lambda r: None if r.from_cache else r.steps_run)(_run(plan, False)),
                      [plans[i] for i in todo], workers, lambda j: bar.update(plans[todo[j]].steps), stacklevel=6)
    return {todo[j]: steps for j, steps in ran.items() if steps is not None}


def _import_what_training_imports() -> None:
    """Import ``torch._dynamo`` here, once, before forking: PyTorch imports it when the first optimizer is made
    (about a second on a CPU), which every forked trainer would otherwise do again."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # pragma: no cover (a build of torch without it: the children import what they need)
        pass


def separated(a: Union[Spread, Number], b: Union[Spread, Number], margin: float = 0.0) -> bool:
    """True when the ranges of ``a`` and ``b`` do not overlap (apart by more than ``margin``).

    Raises:
        ValueError: for anything but Spreads and numbers, a NaN among them, or a
            ``margin`` that is not a finite number ``>= 0``.
    """
    margin = _margin(margin)
    return _high(a) + margin < _low(b) or _high(b) + margin < _low(a)


def _margin(margin: Any) -> float:
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    return float(margin)


def glue(name: str, value: Any, spec: str = ".3f") -> str:
    """Hand ``value``, formatted with ``spec``, to the page's prose as ``{glue:text}`name```; return the text.

    A :class:`Spread` becomes ``"mean (low–high)"``, a number ``format(value,
    spec)``, a string stays as it is (without math: ``$`` is refused, since
    the page shows glued text as written). The text is glued with myst-nb (the
    website's build reads it from the executed notebook); where myst-nb is
    not installed or no kernel runs (Colab, a script) nothing is displayed.
    """
    if not isinstance(name, str) or not name or any(c.isspace() or c in "`:" for c in name):
        raise ValueError(f"name must be a non-empty name without spaces, colons or backticks, got {name!r}")
    if isinstance(value, str):
        text = value
    elif isinstance(value, Spread) or _leaf(value) is not None:
        text = format(value if isinstance(value, Spread) else _leaf(value), spec)
    else:
        raise ValueError(f"glue takes a number, a Spread or a string, got {type(value).__name__}")
    if "$" in text:  # {glue:text} pastes characters: "$L$" would reach the page as written
        raise ValueError(f"glued text is shown as it is, math is not rendered in it: keep the math in the markdown "
                         f"around {{glue:text}}`{name}`, got {text!r}")
    _myst_glue(name, text)
    return text


def _myst_glue(name: str, value: Any) -> None:
    """Glue ``value`` (text, or an object with a rich display) with myst-nb, not shown; nothing without a kernel."""
    try:
        from IPython import get_ipython
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    if get_ipython() is not None:
        myst_glue(name, value, display=False)

