"""Evidence that holds on any machine: seeds, and measurements run on each of them.

A tiny model trained once gives one number. Another seed, another CPU or
another set of CPU kernels (``ATEN_CPU_CAPABILITY``) rounds in another order
and trains to another number. The book therefore compares schemes only over
several seeds (their spread: :mod:`posenc.spread`):

* :func:`seed_offset` reads ``$POSENC_SEED`` (default 0); :func:`seeds` gives
  the training seeds of a comparison and :func:`evaluation_seed` the seed of
  the evaluation batches, both moved by it, so anyone can rerun a chapter on
  other seeds.
* :func:`train_seeds` trains one configuration on every seed (cached like any
  :func:`~posenc.train` run); :func:`per_seed` runs any measurement per seed
  (side by side on a CPU), and :func:`over_seeds` aggregates the results into
  :class:`~posenc.Spread` values (:func:`~posenc.spread`).
* :func:`train_recall_seeds` and :func:`recall_over_seeds`: associative
  recall's training recipe, and its measurement at a distance, over seeds.
"""

from __future__ import annotations

import contextlib
import copy
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
from ._validate import check_bool, check_int, check_sequence
from .runtime import _RunBusy
from .recall import AssociativeRecall, PeriodicSequence
from .evaluate import recall_accuracy
from .spread import Spread, spread
from .train import (_SET_BAR, TrainResult, _busy_runs_raise, _plan, _progress_bar, _progress_shown, _run,
                    train)

__all__ = ["SEED_ENV", "seed_offset", "seeds", "evaluation_seed", "per_seed", "over_seeds", "train_seeds",
           "train_recall_seeds", "RecallOverSeeds", "recall_over_seeds"]

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
    if not (value.isascii() and value.isdigit()):  # "²" and "٣" are digits to str.isdigit
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
    """``seed_list`` checked (a non-empty list of distinct integers >= 0), or :func:`seeds` for ``None``."""
    if seed_list is None:
        return seeds()
    checked = [check_int("every seed", s, 0) for s in check_sequence("seed_list", seed_list, "seeds (integers >= 0)")]
    if not checked:
        raise ValueError("seed_list must not be empty")
    repeated = sorted({s for s in checked if checked.count(s) > 1})
    if repeated:  # the same run again: a spread over copies of one seed would look like agreement between seeds
        raise ValueError(f"seed_list must not repeat a seed, got {checked} ({', '.join(map(str, repeated))} more than once)")
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
                seed_list: Optional[Sequence[int]] = None, *,
                init: Union[None, Sequence[TrainResult], Mapping[str, Sequence[TrainResult]]] = None,
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
            earlier ``train_seeds`` returned; with a dict ``make_model``, either
            one list for every configuration or a dict of such lists with the
            same names (``init[name][i]``), e.g. the dict an earlier
            ``train_seeds`` returned (a warm-up, then the task).
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
    init_runs: Optional[Dict[Any, List[Any]]] = None
    if init is not None:
        by_name = isinstance(init, Mapping)
        starts: Mapping[Any, Any] = init if isinstance(init, Mapping) else {name: init for name in makers}
        if by_name and set(init) != set(makers):
            raise ValueError(f"init given as a dict must have make_model's names {sorted(map(str, makers))}, "
                             f"got {sorted(map(str, init))}")
        init_runs = {}
        for name, given in starts.items():
            given = list(given) if isinstance(given, (list, tuple)) else given
            if not isinstance(given, list) or len(given) != len(seed_list):
                raise ValueError(f"init{f'[{name!r}]' if by_name else ''} must be a "
                                 f"list of {len(seed_list)} earlier runs, one per seed")
            init_runs[name] = given
    jobs = []
    for name, maker in makers.items():
        for i, s in enumerate(seed_list):
            model = maker()
            if any(model is job[1] for job in jobs):
                raise ValueError("make_model must return a new model on every call")
            kwargs = dict(train_kwargs, seed=s, **({} if init_runs is None else {"init": init_runs[name][i]}))
            jobs.append((name, model, kwargs))
    progress = check_bool("progress", train_kwargs.pop("progress", True))
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


