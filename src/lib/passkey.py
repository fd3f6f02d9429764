"""Passkey retrieval: a key hidden at some depth in filler, asked for at the end.

The standard sanity check of long-context models (Mohtashami & Jaggi, 2023,
"Landmark Attention"; used by Peng et al., 2024, for YaRN): a random number is
hidden among irrelevant text and the model must repeat it when asked. Accuracy
by (context length x depth of the key) is drawn as a heat map: a model that
cannot reach, or tell apart, positions beyond its training length fails in the
top rows, often first for keys far from the question.

Here, in tokens a tiny model can learn from scratch::

    f f f ... f  KEY d1 d2 .. dk  f f ... f  QUERY d1 d2 .. dk
    <- depth ->                              <- answer (targets) ->

Token ids: ``0 .. n_filler-1`` filler (i.i.d. uniform), then ``n_digits``
digit tokens, then ``KEY`` and ``QUERY``; the key is ``key_len`` uniformly
random digits. Only the answer counts in the loss: the target at ``QUERY``
is ``d1``, at ``d1`` it is ``d2``, and so on. A model answers correctly when
its argmax is right at every answer position (exact match; with teacher
forcing this equals greedy decoding). The task needs a content look-up
(find ``KEY``) and a relative one (copy the token after it, then the next).

:class:`PasskeyRetrieval` follows the data-source protocol of
:mod:`posenc.data` (``vocab_size``, ``batch``, ``config``), so ``pe.train``
trains on it; :func:`passkey_accuracy` measures the heat map (on the sequences
:func:`passkey_sequences` gives), and
:func:`effective_length` reads off the longest length a model still serves.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from . import _evalcache
from ._costs import accounted
from ._validate import check_bool, check_device_here, check_int, check_number, check_sequence
from .data import IGNORE_INDEX, Batch, _check_batch_args, _check_generator

__all__ = ["PasskeyRetrieval", "passkey_sequences", "passkey_accuracy", "effective_length"]


def _check_depth(depth: Any) -> Optional[float]:
    if depth is None:
        return None
    what = " in [0, 1] (0: the key first, 1: right before the question) or None (uniform)"
    value = check_number("depth", depth, what=what)
    if not 0 <= value <= 1:
        raise ValueError(f"depth must be a number{what}, got {depth!r}")
    return value


class PasskeyRetrieval:
    """Find the key after ``KEY`` in filler and repeat it after ``QUERY`` (Mohtashami & Jaggi, 2023).

    Args:
        key_len: digits in a key (``k >= 1``).
        n_digits: distinct digit tokens (``>= 2``; 10 for decimal keys).
        n_filler: distinct filler tokens (``>= 1``).

    ``vocab_size = n_filler + n_digits + 2``; sequences need ``seq_len >=
    min_len = 2 key_len + 2`` tokens. ``batch(..., depth=None)`` draws the
    depth (the fraction of the filler placed before the key) uniformly per
    sequence; a number in ``[0, 1]`` fixes it. ``split`` is accepted for the
    common interface (pass different generators for validation).

    >>> task = PasskeyRetrieval(key_len=2, n_digits=4, n_filler=3)
    >>> x, y = task.batch(1, 9, torch.Generator().manual_seed(0), depth=0.0)
    >>> x[0, :3].tolist() == [task.key_token, *y[0, -2:].tolist()]
    True
    """

    def __init__(self, key_len: int = 4, n_digits: int = 10, n_filler: int = 16) -> None:
        key_len, n_digits, n_filler = (check_int(name, value, low) for name, value, low in
                                       (("key_len", key_len, 1), ("n_digits", n_digits, 2), ("n_filler", n_filler, 1)))
        self.key_len, self.n_digits, self.n_filler = key_len, n_digits, n_filler
        self.digit_offset = n_filler
        self.key_token = n_filler + n_digits
        self.query_token = self.key_token + 1
        self.vocab_size = self.query_token + 1
        self.min_len = 2 * key_len + 2
        self.answer_len = key_len

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind="passkey", key_len=self.key_len, n_digits=self.n_digits, n_filler=self.n_filler)

    def __repr__(self) -> str:
        return f"PasskeyRetrieval(key_len={self.key_len}, n_digits={self.n_digits}, n_filler={self.n_filler})"

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train", depth: Optional[float] = None) -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; targets only on the answer."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        depth = _check_depth(depth)
        if seq_len < self.min_len:
            raise ValueError(f"seq_len must be >= {self.min_len} (KEY, {self.key_len} digits, QUERY and the "
                             f"answer), got {seq_len}")
        k, total = self.key_len, seq_len + 1  # inputs and targets are one sequence, shifted
        filler = total - (2 * k + 2)
        seq = torch.randint(self.n_filler, (batch_size, total), generator=generator)
        keys = torch.randint(self.n_digits, (batch_size, k), generator=generator) + self.digit_offset
        if depth is None:
            before = (torch.rand(batch_size, generator=generator) * (filler + 1)).long().clamp(max=filler)
        else:
            before = torch.full((batch_size,), round(depth * filler), dtype=torch.long)
        rows = torch.arange(batch_size)[:, None]
        key_at = before[:, None] + torch.arange(1, k + 1)  # digit positions after KEY
        seq[torch.arange(batch_size), before] = self.key_token
        seq[rows, key_at] = keys
        seq[:, total - k - 1] = self.query_token
        seq[:, total - k:] = keys
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        targets[:, : seq_len - k] = IGNORE_INDEX  # only the answer counts
        return inputs, targets


def passkey_sequences(data: PasskeyRetrieval, length: int, depth: float, samples: int = 32, seed: int = 0) -> Batch:
    """The ``(inputs, targets)`` that :func:`passkey_accuracy` scores in its cell ``(length, depth)``.

    ``samples`` sequences of ``data.batch(samples, length, split="validation",
    depth=depth)``, from a generator seeded by ``seed`` and the cell: every
    model meets the same ones, and a reader who scores them another way (which
    record's value a model copied, say) reads exactly those.

    Returns:
        ``inputs`` and ``targets``, each ``(samples, length)``; the answer is in
        the last ``data.answer_len`` targets.
    """
    _check_task(data)
    checked = _check_depth(depth)
    if checked is None:
        raise ValueError(f"depth must be a number in [0, 1], got {depth!r}")
    return _cell(data, check_int("length", length, low=data.min_len), checked, check_int("samples", samples),
                 check_int("seed", seed, low=0))


def _check_task(data: Any) -> None:
    if not all(hasattr(data, a) for a in ("answer_len", "min_len", "batch")):
        raise ValueError(f"data must be a posenc.PasskeyRetrieval or another retrieval task with answer_len, min_len "
                         f"and batch(..., depth=) (posenc.MultiKeyRetrieval, ...), got {type(data).__name__}")


def _cell(data: Any, length: int, depth: float, samples: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed * 1_000_003 + length * 1009 + round(depth * 1000))
    return data.batch(samples, length, g, split="validation", depth=depth)


@torch.no_grad()
def passkey_accuracy(
    model: Any,
    data: PasskeyRetrieval,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    samples: int = 32,
    seed: int = 0,
    *,
    batch_size: int = 32,
    device: Optional[torch.device] = None,
    cache: bool = True,
) -> torch.Tensor:
    """Exact-match accuracy of ``model`` on passkey retrieval, by length and depth.

    For each ``(length, depth)`` cell, ``samples`` sequences from
    ``data.batch(..., depth=depth)`` with a generator seeded from ``seed`` and
    the cell (reproducible, the same for every model); a sequence counts as
    correct when the argmax of the logits is the right digit at every answer
    position.

    Args:
        model: maps ``(batch, seq)`` token ids to ``(batch, seq, vocab)`` logits
            (a :class:`posenc.TinyLM`; its window, sinks and rope scaling apply).
        data: the task the model was trained on: a :class:`PasskeyRetrieval` or
            one of :mod:`posenc.ruler`'s (every answer token must be right).
        lengths: context lengths (each ``>= data.min_len``).
        depths: key depths in ``[0, 1]``.
        samples: sequences per cell.
        seed: seeds the sequences.
        batch_size: sequences per forward pass.
        device: default: the device of the model's parameters (CPU if none).
        cache: keep the result in the evaluation cache and return it when the
            same weights, settings, task and arguments come again (as
            :func:`posenc.evaluate_lengths`; a model that is not a
            ``torch.nn.Module`` is never cached).

    Returns:
        ``(len(lengths), len(depths))`` float64 tensor of accuracies in ``[0, 1]``
        (rows: lengths, columns: depths), ready for a heat map.

    Raises:
        ValueError: for a ``model`` that cannot be called (a
            :class:`posenc.TrainResult`: pass ``result.model``), ``lengths`` or
            ``depths`` that are not non-empty sequences of valid values, a
            ``device`` this machine does not have (naming those it has), or a
            ``cache`` that is not ``True`` or ``False``.
    """
    _check_model(model)
    _check_task(data)
    vocab = getattr(model, "vocab_size", None)
    if isinstance(vocab, int) and vocab != data.vocab_size:  # a model of another task: its digits mean nothing here
        raise ValueError(f"the model reads a vocabulary of {vocab} tokens but the task has vocab_size "
                         f"{data.vocab_size}: evaluate a model trained on this task")
    lengths = check_sequence("lengths", lengths, "context lengths (integers)")
    depths = [_check_depth(d) for d in check_sequence("depths", depths, "key depths (numbers in [0, 1])")]
    if not lengths or not depths or any(d is None for d in depths):
        raise ValueError("lengths and depths must be non-empty sequences (depths of numbers in [0, 1])")
    samples, batch_size = check_int("samples", samples), check_int("batch_size", batch_size)
    seed = check_int("seed", seed, low=0)
    lengths = [check_int("every length", n, low=data.min_len) for n in lengths]
    cache = check_bool("cache", cache)
    if device is None:
        device = next((p.device for p in getattr(model, "parameters", lambda: iter(()))()), torch.device("cpu"))
    else:
        device = check_device_here(device)
    key = _evalcache.evaluation_key("passkey_accuracy", model, data, device, lengths=lengths, depths=depths,
                                    samples=samples, seed=seed, batch_size=batch_size) if cache else None
    shape = (len(lengths), len(depths))
    stored = _evalcache.load(key, lambda saved: _accuracy_grid(saved, shape))
    if stored is not None:
        return stored
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    out = torch.zeros(len(lengths), len(depths), dtype=torch.float64)
    with accounted("evaluate"):
        for a, n in enumerate(lengths):
            for b, depth in enumerate(depths):
                x, y = _cell(data, n, depth, samples, seed)
                correct = 0
                for i in range(0, samples, batch_size):
                    xb, yb = x[i:i + batch_size].to(device), y[i:i + batch_size].to(device)
                    pred = _logits(model, xb, data.vocab_size)[:, -data.answer_len:].argmax(-1)
                    correct += int((pred == yb[:, -data.answer_len:]).all(-1).sum())
                out[a, b] = correct / samples
    if hasattr(model, "train"):
        model.train(was_training)
    _evalcache.save(key, out)
    return out


def _logits(model: Any, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``model(ids)``, checked: ``(batch, seq, vocab >= vocab_size)`` logits (another layout would be read wrong)."""
    out = model(ids)
    if not isinstance(out, torch.Tensor) or out.ndim != 3 or tuple(out.shape[:2]) != tuple(ids.shape) \
            or out.shape[2] < vocab_size:
        raise ValueError(f"model must map {tuple(ids.shape)} token ids to ({ids.shape[0]}, {ids.shape[1]}, vocab >= "
                         f"{vocab_size}) logits, got {tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    return out


def _check_model(model: Any) -> None:
    """``ValueError`` unless ``model`` can be called on token ids (a TrainResult is told to pass its ``model``)."""
    if callable(model):
        return
    hint = ": pass result.model" if callable(getattr(model, "model", None)) else ""
    raise ValueError(f"model must map (batch, seq) token ids to (batch, seq, vocab) logits (a posenc.TinyLM), "
                     f"got {type(model).__name__}{hint}")


def _accuracy_grid(saved: Any, shape: tuple) -> torch.Tensor:
    """A cached :func:`passkey_accuracy` grid, checked (raises if it is not a grid of accuracies of ``shape``)."""
    if not (isinstance(saved, torch.Tensor) and saved.dtype == torch.float64 and tuple(saved.shape) == shape
            and bool(((saved >= 0) & (saved <= 1)).all())):
        raise ValueError(f"it is not a {shape} grid of accuracies")
    return saved


def _score(length: int, value: Any) -> float:
    value = getattr(value, "accuracy", value)  # a posenc.LengthResult counts by its accuracy
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"the score at length {length} must be one number, got a tensor of shape "
                             f"{tuple(value.shape)} (average a passkey grid over its depths first: grid.mean(1))")
        value = value.item()
    return check_number(f"the score at length {length}", value)


def effective_length(scores: Any, threshold: float = 0.85) -> Optional[int]:
    """The longest evaluated length up to which the score never falls below ``threshold`` (RULER's notion).

    Hsieh et al., 2024 ("RULER: What's the Real Context Size of Your
    Long-Context Language Models?") call a model's *effective* context
    length the longest length at which it still performs above a threshold
    (theirs: Llama-2-7B's score at 4K, 85.6%), against the *claimed* length it
    was trained or extended for. Here every evaluated length up to it must
    pass too, so a dip followed by a lucky recovery does not count.

    Args:
        scores: ``{length: score}``; a score is a number in [0, 1] (an
            accuracy), a one-element tensor, or anything with an ``accuracy``
            attribute (a :class:`posenc.LengthResult`), e.g. the dict
            :func:`posenc.evaluate_lengths` returns. For a ``(lengths, depths)``
            :func:`passkey_accuracy` grid pass ``dict(zip(lengths, grid.mean(1)))``
            (or ``grid.min(1).values``: every depth must pass).
        threshold: the score a length must reach, in (0, 1].

    Returns:
        the length, or ``None`` when the shortest one already fails.

    >>> effective_length({64: 1.0, 128: 0.97, 256: 0.6, 512: 0.9})
    128
    """
    threshold = check_number("threshold", threshold, 0, what=" and <= 1")
    if threshold > 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if not isinstance(scores, dict) or not scores:
        raise ValueError("scores must be a non-empty dict {length: score}, e.g. pe.evaluate_lengths(...)")
    best = None
    for length in sorted(check_int("every length", n, low=1) for n in scores):
        value = _score(length, scores[length])
        if not 0 <= value <= 1:
            raise ValueError(f"the score at length {length} must be in [0, 1] (an accuracy), got {value!r}")
        if value < threshold:
            break
        best = length
    return best
