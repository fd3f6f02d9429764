"""Evaluate a trained model at several lengths: the "train short, test long" measurement.

:func:`evaluate_lengths` measures loss, perplexity and accuracy of a trained
model at several evaluation lengths on fixed validation batches
(:func:`evaluation_batches`), as Press et al. (2022) evaluate ALiBi.
:func:`posenc.train` (in :mod:`posenc.train`, which re-exports both) trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from . import _evalcache
from .data import IGNORE_INDEX
from .model import TinyLM
from ._costs import accounted
from ._validate import check_bool, check_device_here, check_int, check_number, check_sequence
from .recall import AssociativeRecall
from .sampling import _check_sampling, sample_positions

__all__ = ["LengthResult", "evaluate_lengths", "evaluation_batches", "recall_accuracy"]


@dataclass
class LengthResult:
    """Evaluation at one length: ``loss`` (nats/token), ``ppl = exp(loss)``,
    ``accuracy`` (argmax = target), over ``tokens`` counted targets;
    ``position_loss`` is the ``(length,)`` mean loss at each position (NaN
    where no target counts)."""

    length: int
    loss: float
    ppl: float
    accuracy: float
    tokens: int
    position_loss: torch.Tensor = field(repr=False)


def _positive(name: str, value: Any, kind: type = int) -> Any:
    """``value`` as a positive Python int (or finite float, ``kind=float``): NumPy and 0-d tensors too."""
    if kind is float:
        return check_number(name, value, 0.0, what="")
    return check_int(name, value)


def _check_data(data: Any) -> None:
    if not (hasattr(data, "batch") and hasattr(data, "vocab_size") and hasattr(data, "config")):
        raise ValueError("data must have batch(batch_size, seq_len, generator), vocab_size and config "
                         f"(see posenc.data); got {type(data).__name__}")


def evaluation_batches(data: Any, length: int, batches: int = 4, seed: int = 1234, *,
                       batch_size: int = 8, split: str = "validation") -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """The ``(inputs, targets)`` batches that :func:`evaluate_lengths` uses at ``length``.

    ``batches`` batches of ``(batch_size, length)`` from ``data.batch`` with a
    generator seeded by ``seed``; use it to compare a model with a reference
    on exactly the same sequences (e.g. :meth:`posenc.data.MarkovChain.optimal_nll`).
    """
    _check_data(data)  # checked now, not at the first batch
    length, batches, batch_size = (_positive(name, value) for name, value in
                                   (("length", length), ("batches", batches), ("batch_size", batch_size)))
    seed = check_int("seed", seed, low=0)

    def draw() -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        for _ in range(batches):
            yield data.batch(batch_size, length, g, split=split)

    return draw()


@torch.no_grad()
def evaluate_lengths(
    model: TinyLM,
    data: Any,
    lengths: Sequence[int],
    batches: int = 4,
    seed: int = 1234,
    *,
    batch_size: int = 8,
    split: str = "validation",
    device: Optional[torch.device] = None,
    max_tokens: int = 16384,
    position_sampling: Optional[str] = None,
    max_position: Optional[int] = None,
    cache: bool = True,
) -> Dict[int, LengthResult]:
    """Loss, perplexity and accuracy of ``model`` at each evaluation length.

    For each length ``n`` the model reads ``batches * batch_size`` sequences
    of ``n`` tokens drawn from ``data`` (``split``) with a generator seeded by
    ``seed``: every model sees exactly the same sequences, the numbers are
    reproducible, and sources that draw sequences front to back (the Markov
    chain; nearly so the character corpora) give the *same* text at every
    length, cut at different places, so that differences between lengths are
    not sampling noise. As in Press et al. (2022)'s non-overlapping
    evaluation, the loss is the mean over all counted targets of a sequence
    (early positions, with little context, included); ``position_loss`` keeps
    the loss per position for finer views.

    Args:
        model: a trained :class:`~posenc.model.TinyLM`; its evaluation-time
            settings apply (``window``, ``sinks``, ``rope_scaling``, log-n scaling).
        data: a source from :mod:`posenc.data`.
        lengths: evaluation lengths (positive integers, duplicates removed).
        batches, batch_size: how many sequences per length.
        seed: seeds the evaluation batches.
        max_tokens: sequences per forward pass are limited to ``max_tokens // n``
            (at least one) to bound memory.
        position_sampling, max_position: ``None`` reads contiguous ids ``0 .. n-1``
            (as PoSE is evaluated); ``"randomized"`` draws sorted ids from
            ``[0, max_position)`` for every sequence, as Ruoss et al. evaluate
            (a generator seeded by ``seed``; ``max_position >= n``).
        cache: keep the result in the evaluation cache (``$POSENC_CACHE/evals``)
            and return it when the same weights, settings, data and arguments
            are evaluated again (:mod:`posenc._evalcache`; ``POSENC_EVAL_CACHE=0``
            turns it off everywhere). Each length is stored as soon as it is
            measured, so an interrupt or an error keeps the lengths before it.
        device: where the batches go; default: the device of the model's parameters.

    Raises:
        ValueError: before anything is measured, for a length beyond the
            model's ``max_len`` (a learned table), naming every such length;
            for a ``device`` this machine does not have (naming those it has);
            for a ``cache`` that is not ``True`` or ``False``.

    Returns:
        ``{n: LengthResult}`` in the order of ``lengths``.
    """
    if not isinstance(model, TinyLM):
        raise ValueError(f"model must be a posenc TinyLM, got {type(model).__name__}")
    _check_data(data)
    if data.vocab_size != model.vocab_size:  # as pe.train: another task's model gives a plausible, meaningless loss
        raise ValueError(f"data has vocab_size {data.vocab_size} but the model has {model.vocab_size}: evaluate a "
                         "model trained on this data")
    lengths = check_sequence("lengths", lengths, "positive integers")
    lengths = list(dict.fromkeys(_positive("every length", n) for n in lengths))
    if not lengths:
        raise ValueError("lengths must not be empty")
    batches = _positive("batches", batches)
    batch_size = _positive("batch_size", batch_size)
    max_tokens = _positive("max_tokens", max_tokens)
    if position_sampling not in (None, "randomized"):
        raise ValueError(f"position_sampling at evaluation must be None (contiguous ids; PoSE is evaluated so) or "
                         f"'randomized' (Ruoss et al.), got {position_sampling!r}")
    _check_sampling(position_sampling, max(lengths), max_position)  # max_position >= every length
    limit = model.max_len
    if limit is not None:  # every length checked before any is measured: nothing is computed, then lost
        too_long = [n for n in lengths if n > limit]
        if too_long:
            raise ValueError(f"lengths {too_long} exceed the longest input this model reads, max_len={limit} (the "
                             f"rows of its learned position table): evaluate at lengths <= {limit}")
        if max_position is not None and max_position > limit:
            raise ValueError(f"max_position {max_position} exceeds the model's max_len={limit} (the rows of its "
                             "learned position table)")
    seed = check_int("seed", seed, low=0)
    cache = check_bool("cache", cache)
    ids_generator = torch.Generator().manual_seed(seed + 1)
    device = next(model.parameters()).device if device is None else check_device_here(device)
    # one cache entry per length, written as soon as it is measured: an interrupt or an error at one length
    # keeps the lengths before it. Randomized ids come from one generator across the lengths, so such a
    # length's entry also names the lengths before it.
    sampled = position_sampling is not None
    parts = [dict(length=n, before=lengths[:i] if sampled else None) for i, n in enumerate(lengths)]
    keys = _evalcache.evaluation_keys("evaluate_lengths", model, data, device, parts, batches=batches, seed=seed,
                                      batch_size=batch_size, split=split, max_tokens=max_tokens,
                                      position_sampling=position_sampling,
                                      max_position=max_position) if cache else [None] * len(lengths)
    stored = {n: _evalcache.load(key, lambda saved, n=n: _length_result(saved, n)) for n, key in zip(lengths, keys)}
    if all(r is not None for r in stored.values()):
        return dict(stored)
    was_training = model.training
    model.eval()
    use_bf16 = torch.device(device).type == "cuda"
    out: Dict[int, LengthResult] = {}
    with accounted("evaluate"):  # the build's cost table (posenc._costs)
        try:
            for n, key in zip(lengths, keys):
                per_pass = max(1, min(batch_size, max_tokens // n))
                if stored[n] is not None:
                    out[n] = stored[n]
                    if sampled:  # the generator moves on as if this length had been measured
                        for rows in _passes(batches, batch_size, per_pass):
                            sample_positions(position_sampling, rows, n, max_position, ids_generator)
                    continue
                loss_sum = torch.zeros(n, dtype=torch.float64)
                count = torch.zeros(n, dtype=torch.float64)
                correct = 0
                for x_all, y_all in evaluation_batches(data, n, batches, seed, batch_size=batch_size, split=split):
                    for i in range(0, batch_size, per_pass):
                        x, y = x_all[i:i + per_pass].to(device), y_all[i:i + per_pass].to(device)
                        ids = sample_positions(position_sampling, x.shape[0], n, max_position, ids_generator)
                        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                            logits = model(x, positions=None if ids is None else ids.to(device))
                        logits = logits.float()
                        nll = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE_INDEX,
                                              reduction="none")  # (b, n), 0 where ignored
                        counted = y != IGNORE_INDEX
                        loss_sum += nll.sum(0).double().cpu()
                        count += counted.sum(0).double().cpu()
                        correct += int(((logits.argmax(-1) == y) & counted).sum())
                tokens = int(count.sum())
                if tokens == 0:
                    raise ValueError(f"no counted targets at length {n}")
                loss = float(loss_sum.sum() / tokens)
                position_loss = torch.where(count > 0, loss_sum / count.clamp(min=1),
                                            torch.full_like(count, float("nan")))
                out[n] = LengthResult(n, loss, math.exp(min(loss, 700.0)), correct / tokens, tokens, position_loss)
                _evalcache.save(key, [n, loss, out[n].ppl, out[n].accuracy, tokens, position_loss])
        finally:
            model.train(was_training)
    return out


def recall_accuracy(model: TinyLM, recall: AssociativeRecall, length: int, *, train_len: int, sequences: int = 128,
                    batch_size: int = 16, seed: int = 1234) -> float:
    """Associative recall tested beyond training: accuracy at ``length`` with every answer far back.

    The queries of ``recall`` (an :class:`~posenc.recall.AssociativeRecall`)
    are placed at least ``length - train_len`` tokens after the pairs, so that
    from ``2 * train_len`` on every answer lies further back than any distance
    the model saw in training (Arora et al., 2024, ask their queries anywhere;
    here the gap is the point). ``sequences`` sequences (a multiple of
    ``batch_size``) through :func:`evaluate_lengths`, cached like it; the
    model's evaluation-time settings apply.

    Returns:
        The fraction of queries answered with their value (chance: ``recall.chance``).
    """
    if not isinstance(recall, AssociativeRecall):
        raise ValueError(f"recall must be a posenc.AssociativeRecall, got {type(recall).__name__}")
    length, train_len, sequences, batch_size = (_positive(name, value) for name, value in (
        ("length", length), ("train_len", train_len), ("sequences", sequences), ("batch_size", batch_size)))
    if sequences % batch_size:
        raise ValueError(f"sequences must be a multiple of batch_size, got sequences={sequences}, batch_size={batch_size}")
    far = AssociativeRecall(**{**recall._options(), "min_gap": max(recall.min_gap, length - train_len)})
    # a length too short for the pairs, the gap and the queries is refused by far.batch (a ValueError naming them)
    return evaluate_lengths(model, far, [length], batches=sequences // batch_size, batch_size=batch_size,
                            seed=seed)[length].accuracy


def _passes(batches: int, batch_size: int, per_pass: int) -> Iterator[int]:
    """The rows of each forward pass at one length, in order (``batch_size`` split into passes of ``per_pass``)."""
    for _ in range(batches):
        for i in range(0, batch_size, per_pass):
            yield min(per_pass, batch_size - i)


def _length_result(saved: Any, n: int) -> LengthResult:
    """A cached :func:`evaluate_lengths` result at length ``n``, checked (raises if it does not fit).

    The loss must be a finite number >= 0 with ``ppl = exp(min(loss, 700))``
    (to rounding), the accuracy in [0, 1], the tokens positive, and
    ``position_loss`` ``(n,)`` floats, each finite or NaN (a position without
    a counted target), never infinite.
    """
    if not isinstance(saved, list) or len(saved) != 6 or saved[0] != n:
        raise ValueError("it holds another length")
    _, loss, ppl, accuracy, tokens, position_loss = saved
    problem = _length_problem(loss, ppl, accuracy, tokens, position_loss, n)
    if problem:
        raise ValueError(f"its result at length {n} is malformed ({problem})")
    return LengthResult(int(n), float(loss), float(ppl), float(accuracy), int(tokens), position_loss.double())


def _length_problem(loss: Any, ppl: Any, accuracy: Any, tokens: Any, position_loss: Any, n: int) -> str:
    """What is wrong with a stored result at length ``n`` (``""``: nothing)."""
    numbers = (loss, ppl, accuracy, tokens)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        return "loss, ppl, accuracy and tokens must be numbers"
    if not (math.isfinite(loss) and loss >= 0):
        return f"loss {loss!r} is not a finite number >= 0"
    if not math.isclose(ppl, math.exp(min(loss, 700.0)), rel_tol=1e-9):
        return f"ppl {ppl!r} is not exp(loss)"
    if not (0 <= accuracy <= 1 and isinstance(tokens, int) and tokens > 0):
        return f"accuracy {accuracy!r} or tokens {tokens!r} out of range"
    if not (isinstance(position_loss, torch.Tensor) and position_loss.shape == (n,)
            and position_loss.is_floating_point()):
        return f"position_loss is not ({n},) floats"
    if bool(torch.isinf(position_loss).any()):
        return "position_loss has infinite entries"
    return ""


# ``import posenc.train as m`` gives this module; ``pe.train(...)`` calls the function
