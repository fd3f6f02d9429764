"""Even Pairs: is the number of ``ab`` and ``ba`` pairs so far even? Answered at every position.

Even Pairs is the first of the regular-language tasks of Delétang et al.
("Neural Networks and the Chomsky Hierarchy", ICLR 2023), one of the fifteen on
which Ruoss et al. ("Randomized Positional Encodings Boost Length
Generalization of Transformers", ACL 2023) test randomized position ids: given
a string over ``{a, b}``, say whether it contains an even number of the pairs
``ab`` and ``ba``. Every such pair is a change of symbol, and a string that
changes an even number of times ends on the symbol it started with, so

``even(w_0 .. w_t)  <=>  w_t == w_0``.

The answer is one comparison with the *first* token, however far back it is:
a test of whether a model still finds position 0 from distances it was never
trained at, with a chance level of 1/2.

Ruoss et al. classify each string once, at its end, with an encoder. A causal
language model answers every prefix: here the target at position ``t`` is the
answer for ``w_0 .. w_t``, so one sequence of ``n`` tokens asks ``n``
questions, at distances ``0 .. n - 1`` from the first token. With
``labels_from = L`` the positions before ``L`` are not scored (``-100``), and
an evaluation at ``n > L`` counts only the answers whose first token lies
further back than any distance of training.

Token ids: ``a = 0``, ``b = 1``, the answers ``EVEN = 2`` and ``ODD = 3``;
``vocab_size = 4``. Inputs are ``a`` and ``b`` only, i.i.d. uniform.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from ._validate import check_int
from .data import IGNORE_INDEX, Batch, _check_batch_args, _check_generator

__all__ = ["EvenPairs"]


class EvenPairs:
    """Even Pairs (Delétang et al., 2023; Ruoss et al., 2023), answered at every position.

    Args:
        labels_from: positions before this one get the target ``-100`` (not
            scored); 0 (default) scores every position. A batch must be longer
            than ``labels_from``.

    >>> x, y = EvenPairs().batch(1, 6, torch.Generator().manual_seed(0))
    >>> bool(((y == EvenPairs.EVEN) == (x == x[:, :1])).all())
    True
    """

    A, B, EVEN, ODD = 0, 1, 2, 3
    vocab_size = 4
    kind = "even_pairs"
    #: Accuracy of a guess: the two answers are equally likely beyond position 0.
    chance = 0.5

    def __init__(self, labels_from: int = 0) -> None:
        self.labels_from = check_int("labels_from", labels_from, 0)

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind=self.kind, labels_from=self.labels_from)

    def __repr__(self) -> str:
        return f"EvenPairs(labels_from={self.labels_from})"

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; ``seq_len > labels_from``.

        ``split`` is accepted for a common interface: every sequence is new.
        """
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        if seq_len <= self.labels_from:
            raise ValueError(f"seq_len must be greater than labels_from = {self.labels_from} (else no position is "
                             f"scored), got {seq_len}")
        inputs = torch.randint(2, (batch_size, seq_len), generator=generator)
        targets = torch.where(inputs == inputs[:, :1], self.EVEN, self.ODD)   # even number of changes <=> back to w_0
        targets[:, :self.labels_from] = IGNORE_INDEX
        return inputs, targets
