"""Train a tiny model, evaluate it at several lengths, and cache the result.

* :func:`train` runs AdamW on batches of one data source (see
  :mod:`posenc.data`) with fixed seeds, a tqdm progress bar, bf16 autocast on
  CUDA, and stores the trained weights and loss history on disk under a key
  computed from the model, data and training configuration, so that running a
  notebook again loads instead of training.
* :func:`posenc.evaluate_lengths` (:mod:`posenc.evaluate`) measures loss,
  perplexity and accuracy of a trained model at several evaluation lengths on
  fixed validation batches: the "train short, test long" measurement of Press
  et al. (2022).
* ``position_sampling`` trains on sampled position ids (randomized positions,
  PoSE: :mod:`posenc.sampling`).
* :func:`posenc.training_preset` (:mod:`posenc.presets`) gives model and
  training sizes for the running mode.

The run cache lives in ``$POSENC_CACHE/runs`` if that variable is set, else in
``~/.cache/posenc/runs``; delete it to retrain. An entry is written
atomically (a temporary file renamed into place), with a digest of its
weights and histories, and checked when read: a truncated, garbled or
mismatched entry, or one whose contents no longer match its digest, is
reported, retrained and replaced (an entry without a digest, written by an
earlier version, loads as before), and a cache that cannot be written costs a
warning, never the trained model. A run whose loss or weights become NaN or
infinite raises ``ValueError`` and is not cached.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from ._costs import accounted
from ._evalcache import digest, scheme_classes, without_modules
from .data import IGNORE_INDEX
from .model import TinyLM
from ._validate import check_bool, check_device_here, check_int, check_number, make_module_callable
from .evaluate import LengthResult, _check_data, _positive, evaluate_lengths, evaluation_batches  # noqa: F401
from .sampling import _check_sampling, sample_positions
from .scheme import retunable_options
from .runtime import _atomic_save, _exclusive, _stray_temporaries, cache_dir, pick_device, seed_everything

__all__ = [
    "TrainResult",
    "run_key",
    "train",
]

#: Bump to invalidate every cached run after a change that alters training.
CACHE_VERSION = 2


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (in eval mode, on the training device).
        losses: training loss (nats) at every step.
        grad_norms: global gradient norm at every step, before clipping
            (the quantity of TransNormer's gradient relative std).
        from_cache: True if the weights were loaded from the run cache.
        steps_run: optimiser steps taken in this call (0 when loaded).
        seconds: wall-clock time of the training (as recorded when it ran).
        key: the run's cache key.
        config: the configuration the key was computed from.
    """

    model: TinyLM
    losses: List[float]
    grad_norms: List[float]
    from_cache: bool
    steps_run: int
    seconds: float
    key: str
    config: Dict[str, Any] = field(repr=False)

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of the steps."""
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return sum(tail) / len(tail)


def run_key(config: Dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of a configuration (JSON, keys sorted)."""
    blob = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _architecture(model_config: Dict[str, Any]) -> Any:
    """A model config as plain JSON values, without the options a fine-tune may change (:func:`retunable_options`)."""
    def strip(position: Any) -> Any:
        if not isinstance(position, dict):
            return position
        if position.get("scheme") == "layers":
            return dict(position, layers=[strip(p) for p in position["layers"]])
        free = retunable_options(position)
        return {k: v for k, v in position.items() if k not in free}

    plain = json.loads(json.dumps(model_config, default=str))
    return dict(plain, position=strip(plain.get("position")))


