"""RULER-like retrieval tasks: several keys, several values, a chain of assignments.

One passkey is the easiest long-context test there is. RULER (Hsieh et al.,
2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?") adds variants that a model passing the single needle still fails;
here three of them, in tokens a tiny model can learn from scratch (the answer
is at the end, only it counts in the loss, exact match over all its tokens)::

    multi-key       f f KEY n3 d d f f KEY n1 d d f ... KEY n7 d d f f  QUERY n1  d d
    multi-value     f f KEY n d d f f f KEY n d d f ... KEY n d d f f   QUERY n   d d d d d d
    variable track  f VAR a d d f VAR x d d f VAR b a f VAR c b f ...   QUERY d d a b c

* :class:`MultiKeyRetrieval`: ``n_keys`` records ``KEY name value`` with
  distinct names; the query names one of them.
* :class:`MultiValueRetrieval`: ``n_values`` records of one name; the answer
  is every value, in the order they appeared.
* :class:`VariableTracking`: ``n_chains`` chains of assignments: ``VAR a =
  value``, then ``VAR b = a``, ``VAR c = b``, ... (``n_hops`` copies); the
  query gives a value, the answer is its chain's variables in order.

Each follows the data-source protocol of :mod:`posenc.data` (``vocab_size``,
``batch``, ``config``) and :func:`posenc.passkey_accuracy`'s (``answer_len``,
``min_len``, ``batch(..., depth=)``): ``depth`` places the queried record (the
first record of its chain or name) at that fraction of the filler; the other
records fall uniformly in the filler (a chain keeps its order). Token ids:
filler ``0 .. n_filler-1``, then ``n_digits`` digits, ``n_names`` names, and
the markers (``KEY``/``VAR``, ``QUERY``). Records never overlap.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from ._validate import check_int
from .data import IGNORE_INDEX, Batch, _check_batch_args, _check_generator
from .passkey import _check_depth

__all__ = ["MultiKeyRetrieval", "MultiValueRetrieval", "VariableTracking"]


class _Records:
    """Shared layout: records inserted into filler, a query and an answer at the end."""

    kind = ""

    def __init__(self, key_len: int, n_digits: int, n_filler: int, n_names: int) -> None:
        self.key_len = check_int("key_len", key_len, 1)
        self.n_digits = check_int("n_digits", n_digits, 2)
        self.n_filler = check_int("n_filler", n_filler, 1)
        self.n_names = check_int("n_names", n_names, 1)
        self.digit_offset = self.n_filler
        self.name_offset = self.n_filler + self.n_digits
        self.key_token = self.name_offset + self.n_names
        self.query_token = self.key_token + 1
        self.vocab_size = self.query_token + 1

    # what each task defines: its records (the queried one first), the query and the answer
    def _draw(self, g: torch.Generator) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind=self.kind, **self._options())

    def _options(self) -> Dict[str, Any]:
        return dict(key_len=self.key_len, n_digits=self.n_digits, n_filler=self.n_filler, n_names=self.n_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self._options().items())})"

    def _digits(self, g: torch.Generator) -> List[int]:
        return (torch.randint(self.n_digits, (self.key_len,), generator=g) + self.digit_offset).tolist()

    def _distinct_values(self, count: int, g: torch.Generator) -> List[List[int]]:
        if count > self.n_digits ** self.key_len:
            raise ValueError(f"{count} distinct values need n_digits ** key_len >= {count}")
        values: List[List[int]] = []
        while len(values) < count:
            value = self._digits(g)
            if value not in values:
                values.append(value)
        return values

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train", depth: Optional[float] = None) -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; targets only on the answer."""
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        depth = _check_depth(depth)
        if seq_len < self.min_len:
            raise ValueError(f"seq_len must be >= {self.min_len} for {self!r} (its records, query and answer), "
                             f"got {seq_len}")
        g = generator  # None: torch's global generator, as the other tasks
        total = seq_len + 1  # inputs and targets are one sequence, shifted
        rows = []
        for _ in range(batch_size):
            groups, query, answer = self._draw(g)  # groups: lists of records, each kept in order; queried first
            tail = [self.query_token, *query, *answer]
            filler = total - len(tail) - sum(len(r) for group in groups for r in group)
            first = (round(depth * filler) if depth is not None
                     else int(torch.randint(filler + 1, (1,), generator=g)))
            # insertion points into the filler: the queried group's first record at `first`, its later records
            # after it; every other group's records at sorted uniform points (a group keeps its order)
            # at a tie the queried record goes to the side its depth points to (first at depth 0, last at 1)
            points, rank = [], [-1.0 if 2 * first <= filler else 2.0] + torch.rand(len(groups) - 1, generator=g).tolist()
            for index, group in enumerate(groups):
                low = first if index == 0 else 0
                cuts = sorted(torch.randint(low, filler + 1, (len(group),), generator=g).tolist())
                if index == 0:
                    cuts[0] = first
                points += [(cut, index, j) for j, cut in enumerate(cuts)]
            points.sort(key=lambda p: (p[0], rank[p[1]], p[2]))  # a group's records in their order
            noise = torch.randint(self.n_filler, (filler,), generator=g).tolist()
            seq, at = [], 0
            for cut, index, j in points:
                seq += noise[at:cut] + groups[index][j]
                at = cut
            rows.append(seq + noise[at:] + tail)
        seq = torch.tensor(rows, dtype=torch.long)
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        targets[:, : seq_len - self.answer_len] = IGNORE_INDEX  # only the answer counts
        return inputs, targets