def train_recall_seeds(make_model: Union[Callable[[], Any], Mapping[str, Callable[[], Any]]], recall: AssociativeRecall,
                       seed_list: Optional[Sequence[int]] = None, *, warmup_steps: Optional[int] = None,
                       **train_kwargs: Any) -> Any:
    """Associative recall's training recipe, over seeds: a warm-up on periodic sequences, then recall.

    Trained on :class:`~posenc.recall.AssociativeRecall` alone, a small model
    sits for thousands of steps on a plateau (it answers with *some* value of
    the sequence's pairs): finding the key and reading the token after it pay
    off only together. So each model first trains for ``warmup_steps``
    (default: twice ``steps``) on :class:`~posenc.recall.PeriodicSequence`
    with recall's vocabulary, where almost every token is a target of the same
    two steps (an induction head, Olsson et al., 2022), then for ``steps`` on
    ``recall``, starting from its own warm-up (``train_seeds(init=)``). Both
    stages are cached runs like any other.

    Args:
        make_model, seed_list: as :func:`train_seeds` (a function or a dict of them).
        recall: the task.
        warmup_steps: steps on the periodic sequences.
        train_kwargs: the other arguments of :func:`~posenc.train`, for both
            stages (``steps`` for recall; the warm-up's own rate schedule).

    Returns:
        What :func:`train_seeds` returns for ``recall``: the recall runs per seed
        (a list, or a dict of lists).
    """
    if not isinstance(recall, AssociativeRecall):
        raise ValueError(f"recall must be a posenc.AssociativeRecall, got {type(recall).__name__}")
    if "init" in train_kwargs:
        raise ValueError("train_recall_seeds starts every run from its warm-up: init= is not accepted")
    if "steps" not in train_kwargs:
        raise ValueError("steps (the recall stage's) is required, e.g. **P.train_kwargs()")
    steps = check_int("steps", train_kwargs["steps"], 1)
    warmup_steps = 2 * steps if warmup_steps is None else check_int("warmup_steps", warmup_steps, 1)
    warm = train_seeds(make_model, PeriodicSequence(recall.vocab_size), seed_list,
                       **dict(train_kwargs, steps=warmup_steps))
    return train_seeds(make_model, recall, seed_list, init=warm, **train_kwargs)


@dataclass(frozen=True)
class RecallOverSeeds:
    """What :func:`recall_over_seeds` measured.

    Attributes:
        per_seed: one ``{model: {length: accuracy}}`` per seed, in the order of the runs.
        within: ``{model: [accuracy of each seed]}`` at the training length, on the larger sample.
    """

    per_seed: List[Dict[str, Dict[int, float]]]
    within: Dict[str, List[float]]

    @property
    def spread(self) -> Dict[str, Dict[int, Spread]]:
        """``{model: {length: Spread}}``: the accuracies over the seeds (:func:`~posenc.spread`)."""
        return spread(self.per_seed)

    def worst_within(self) -> Dict[str, float]:
        """``{model: the lowest within-length accuracy of its seeds}``."""
        return {name: min(values) for name, values in self.within.items()}

    def unsolved(self, threshold: float = 0.9) -> List[str]:
        """The models with a seed below ``threshold`` within the training length: no verdict beyond it rests on them."""
        return [name for name, worst in self.worst_within().items() if worst < threshold]


def recall_over_seeds(runs: Mapping[str, Sequence[TrainResult]], recall: AssociativeRecall, lengths: Sequence[int], *,
                      train_len: int, sequences: int = 128, within_sequences: int = 512) -> RecallOverSeeds:
    """Associative recall at a distance, for every model and seed, and once more within the training length.

    For each seed ``i`` (side by side, :func:`per_seed`) and each model
    ``name``: :func:`~posenc.recall_accuracy` of ``runs[name][i].model`` at
    every length of ``lengths`` on ``sequences`` sequences (every answer at
    least ``length - train_len`` tokens after its pair), and at ``train_len``
    on ``within_sequences`` sequences: the larger sample that shows a model has
    learned the task before anything is read beyond it. The questions come
    from :func:`evaluation_seed`, the same for every model.

    Args:
        runs: ``{model: [run of each seed]}``, as :func:`train_recall_seeds`
            returns for a dict; every model with the same number of seeds.
        recall: the task the models were trained on.
        lengths: the evaluation lengths.
        train_len, sequences: as :func:`~posenc.recall_accuracy`.
        within_sequences: the sample within the training length.

    Returns:
        A :class:`RecallOverSeeds`.
    """
    if not isinstance(recall, AssociativeRecall):
        raise ValueError(f"recall must be a posenc.AssociativeRecall, got {type(recall).__name__}")
    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"runs must be a non-empty dict {{model: [run of each seed]}}, got {type(runs).__name__}")
    counts = {name: len(check_sequence(f"runs[{name!r}]", rs, "runs, one per seed")) for name, rs in runs.items()}
    if len(set(counts.values())) != 1 or not min(counts.values()):
        raise ValueError(f"every model needs a run for each of the same seeds, got {counts} runs")
    lengths = [check_int("every length", n) for n in check_sequence("lengths", lengths, "evaluation lengths")]
    if not lengths:
        raise ValueError("lengths must not be empty")
    seed = evaluation_seed()

    def accuracy(model: Any, n: int, count: int) -> float:
        return recall_accuracy(model, recall, n, train_len=train_len, sequences=count, seed=seed)

    def one_seed(i: int) -> Tuple[Dict[str, Dict[int, float]], Dict[str, float]]:
        grid = {name: {n: accuracy(rs[i].model, n, sequences) for n in lengths} for name, rs in runs.items()}
        return grid, {name: accuracy(rs[i].model, train_len, within_sequences) for name, rs in runs.items()}

    rows = per_seed(one_seed, range(next(iter(counts.values()))))
    return RecallOverSeeds(per_seed=[grid for grid, _ in rows],
                           within={name: [within[name] for _, within in rows] for name in runs})


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
