"""Explicit ``O(n^2)`` attention one sequence at a time, on the CPU when no gradient is recorded.

CoPE and stick-breaking attention form their ``(heads, n, n)`` scores
explicitly and stream several tensors of that size through memory per layer
(gates, counted positions, indices, logits, weights). Over a whole batch those
tensors overflow the CPU's caches; one sequence's may not, and each sequence's
rows are computed on their own, so splitting the batch changes no number.
``benchmarks/per_sequence.py`` measures the gain on the machine it runs on.
During training (a gradient is recorded) the batch stays whole: autograd keeps
the tensors anyway, and a GPU is best given the whole batch.
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple, Union

import torch

# Below this many score entries per sequence (heads x n x n: 4 heads at 128 tokens) one call is kept.
_MIN_SCORES = 1 << 16


def split_by_sequence(q: torch.Tensor, k: torch.Tensor, tensors: Sequence[torch.Tensor]) -> bool:
    """Whether to run ``(batch, heads, seq, ...)`` inputs one sequence at a time (see the module)."""
    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return (q.device.type == "cpu" and q.shape[0] > 1 and not recorded
            and q.shape[1] * q.shape[2] * k.shape[2] >= _MIN_SCORES)


def per_sequence(attend: Callable[[int], Union[torch.Tensor, Tuple[torch.Tensor, ...]]],
                 batch: int) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """``attend(b)`` for every sequence ``b`` (each returns its ``(1, ...)`` output, or a tuple), concatenated."""
    outs = [attend(b) for b in range(batch)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs))
    return torch.cat(outs)