class MultiKeyRetrieval(_Records):
    """``n_keys`` records ``KEY name value`` (distinct names); ``QUERY name`` asks for one value (RULER's MK-NIAH).

    Args:
        n_keys: records per sequence (``>= 1``; 1 is a passkey with a name).
        key_len: digits in a value. n_digits: distinct digit tokens.
        n_filler: distinct filler tokens. n_names: distinct names (``>= n_keys``).

    >>> task = MultiKeyRetrieval(n_keys=3, key_len=2, n_digits=4, n_filler=3, n_names=5)
    >>> x, y = task.batch(1, task.min_len, torch.Generator().manual_seed(0), depth=0.0)
    >>> x[0, :2].tolist() == [task.key_token, x[0, -2].item()] and x[0, 2:4].tolist() == y[0, -2:].tolist()
    True
    """

    kind = "multi_key"

    def __init__(self, n_keys: int = 4, key_len: int = 1, n_digits: int = 10, n_filler: int = 16,
                 n_names: int = 16) -> None:
        super().__init__(key_len, n_digits, n_filler, n_names)
        self.n_keys = check_int("n_keys", n_keys, 1)
        if self.n_names < self.n_keys:
            raise ValueError(f"n_names ({self.n_names}) must be >= n_keys ({self.n_keys}): the names are distinct")
        self.answer_len = self.key_len
        self.min_len = self.n_keys * (self.key_len + 2) + 2 + self.key_len

    def _options(self) -> Dict[str, Any]:
        return dict(n_keys=self.n_keys, **super()._options())

    def _draw(self, g):
        names = (torch.randperm(self.n_names, generator=g)[: self.n_keys] + self.name_offset).tolist()
        values = [self._digits(g) for _ in names]
        groups = [[[self.key_token, name, *value]] for name, value in zip(names, values)]
        return groups, [names[0]], values[0]


class MultiValueRetrieval(_Records):
    """``n_values`` records ``KEY name value`` of one name; ``QUERY name`` asks for all values, in order (MV-NIAH).

    The values are distinct; ``depth`` places the first record; the answer is
    ``n_values * key_len`` tokens.
    """

    kind = "multi_value"

    def __init__(self, n_values: int = 3, key_len: int = 1, n_digits: int = 10, n_filler: int = 16,
                 n_names: int = 8) -> None:
        super().__init__(key_len, n_digits, n_filler, n_names)
        self.n_values = check_int("n_values", n_values, 1)
        if self.n_values > self.n_digits ** self.key_len:
            raise ValueError(f"n_values ({self.n_values}) distinct values need n_digits ** key_len >= {self.n_values}")
        self.answer_len = self.n_values * self.key_len
        self.min_len = self.n_values * (self.key_len + 2) + 2 + self.answer_len

    def _options(self) -> Dict[str, Any]:
        return dict(n_values=self.n_values, **super()._options())

    def _draw(self, g):
        name = int(torch.randint(self.n_names, (1,), generator=g)) + self.name_offset
        values = self._distinct_values(self.n_values, g)
        return [[[self.key_token, name, *value] for value in values]], [name], [t for v in values for t in v]


class VariableTracking(_Records):
    """Chains ``VAR a value``, ``VAR b a``, ``VAR c b``, ...; ``QUERY value`` asks for a chain's names (RULER's VT).

    Args:
        n_hops: copies per chain after its first assignment (the answer has
            ``n_hops + 1`` names).
        n_chains: chains per sequence, with distinct values and names.

    ``key_token`` is ``VAR``. Records of one chain keep their order, chains
    interleave; ``depth`` places the queried chain's first assignment.
    """

    kind = "variable_tracking"

    def __init__(self, n_hops: int = 2, n_chains: int = 2, key_len: int = 1, n_digits: int = 10,
                 n_filler: int = 16, n_names: int = 16) -> None:
        super().__init__(key_len, n_digits, n_filler, n_names)
        self.n_hops = check_int("n_hops", n_hops, 0)
        self.n_chains = check_int("n_chains", n_chains, 1)
        if self.n_names < self.n_chains * (self.n_hops + 1):
            raise ValueError(f"n_names ({self.n_names}) must be >= n_chains * (n_hops + 1) = "
                             f"{self.n_chains * (self.n_hops + 1)}: every variable has its own name")
        if self.n_chains > self.n_digits ** self.key_len:
            raise ValueError(f"n_chains ({self.n_chains}) needs as many distinct values: n_digits ** key_len >= "
                             f"{self.n_chains}")
        self.answer_len = self.n_hops + 1
        self.min_len = self.n_chains * ((self.key_len + 2) + 3 * self.n_hops) + 1 + self.key_len + self.answer_len

    def _options(self) -> Dict[str, Any]:
        return dict(n_hops=self.n_hops, n_chains=self.n_chains, **super()._options())

    def _draw(self, g):
        names = (torch.randperm(self.n_names, generator=g)[: self.n_chains * (self.n_hops + 1)]
                 + self.name_offset).view(self.n_chains, self.n_hops + 1).tolist()
        values = self._distinct_values(self.n_chains, g)
        groups = [[[self.key_token, chain[0], *value]] + [[self.key_token, b, a] for a, b in zip(chain, chain[1:])]
                  for chain, value in zip(names, values)]
        return groups, values[0], names[0]
