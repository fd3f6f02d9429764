"""Multi-query associative recall: a task whose answers lie far from where they are asked for.

The Markov chain of chapter 7 needs the last two tokens only, so it cannot
tell a scheme that reaches far from one that does not. Multi-query
associative recall (MQAR; Arora et al., 2024, "Zoology: Measuring and
Improving Recall in Efficient Language Models") is the field's standard probe
of recall: key-value pairs at the start of the sequence, then filler, and
later each key again, after which the model must produce its value::

    k3 v7 k1 v2 k5 v5 k0 v1   f f f f  k1 [v2] f f f f f f f  k0 [v1] f f  k5 [v5] f f f f  k3 [v7] f

Only the bracketed values count in the loss (the target at a repeated key is
its value; every other target is ignored), so :func:`posenc.evaluate_lengths`
reports the recall accuracy as ``accuracy``. Each key is asked for once and
the pairs are written once, so the only copy of an answer is in the pair
block: at length ``n`` the distance from a query to its pair grows up to
``n``, and a model evaluated at ``16 L`` must reach back ``16 L`` tokens. A
model that has lost the pairs guesses, at ``1 / n_values``.

The knobs: ``n_pairs`` (how many facts to hold), ``n_queries`` (how many are
asked for, each once), ``min_gap`` (no query nearer than that many tokens
after the pair block) and the filler's vocabulary. Solving it takes two
steps, as an induction head does (Olsson et al., 2022): find the earlier
occurrence of the query's key by content, and read the token after it.

A tiny model learns it slowly from the recall task alone: the small
preset sits for thousands of steps on a plateau where it answers with *some*
value of the pair block (about ``1 / n_pairs`` right), because the two steps
only pay off together. :class:`PeriodicSequence` teaches the same two steps
on sequences where every token is a target; a model warmed up on it for a
few hundred steps then learns the recall task within a few hundred more
(chapter 7).

Token ids: filler ``0 .. n_filler-1``, keys ``n_filler .. n_filler+n_keys-1``,
values after them; ``vocab_size = n_filler + n_keys + n_values``. The source
follows the protocol of :mod:`posenc.data` (``vocab_size``, ``batch``,
``config``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ._validate import check_int
from .data import IGNORE_INDEX, Batch, _check_batch_args, _check_generator

__all__ = ["AssociativeRecall", "PeriodicSequence"]


def _batch_request(batch_size: int, seq_len: int, split: str, generator: Optional[torch.Generator], min_len: int,
                   why: str) -> Tuple[int, int]:
    """The checked ``(batch_size, seq_len)`` of a ``batch`` call, ``seq_len`` at least ``min_len`` (``why`` says why)."""
    batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
    _check_generator(generator)
    if seq_len < min_len:
        raise ValueError(f"seq_len must be at least {min_len} ({why}), got {seq_len}")
    return batch_size, seq_len


class AssociativeRecall:
    """Multi-query associative recall (MQAR; Arora et al., 2024): recall values given far earlier.

    A sequence of ``seq_len`` tokens holds ``n_pairs`` pairs ``key value`` at
    positions ``0 .. 2 n_pairs - 1`` (distinct keys, values drawn with
    replacement), then uniform filler, with ``n_queries`` of the keys asked
    for again (each once, in random order) at random non-overlapping places
    ``t >= 2 n_pairs + min_gap``: ``inputs[t]`` is the key, ``targets[t]`` its
    value, ``inputs[t + 1]`` the value (so the text reads on as pairs do).
    Every other target is ignored (``-100``).

    Args:
        n_pairs: key-value pairs per sequence (``<= n_keys``).
        n_queries: keys asked for, each once (default: all ``n_pairs``).
        n_keys, n_values, n_filler: vocabulary sizes of the three kinds of token.
        min_gap: filler tokens at least between the pair block and the first query.

    >>> task = AssociativeRecall(n_pairs=4)
    >>> x, y = task.batch(2, 64, torch.Generator().manual_seed(0))
    >>> x.shape, int((y != -100).sum(1)[0]), task.min_len
    (torch.Size([2, 64]), 4, 16)
    """

    kind = "associative_recall"

    def __init__(self, n_pairs: int = 4, n_queries: Optional[int] = None, *, n_keys: int = 16,
                 n_values: int = 16, n_filler: int = 16, min_gap: int = 0) -> None:
        self.n_keys = check_int("n_keys", n_keys, 1)
        self.n_values = check_int("n_values", n_values, 2)
        self.n_filler = check_int("n_filler", n_filler, 1)
        self.n_pairs = check_int("n_pairs", n_pairs, 1)
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs must be at most n_keys (the keys of a sequence are distinct), "
                             f"got n_pairs={self.n_pairs} > n_keys={self.n_keys}")
        self.n_queries = self.n_pairs if n_queries is None else check_int("n_queries", n_queries, 1)
        if self.n_queries > self.n_pairs:
            raise ValueError(f"n_queries must be at most n_pairs (each key is asked for once), "
                             f"got n_queries={self.n_queries} > n_pairs={self.n_pairs}")
        self.min_gap = check_int("min_gap", min_gap, 0)
        self.key_offset = self.n_filler
        self.value_offset = self.n_filler + self.n_keys
        self.vocab_size = self.value_offset + self.n_values

    @property
    def min_len(self) -> int:
        """The shortest sequence that holds the pairs, the gap and every query with its value."""
        return 2 * self.n_pairs + self.min_gap + 2 * self.n_queries

    @property
    def chance(self) -> float:
        """The recall accuracy of a guess: ``1 / n_values``."""
        return 1.0 / self.n_values

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind=self.kind, **self._options())

    def _options(self) -> Dict[str, Any]:
        return dict(n_pairs=self.n_pairs, n_queries=self.n_queries, n_keys=self.n_keys, n_values=self.n_values,
                    n_filler=self.n_filler, min_gap=self.min_gap)

    def __repr__(self) -> str:
        return f"AssociativeRecall({', '.join(f'{k}={v}' for k, v in self._options().items())})"

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; ``seq_len >= min_len``.

        ``split`` is accepted for the common interface (the task has no held-out text).
        """
        batch_size, seq_len = _batch_request(batch_size, seq_len, split, generator, self.min_len,
                                             f"2 x {self.n_pairs} pair tokens, a gap of {self.min_gap}, "
                                             f"2 x {self.n_queries} query tokens")
        b, p, q = batch_size, self.n_pairs, self.n_queries
        rows = torch.arange(b)[:, None]
        keys = torch.rand(b, self.n_keys, generator=generator).argsort(dim=1)[:, :p] + self.key_offset  # (b, p)
        values = torch.randint(self.n_values, (b, p), generator=generator) + self.value_offset          # (b, p)
        inputs = torch.randint(self.n_filler, (b, seq_len), generator=generator)
        inputs[:, 0:2 * p:2], inputs[:, 1:2 * p:2] = keys, values
        asked = torch.rand(b, p, generator=generator).argsort(dim=1)[:, :q]                          # (b, q)
        # q non-overlapping two-token slots in [start, seq_len): q sorted distinct u in [0, free - q),
        # then t_j = start + u_j + j, so that t_{j+1} >= t_j + 2 and t_{q-1} <= seq_len - 2.
        start = 2 * p + self.min_gap
        free = seq_len - start
        u = torch.rand(b, free - q, generator=generator).argsort(dim=1)[:, :q].sort(dim=1).values
        t = start + u + torch.arange(q)                                                                # (b, q)
        inputs[rows, t] = keys.gather(1, asked)
        inputs[rows, t + 1] = values.gather(1, asked)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[rows, t] = values.gather(1, asked)
        return inputs, targets


