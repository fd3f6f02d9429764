"""Flip-Flop: remember the last bit written, across any number of ignored instructions.

The flip-flop language of Liu, Ash, Goel, Krishnamurthy & Zhang ("Exposing
Attention Glitches with Flip-Flop Language Modeling", NeurIPS 2023) is a
sequence of instruction-bit pairs,

``w b  i b  i b  r b  w b  i b  r b ...``

with three instructions: ``w`` writes its bit to a one-bit memory, ``i``
ignores its bit, and ``r`` reads the memory: the bit after ``r`` is the bit of
the most recent ``w``. The first instruction is a write, so every read has an
answer; bits after ``w`` and ``i`` are uniform. Instructions are drawn
independently, ``i`` with probability ``p_ignore`` and ``w``, ``r`` with
``(1 - p_ignore) / 2`` each: the larger ``p_ignore``, the *sparser* the
sequence and the further a read lies from its write.

A model must find the nearest ``w`` among all earlier ones and copy the
bit after it. Counting tokens does not help, since the write can be any
number of tokens back, but "the nearest write" is a position counted on
writes alone: the task CoPE's authors use to show that positions counted by
the content succeed where token positions fail (Golovneva et al., 2024).

Trained on ``p_ignore = 0.8`` at length ``L``, a model is tested on
sparser sequences (``p_ignore = 0.98``, the paper's out-of-distribution
"sparse" test) and longer ones, where the last write lies further back than
any training read ever looked.

Token ids: ``w = 0``, ``r = 1``, ``i = 2``, bits ``0`` and ``1`` are ids 3 and
4; ``vocab_size = 5``. ``batch`` counts only the reads: the target at an
``r`` is the bit that follows it (a causal model predicts it from the
instruction, as at every read of the language), every other target is
``-100``. With ``read_last`` the last pair is always a read, so every
sequence asks at its very end.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from ._validate import check_bool
from .data import IGNORE_INDEX, Batch, _check_batch_args, _check_generator, _probability

__all__ = ["FlipFlop"]


class FlipFlop:
    """Flip-flop language modelling, scored on the reads (Liu et al., 2023).

    Args:
        p_ignore: probability of an ``i`` instruction; ``w`` and ``r`` have
            ``(1 - p_ignore) / 2`` each. In ``[0, 1)``: with ``p_ignore = 1``
            nothing would ever be read.
        read_last: make the last instruction a read (default True).

    >>> task = FlipFlop(p_ignore=0.8)
    >>> x, y = task.batch(2, 8, torch.Generator().manual_seed(0))
    >>> x.shape, int(x[0, 0]) == FlipFlop.WRITE, int(x[0, -2]) == FlipFlop.READ
    (torch.Size([2, 8]), True, True)
    """

    WRITE, READ, IGNORE, ZERO, ONE = 0, 1, 2, 3, 4
    vocab_size = 5

    def __init__(self, p_ignore: float = 0.8, *, read_last: bool = True) -> None:
        p_ignore = _probability("p_ignore", p_ignore)
        if p_ignore >= 1:
            raise ValueError(f"p_ignore must be below 1 (some instructions must write and read), got {p_ignore!r}")
        self.p_ignore, self.read_last = float(p_ignore), check_bool("read_last", read_last)

    @property
    def config(self) -> Dict[str, Any]:
        """Identifies the task (for caching)."""
        return dict(kind="flip_flop", p_ignore=self.p_ignore, read_last=self.read_last)

    def __repr__(self) -> str:
        return f"FlipFlop(p_ignore={self.p_ignore:g}, read_last={self.read_last})"

    def batch(self, batch_size: int, seq_len: int, generator: Optional[torch.Generator] = None,
              *, split: str = "train") -> Batch:
        """``(inputs, targets)``, each ``(batch_size, seq_len)`` int64; ``seq_len`` even and ``>= 4``.

        ``split`` is accepted for a common interface: every sequence is new.
        """
        batch_size, seq_len = _check_batch_args(batch_size, seq_len, split)
        _check_generator(generator)
        if seq_len < 4 or seq_len % 2:
            raise ValueError(f"seq_len must be even and >= 4 (instruction-bit pairs, a write then a read), got {seq_len}")
        pairs = seq_len // 2
        draw = torch.rand(batch_size, pairs, generator=generator)
        p_write = (1 - self.p_ignore) / 2
        instructions = torch.full((batch_size, pairs), self.IGNORE, dtype=torch.long)
        instructions[draw < 2 * p_write] = self.READ
        instructions[draw < p_write] = self.WRITE
        instructions[:, 0] = self.WRITE
        if self.read_last:
            instructions[:, -1] = self.READ
        bits = torch.randint(2, (batch_size, pairs), generator=generator)
        _, last_write = self._last_write(instructions)
        reads = instructions == self.READ
        bits = torch.where(reads, bits.gather(1, last_write), bits)
        inputs = torch.stack([instructions, bits + self.ZERO], dim=2).view(batch_size, seq_len)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, 0::2] = torch.where(reads, bits + self.ZERO, IGNORE_INDEX)
        return inputs, targets

    def read_distances(self, inputs: torch.Tensor) -> torch.Tensor:
        """For every read of ``inputs`` (from :meth:`batch`), the tokens from its write's bit to its own bit.

        Returns a 1-d int64 tensor, one entry per read, in reading order.
        """
        if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2 or inputs.shape[1] % 2:
            raise ValueError(f"inputs must be a (batch, seq_len) tensor of FlipFlop sequences, seq_len even, got "
                             f"{getattr(inputs, 'shape', type(inputs).__name__)}")
        instructions = inputs[:, 0::2]
        index, last_write = self._last_write(instructions)
        return 2 * (index - last_write)[instructions == self.READ]

    def _last_write(self, instructions: torch.Tensor):
        """``(index, last_write)``: each pair's index and that of the latest write up to it, ``(batch, pairs)``.

        A running max of the indices of the writes (pair 0 is one, or 0 where none has come yet).
        """
        index = torch.arange(instructions.shape[1]).expand_as(instructions)
        return index, torch.where(instructions == self.WRITE, index, 0).cummax(dim=1).values