def _adamw(groups: List[Dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    """AdamW with betas (0.9, 0.95): the fused kernel where this torch has one for the device, else the plain loop.

    The fused step does the same arithmetic in one kernel per parameter group
    (on a CPU about a tenth of a tiny model's step time is the optimiser's loop);
    torch < 2.4 has no fused CPU kernel and refuses it at construction.
    """
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def _param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Weight decay on matrices of linear layers only (not embeddings, norms, biases, the position scheme)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_linear_weight = p.ndim == 2 and name.endswith("weight") and not name.startswith(("tok.", "position."))
        (decay if is_linear_weight else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


#: False inside :func:`_busy_runs_raise`: a run another process is training raises ``_RunBusy`` instead of waiting
_WAIT_FOR_BUSY_RUNS: contextvars.ContextVar = contextvars.ContextVar("posenc_wait_for_busy_runs", default=True)


@contextlib.contextmanager
def _busy_runs_raise():
    """Within the block, :func:`train` of a run that another process holds raises ``_RunBusy`` at once."""
    token = _WAIT_FOR_BUSY_RUNS.set(False)
    try:
        yield
    finally:
        _WAIT_FOR_BUSY_RUNS.reset(token)


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _progress_shown(enabled: bool = True) -> bool:
    """Whether progress is reported: ``enabled``, and neither the static website build nor ``$POSENC_PROGRESS=0``."""
    static = os.environ.get("POSENC_STATIC", "").strip().lower() not in ("", "0", "false", "no")
    # $POSENC_PROGRESS=0 turns the bars off. In a notebook every refresh is a
    # few widget messages, and a client that does not read them while a cell
    # runs (nbval) drops those beyond ZeroMQ's high-water mark (1000), the
    # cell's closing messages among them: the test runs set it.
    silenced = os.environ.get("POSENC_PROGRESS", "").strip().lower() in ("0", "false", "no", "off")
    return bool(enabled) and not static and not silenced


#: Set by :func:`posenc.train_seeds` while it trains runs here: the one bar over the set, advanced by every step
_SET_BAR: contextvars.ContextVar = contextvars.ContextVar("posenc_set_bar", default=None)


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    options = dict(total=total, desc=desc, disable=not _progress_shown(enabled), leave=False, mininterval=1.0)  # 1/s
    if options["disable"] or "tqdm.notebook" not in {c.__module__ for c in tqdm.__mro__}:  # terminal: tqdm's own
        return tqdm(**options)

    class _Bar(tqdm):  # a widget while it runs, then its last state as text (what a saved notebook shows)
        def __init__(self, **kwargs):
            from IPython.display import display
            super().__init__(display=False, **kwargs)
            self._handle = display(self.container, display_id=True)

        def close(self):
            if getattr(self, "_handle", None) is not None:
                self._handle.update({"text/plain": str(self)}, raw=True)
                self._handle = None
            super().close()

    return _Bar(**options)


def _training_window(window: Any, seq_len: int) -> Any:
    """The window(s) that act at ``seq_len`` (a window as long as the sequence does nothing): the cache key's."""
    if isinstance(window, tuple):  # one per layer
        acting = [w if w is not None and w < seq_len else None for w in window]
        return None if all(w is None for w in acting) else acting
    return window if window is not None and window < seq_len else None


def _run_digest(state: Dict[str, torch.Tensor], losses: List[float], grad_norms: List[float]) -> str:
    """SHA-256 of a run's weights (each tensor's name, dtype, shape and bytes) and its loss and gradient-norm
    histories: stored in the cache entry, compared when it is read."""
    return digest(dict(state_dict=state, losses=losses, grad_norms=grad_norms))


def _load_run(path: Path, config: Dict[str, Any], model: TinyLM, device: torch.device) -> Optional[Dict[str, Any]]:
    """The cached run at ``path`` loaded into ``model``, or None (absent, or unusable: warned, to be retrained).

    Its weights and histories must match its digest, and its weights be finite: an entry without a
    digest (edited, or an earlier version's) is not trusted.
    """
    try:
        if path.is_dir():
            raise ValueError("it is a folder")
        _stray_temporaries(path)
        if not path.exists():
            return None
        saved = torch.load(path, map_location=device, weights_only=True)
        if not isinstance(saved, dict) or json.loads(saved.get("config", "null")) != json.loads(
                json.dumps(config, default=str)):  # compared as data: key order does not matter
            raise ValueError("it holds another configuration")
        losses, norms = [float(x) for x in saved["losses"]], [float(x) for x in saved["grad_norms"]]
        steps = config["train"]["steps"]
        if len(losses) != steps or len(norms) != steps:
            raise ValueError(f"it records {len(losses)} steps, not {steps}")
        if "digest" not in saved:
            raise ValueError("it has no digest to check its weights against (an edited entry, or an earlier "
                             "version's)")
        if saved["digest"] != _run_digest(saved["state_dict"], saved["losses"], saved["grad_norms"]):
            raise ValueError("its weights or histories do not match its digest (the file was changed or damaged)")
        if not all(math.isfinite(x) for x in losses):
            raise ValueError("a recorded loss is NaN or infinite")
        if not all(bool(torch.isfinite(t).all()) for t in saved["state_dict"].values() if t.is_floating_point()):
            raise ValueError("a stored weight is NaN or infinite")
        model.load_state_dict(saved["state_dict"])
        return dict(losses=losses, grad_norms=norms, seconds=float(saved["seconds"]))
    except Exception as err:  # truncated, empty, garbled or mismatched: never trust it, never fail on it
        warnings.warn(f"the cached run {path} cannot be used ({type(err).__name__}: {err}); "
                      "training again, and the new result will replace it", RuntimeWarning, stacklevel=4)
        return None


def _save_run(path: Path, payload: Dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (a unique temporary file, then a rename); warn if impossible."""
    try:
        _atomic_save(payload, path)
    except Exception as err:  # read-only folder, no home, full disk: no half-written file stays
        warnings.warn(f"could not write the run cache {path} ({type(err).__name__}: {err}); the trained "
                      "model is returned but will be trained again next time (set POSENC_CACHE to a writable "
                      "folder to keep it)", RuntimeWarning, stacklevel=4)


def _diverged(step: int, loss: float, targets: torch.Tensor, seq_len: int, lr: float) -> ValueError:
    """The error of a training loss that is not finite at ``step``: no counted target, or divergence."""
    if not bool((targets != IGNORE_INDEX).any()):
        return ValueError(f"the batch of step {step} has no counted target: every target is {IGNORE_INDEX} "
                          f"(ignored), so there is no loss to learn from (e.g. a pe.LaggedCopy whose lag >= "
                          f"seq_len={seq_len}: train on sequences longer than the lag)")
    return ValueError(f"the training loss became {loss} at step {step}: training diverged; try a lower lr "
                      f"(lr={lr:g}), e.g. lr={lr / 10:g}")


def _check_weights(model: TinyLM, steps: int, lr: float) -> None:
    """Raise ``ValueError`` if a trained weight is NaN or infinite (the last update diverged)."""
    params = [p.detach() for p in model.parameters() if p.is_floating_point()]
    if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
        raise ValueError(f"the weights became NaN or infinite in the last of the {steps} steps: training "
                         f"diverged; try a lower lr (lr={lr:g}), e.g. lr={lr / 10:g}")


def _optimise(model, data, opt, params, losses, norms, steps, seq_len, batch_size, lr, warmup, grad_clip,
              batches, device, progress, sampling=None) -> None:
    """The optimiser loop of :func:`train` (appends to ``losses`` and ``norms``).

    Raises ``ValueError`` (:func:`_diverged`) at the first step whose loss is NaN or infinite.
    """
    use_bf16 = device.type == "cuda"
    outer = _SET_BAR.get()
    with _progress_bar(steps, model.position.name, progress) if outer is None else contextlib.nullcontext(outer) as bar:
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr * _lr_factor(step, steps, warmup)
            x, y = data.batch(batch_size, seq_len, batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            ids = None if sampling is None else sampling(x.shape[0], x.shape[1]).to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(x, positions=ids)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            # the norm before clipping; max_norm=inf measures without changing the gradients
            norms.append(torch.nn.utils.clip_grad_norm_(params, math.inf if grad_clip is None else grad_clip))
            opt.step()
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                raise _diverged(step, losses[-1], y, seq_len, lr)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)  # shown at the next refresh
            bar.update(1)


def train(
    model: TinyLM,
    data: Any,
    steps: int = 250,
    seq_len: int = 64,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    device: Optional[torch.device] = None,
    cache: bool = True,
    progress: bool = True,
    *,
    warmup: Optional[int] = None,
    weight_decay: float = 0.1,
    grad_clip: Optional[float] = 1.0,
    cpu_threads: Optional[int] = 1,
    init: Optional[TrainResult] = None,
    position_sampling: Optional[str] = None,
    max_position: Optional[int] = None,
) -> TrainResult:
    """Train ``model`` on ``data`` for a fixed number of steps (or load the cached result).

    The model is re-initialised from ``seed`` first (its current weights are
    discarded), so a run depends only on its configuration, which is what the
    cache key records: the model's :attr:`~posenc.model.TinyLM.config`, the
    data's ``config``, every argument below except ``device``, ``cache`` and
    ``progress`` (``cpu_threads`` where it is not 1), and the window / log-n
    settings if they are active at ``seq_len``.

    Optimiser: AdamW (betas 0.9, 0.95; weight decay on linear weights only),
    linear warm-up for ``warmup`` steps then cosine decay to 10% of ``lr``
    (``warmup <= steps``: ``warmup == steps`` warms up over the whole run,
    reaching ``lr`` at the last step without decaying; more is refused, since
    the rate would never reach ``lr``; default ``min(25, steps)``),
    gradient clipping at ``grad_clip`` (``None``: no clipping; the norm of
    every step is recorded either way). Batches come from
    ``data.batch(batch_size, seq_len, generator)`` with a generator seeded by
    ``seed``. On CUDA the forward pass runs under bf16 autocast.

    Args:
        model: a :class:`~posenc.model.TinyLM` (``train_len`` is set to
            ``seq_len`` if it is ``None``).
        data: a source from :mod:`posenc.data` (``vocab_size`` must match the model).
        steps, seq_len, batch_size, lr: the training budget.
        seed: seeds the initialisation, the batches and dropout.
        device: one this machine has; default :func:`posenc.pick_device`.
        cache: load from / save to the run cache.
        progress: show a tqdm progress bar (never on the static website build,
            nor where ``$POSENC_PROGRESS`` is ``0``).
        cpu_threads: torch threads while training on the CPU (restored after;
            ``None`` leaves the setting alone). One thread by default: the tiny
            models are dominated by per-operation overhead, and the trained
            weights are then the same whatever the machine's thread count
            (floating-point sums depend on how the work is split). Any other
            count enters the cache key (``None``: the count in effect), since
            it changes the numbers: the small preset trained 20 steps on 1 and
            on 2 threads gives losses that differ in their last bits (about
            1e-7) and other weights.

        init: fine-tune: start from the weights of an earlier run (a
            :class:`TrainResult` of a model with the same architecture)
            instead of a fresh initialisation. The RoPE base may differ (RoPE,
            p-RoPE, per layer too): continued training with a raised base is
            "adjusted base frequency" (ABF; Xiong et al., 2023, "Effective
            Long-Context Scaling of Foundation Models": Llama 2 Long, base
            10,000 raised to 500,000 for longer sequences). The run's key is computed from
            the earlier run's key and this configuration, so a fine-tuned run
            is cached apart from its starting point and from a run from
            scratch, and loads on re-run. Evaluation-time settings active
            while training (window, sinks, ``rope_scaling``) enter the key.
        position_sampling: ``None`` (ids ``0 .. seq_len-1``), ``"randomized"``
            (Ruoss et al., 2023: a sorted sample of ``seq_len`` ids from
            ``[0, max_position)`` per sequence) or ``"pose"`` (Zhu et al., 2024:
            two contiguous pieces, the second shifted by a random skip), drawn
            for every batch from a generator seeded by ``seed``
            (:mod:`posenc.sampling`). Both enter the cache key.
        max_position: the ids are drawn below it (``>= seq_len``; needed by a sampling).

    Returns:
        a :class:`TrainResult`; ``result.model is model``, except when
        ``model`` is (or shares weights with) ``init.model``: then a copy is
        fine-tuned, and the earlier result keeps its weights.

    Raises:
        ValueError: for a wrong argument (before anything trains), e.g. a
            ``device`` this machine does not have (naming those it has), or a
            ``cache`` or ``progress`` that is not ``True`` or ``False``;
            while training, when a batch has no counted target (every target
            ignored, e.g. a ``LaggedCopy`` whose ``lag >= seq_len``) or the
            loss (or, after the last step, a weight) becomes NaN or infinite
            (training diverged: the error names the step and suggests a
            lower ``lr``). Nothing is written to the run cache then.
    """
    progress = check_bool("progress", progress)
    plan = _plan(model, data, steps, seq_len, batch_size, lr, seed, device, cache, warmup=warmup,
                 weight_decay=weight_decay, grad_clip=grad_clip, cpu_threads=cpu_threads, init=init,
                 position_sampling=position_sampling, max_position=max_position)
    return _run(plan, progress)


@dataclass
class _Plan:
    """A checked :func:`train` call: its arguments as Python values, the run's configuration, key and cache file."""
    model: TinyLM
    data: Any
    steps: int
    seq_len: int
    batch_size: int
    lr: float
    seed: int
    warmup: int
    weight_decay: float
    grad_clip: Optional[float]
    cpu_threads: Optional[int]
    position_sampling: Optional[str]
    max_position: Optional[int]
    init_state: Optional[Dict[str, torch.Tensor]]
    device: torch.device
    config: Dict[str, Any]
    key: str
    path: Optional[Path]
    keyed: Dict[str, Any]


def _plan(model: Any, data: Any, steps: Any = 250, seq_len: Any = 64, batch_size: Any = 32, lr: Any = 3e-3,
          seed: Any = 0, device: Any = None, cache: bool = True, *, warmup: Any = None, weight_decay: Any = 0.1,
          grad_clip: Any = 1.0, cpu_threads: Any = 1, init: Optional[TrainResult] = None,
          position_sampling: Optional[str] = None, max_position: Any = None, warn_stacklevel: int = 3) -> _Plan:
    """Check the arguments of :func:`train` and compute its run's key and cache file, without training."""
    if not isinstance(model, TinyLM):
        raise ValueError(f"model must be a posenc TinyLM, got {type(model).__name__}")
    _check_data(data)
    if data.vocab_size != model.vocab_size:
        raise ValueError(f"data has vocab_size {data.vocab_size} but the model has {model.vocab_size}")
    # every number as a Python value, so that NumPy or tensor spellings give the same cache key
    steps, seq_len, batch_size = (_positive(name, value) for name, value in
                                  (("steps", steps), ("seq_len", seq_len), ("batch_size", batch_size)))
    lr = _positive("lr", lr, float)
    seed = check_int("seed", seed, low=0)
    warmup = min(25, steps) if warmup is None else check_int("warmup", warmup, low=0)
    if warmup > steps:  # the rate would never reach lr, and the decay would never start
        raise ValueError(f"warmup must be at most steps: warmup={warmup} warm-up steps do not fit in steps={steps} "
                         "(lower warmup, e.g. warmup=0 for a fine-tune, or raise steps)")
    weight_decay = check_number("weight_decay", weight_decay, -math.inf)
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if grad_clip is not None:
        grad_clip = check_number("grad_clip", grad_clip, 0.0, what=", or None for no clipping")
    if cpu_threads is not None:
        cpu_threads = _positive("cpu_threads", cpu_threads)
    if model.max_len is not None and seq_len > model.max_len:
        raise ValueError(f"seq_len {seq_len} exceeds the learned table of the model (max_len={model.max_len})")
    _check_sampling(position_sampling, seq_len, max_position)
    if max_position is not None:
        max_position = check_int("max_position", max_position)
        if model.max_len is not None and max_position > model.max_len:
            raise ValueError(f"max_position {max_position} exceeds the learned table of the model "
                             f"(max_len={model.max_len})")
    init_state = None
    if init is not None:
        if not isinstance(init, TrainResult):
            raise ValueError(f"init must be the TrainResult of an earlier pe.train run, got {type(init).__name__}")
        if (_architecture(without_modules(init.config["model"], scheme_classes(init.model)))
                != _architecture(without_modules(model.config, scheme_classes(model)))):
            raise ValueError("init= must come from a model of the same architecture (only a RoPE base may differ, or what "
                             "a scheme of yours lists in its class attribute `retunable`): "
                             f"the earlier run has {init.config['model']}, this model {model.config}")
        init_state = {k: v.detach().clone() for k, v in init.model.state_dict().items()}
        ours = {p.data_ptr() for p in init.model.parameters()}
        if any(p.data_ptr() in ours for p in model.parameters()):  # fine-tuning init.model itself
            model = copy.deepcopy(model)  # the earlier result keeps its weights (and stays true to its key)
    cache = check_bool("cache", cache)
    device = pick_device() if device is None else check_device_here(device)
    if model.train_len is None:
        model.train_len = seq_len

    config = dict(
        version=CACHE_VERSION,
        model=model.config,
        data=data.config,
        train=dict(steps=steps, seq_len=seq_len, batch_size=batch_size, lr=float(lr), seed=seed,
                   warmup=warmup, weight_decay=float(weight_decay),
                   grad_clip=None if grad_clip is None else float(grad_clip),
                   window=_training_window(model.window, seq_len),
                   log_n=(model.train_len, True) if model.log_n_scaling is True and model.train_len < seq_len else None),
    )
    if model.sinks and config["train"]["window"] is not None:
        config["train"]["sinks"] = model.sinks
        if model.sink_positions != "original":
            config["train"]["sink_positions"] = model.sink_positions
    threads = torch.get_num_threads() if cpu_threads is None else cpu_threads
    if threads != 1:  # another thread count sums in another order: other numbers (one thread: the keys as before)
        config["train"]["cpu_threads"] = threads
    if model.rope_scaling is not None:
        config["train"]["rope_scaling"] = model.rope_scaling.config()
    if position_sampling is not None:
        config["train"]["position_sampling"] = dict(kind=position_sampling, max_position=max_position)
    if init is not None:
        config["init"] = init.key
    keyed = without_modules(config, scheme_classes(model))  # what the run computes: the key's and the entry's
    key = run_key(keyed)
    path: Optional[Path] = None
    if cache:
        try:
            path = cache_dir("runs") / f"{key}.pt"
        except (RuntimeError, KeyError, OSError) as err:  # e.g. no home directory to put ~/.cache in
            warnings.warn(f"no run cache ({err}); training without one (set POSENC_CACHE to a writable folder)",
                          RuntimeWarning, stacklevel=warn_stacklevel)
    return _Plan(model, data, steps, seq_len, batch_size, lr, seed, warmup, weight_decay, grad_clip, cpu_threads,
                 position_sampling, max_position, init_state, device, config, key, path, keyed)


def _run(plan: _Plan, progress: bool) -> TrainResult:
    """Load or train the run of ``plan`` (the body of :func:`train`)."""
    model, data, config, key, path, device = plan.model, plan.data, plan.config, plan.key, plan.path, plan.device
    names = ("steps", "seq_len", "batch_size", "lr", "seed", "warmup", "weight_decay", "grad_clip", "cpu_threads",
             "init_state", "position_sampling", "max_position")
    (steps, seq_len, batch_size, lr, seed, warmup, weight_decay, grad_clip, cpu_threads, init_state, position_sampling,
     max_position) = (getattr(plan, k) for k in names)
    cache = path is not None
    model.to(device)

    # one process at a time per run: a second one (a notebook executed beside this one) waits, then loads
    with _exclusive(path.with_name(f"{key}.lock"), _WAIT_FOR_BUSY_RUNS.get()) if cache else contextlib.nullcontext():
        if cache:
            saved = _load_run(path, plan.keyed, model, device)
            if saved is not None:
                model.eval()
                return TrainResult(model, saved["losses"], saved["grad_norms"], True, 0, saved["seconds"], key,
                                   config)

        with accounted("train", runs=1):  # the build's cost table (posenc._costs)
            seed_everything(seed)
            if init_state is None:
                model.reset_parameters(generator=torch.Generator().manual_seed(seed))
            else:
                model.load_state_dict(init_state)
            model.to(device)
            model.train()
            batches = torch.Generator().manual_seed(seed + 1)
            opt = _adamw(_param_groups(model, weight_decay), lr)
            losses: List[float] = []
            norms: List[torch.Tensor] = []
            params = [p for p in model.parameters() if p.requires_grad]
            start = time.perf_counter()
            threads = torch.get_num_threads()
            if device.type == "cpu" and cpu_threads is not None:
                torch.set_num_threads(cpu_threads)
            sampling = None
            if position_sampling is not None:
                ids_generator = torch.Generator().manual_seed(seed + 2)
                sampling = functools.partial(sample_positions, position_sampling, max_position=max_position,
                                             generator=ids_generator)
            try:
                _optimise(model, data, opt, params, losses, norms, steps, seq_len, batch_size, lr, warmup, grad_clip,
                          batches, device, progress, sampling)
            finally:
                torch.set_num_threads(threads)
            seconds = time.perf_counter() - start
            grad_norms = torch.stack(norms).tolist() if norms else []
            _check_weights(model, steps, lr)
            model.eval()

            if cache:
                state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
                _save_run(path, dict(state_dict=state, losses=losses, grad_norms=grad_norms, seconds=seconds,
                                     config=json.dumps(plan.keyed, default=str, sort_keys=True),
                                     digest=_run_digest(state, losses, grad_norms)))
            return TrainResult(model, losses, grad_norms, False, steps, seconds, key, config)


make_module_callable(__name__, train)