class PeriodicSequence:
    """A block of distinct random tokens repeated to the end: the warm-up that teaches an induction head.

    Each sequence draws a period ``p`` uniformly from ``[min_period,
    max_period]`` and ``p`` distinct tokens ``b_0 .. b_{p-1}`` of the
    vocabulary, and repeats them: ``inputs[t] = b_{t mod p}``. From position
    ``p`` on, the current token has occurred one period earlier, and the next
    one is the token that followed it there: ``targets[t] = b_{(t+1) mod p}``
    for ``t >= p``; the first ``p`` targets are ignored (``-100``), since no
    earlier occurrence says what comes next. The period changes from sequence
    to sequence, so no fixed offset answers: the model must find the earlier
    occurrence of the current token by its content and read the token after
    it, the two-step circuit of an induction head (Olsson et al., 2022, "In-context
    Learning and Induction Heads"), which is also what
    :class:`AssociativeRecall` needs. Almost every position is a target, so the
    circuit forms within a few hundred steps of the small preset.

    Args:
        vocab_size: the tokens drawn from ``0 .. vocab_size-1`` (that of the
            task trained next, so that the same model serves both).
        min_period, max_period: the range of the period (``2 <= min_period <=
            max_period <= vocab_size``: the tokens of a block are distinct).

    >>> task = PeriodicSequence(8, min_period=3, max_period=3)
    >>> x, y = task.batch(1, 8, torch.Generator().manual_seed(0))
    >>> bool((x[0, 3:] == x[0, :5]).all())             # one block of 3, repeated
    True
    >>> y[0, :3].tolist(), bool((y[0, 3:7] == x[0, 4:8]).all())   # from position 3 on: the next token
    ([-100, -100, -100], True)
    """

    kind = "periodic_sequence"

    def __init__(self, vocab_size: int, *, min_period: int = 4, max_period: int = 16) -> None:
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.min_period = check_int("min_period", min_period, 2)
        self.max_period = check_int("max_period", max_period, 2)
        if not self.min_period <= self.max_period <= self.vocab_size:
            raise ValueError(f"need 2 <= min_period <= max_period <= vocab_size (a block holds distinct tokens), got "
                             f"min_period={self.min_period}, max_period={self.max_period}, vocab_size={self.vocab_size}")

    @property
    def min_len(self) -> int:
        """The shortest sequence with a target in every row: one token past the longest period."""
        return self.max_period + 1

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind=self.kind, **self._options())

    def _options(self) -> Dict[str, Any]:
        return dict(vocab_size=self.vocab_size, min_period=self.min_period, max_period=self.max_period)

    def __repr__(self) -> str:
        return f"PeriodicSequence({', '.join(f'{k}={v}' for k, v in self._options().items())})"

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; ``seq_len >= min_len``.

        ``split`` is accepted for the common interface (the task has no held-out text).
        """
        batch_size, seq_len = _batch_request(batch_size, seq_len, split, generator, self.min_len,
                                             "max_period + 1, so that every sequence has a target")
        period = torch.randint(self.min_period, self.max_period + 1, (batch_size, 1), generator=generator)  # (b, 1)
        block = torch.rand(batch_size, self.vocab_size, generator=generator).argsort(dim=1)[:, :self.max_period]
        t = torch.arange(seq_len)[None]                                                                   # (1, n)
        inputs = block.gather(1, (t % period).expand(batch_size, -1))                                     # (b, n)
        following = block.gather(1, ((t + 1) % period).expand(batch_size, -1))                            # b_{(t+1) mod p}
        targets = torch.where(t >= period, following, torch.full_like(following, IGNORE_INDEX))
        return inputs, targets
