"""Position ids sampled at training time, so that a short window sees the positions of a long one.

A model trained on sequences of ``L`` tokens at positions ``0 .. L-1`` meets
positions (and, for relative schemes, distances) beyond ``L - 1`` only when
it is tested longer. Two training-time remedies keep the window of ``L``
tokens and change the ids they carry (``model(idx, positions=ids)``):

* **Randomized positions** (Ruoss et al., ACL 2023): every sequence takes a
  sorted sample of ``L`` distinct ids from ``[0, M)``, ``M`` the longest length
  to be served, so every position and every distance up to ``M - 1`` is seen
  in training. Ruoss et al. draw ordered random ids at test time as well
  (their code samples them at every call); :func:`posenc.evaluate_lengths`
  does so with ``position_sampling="randomized"``, or reads contiguous ids.
* **PoSE** (Zhu et al., ICLR 2024, "Positional Skip-wisE training"): the
  window is cut into ``chunks`` pieces (2 by default, at a random point); ids
  stay contiguous inside a piece, and piece ``c`` is shifted by a skip
  ``u_c`` (``u_0 = 0``, the skips non-decreasing, the last id below ``M``): the window
  covers relative distances up to ``M - 1`` while most neighbours keep their
  true distances. At test time PoSE reads ordinary contiguous ids.

:func:`sample_positions` draws either kind; :func:`posenc.train` calls it for
every batch (``position_sampling=``, ``max_position=``, both in the cache key).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._validate import check_int

__all__ = ["POSITION_SAMPLINGS", "randomized_positions", "pose_positions", "sample_positions"]

#: The kinds :func:`sample_positions` draws (``None``: contiguous ids ``0 .. L-1``).
POSITION_SAMPLINGS = ("randomized", "pose")


def _sizes(batch: int, seq_len: int, max_position: int) -> tuple:
    batch, seq_len = check_int("batch", batch), check_int("seq_len", seq_len)
    max_position = check_int("max_position (the number of ids to draw from)", max_position)
    if max_position < seq_len:
        raise ValueError(f"max_position ({max_position}) must be >= seq_len ({seq_len}): {seq_len} distinct ids "
                         f"are drawn from [0, max_position)")
    return batch, seq_len, max_position


def _generator(generator: Optional[torch.Generator]) -> Optional[torch.Generator]:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def randomized_positions(batch: int, seq_len: int, max_position: int,
                         generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Per sequence, a sorted sample of ``seq_len`` distinct ids from ``[0, max_position)`` (Ruoss et al., 2023).

    Every subset is equally likely (the first ``seq_len`` of a random
    permutation, sorted).

    Returns:
        ``(batch, seq_len)`` int64, strictly increasing along each row.

    >>> randomized_positions(2, 4, 4).tolist()
    [[0, 1, 2, 3], [0, 1, 2, 3]]
    """
    batch, seq_len, max_position = _sizes(batch, seq_len, max_position)
    g = _generator(generator)
    keys = torch.rand(batch, max_position, generator=g)
    return keys.topk(seq_len, dim=1).indices.sort(dim=1).values  # a uniform subset per row, sorted


def pose_positions(batch: int, seq_len: int, max_position: int, chunks: int = 2,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """PoSE's ids (Zhu et al., 2024): ``chunks`` contiguous pieces, each shifted by a non-decreasing skip.

    The window of ``seq_len`` tokens is cut at ``chunks - 1`` distinct random
    points into pieces of at least one token; piece ``c`` carries the ids
    ``start_c + u_c .. end_c - 1 + u_c``, with ``u_0 = 0`` and each later skip
    uniform between the previous one and ``max_position - seq_len`` (PoSE's
    ``u_c ~ U{u_(c-1), ..., L_t - L_c}``). PoSE also takes the pieces' text from
    distant parts of a long document; here the text stays as the data source
    gives it, only the ids skip.

    Returns:
        ``(batch, seq_len)`` int64, strictly increasing along each row, all
        below ``max_position``; ``max_position == seq_len`` gives ``0 .. seq_len-1``.
    """
    batch, seq_len, max_position = _sizes(batch, seq_len, max_position)
    chunks = check_int("chunks", chunks)
    if chunks > seq_len:
        raise ValueError(f"chunks ({chunks}) must be <= seq_len ({seq_len}): every piece holds a token")
    g = _generator(generator)
    room = max_position - seq_len
    ids = torch.arange(seq_len).repeat(batch, 1)
    for row in range(batch):
        cuts = (torch.randperm(seq_len - 1, generator=g)[:chunks - 1] + 1).sort().values.tolist()
        skip, starts = 0, [0, *cuts]
        for c, start in enumerate(starts):
            if c and room:
                skip += int(torch.randint(room - skip + 1, (1,), generator=g))
            end = starts[c + 1] if c + 1 < len(starts) else seq_len
            ids[row, start:end] += skip
    return ids


def sample_positions(kind: Optional[str], batch: int, seq_len: int, max_position: Optional[int] = None,
                     generator: Optional[torch.Generator] = None) -> Optional[torch.Tensor]:
    """Ids of ``kind`` (:data:`POSITION_SAMPLINGS`), or ``None`` for ``kind=None`` (contiguous ids).

    Raises:
        ValueError: on an unknown kind, or ``max_position`` missing, below
            ``seq_len`` or given with ``kind=None``.
    """
    _check_sampling(kind, seq_len, max_position)
    if kind is None:
        return None
    if kind == "randomized":
        return randomized_positions(batch, seq_len, max_position, generator)
    return pose_positions(batch, seq_len, max_position, generator=generator)


def _check_sampling(kind: Optional[str], seq_len: int, max_position: Optional[int]) -> None:
    """Raise ``ValueError`` unless ``kind`` and ``max_position`` can serve sequences of ``seq_len`` ids."""
    if kind is None:
        if max_position is not None:
            raise ValueError("max_position is for position_sampling='randomized' or 'pose'; "
                             "position_sampling is None (contiguous ids)")
        return
    if kind not in POSITION_SAMPLINGS:
        raise ValueError(f"position_sampling must be None or one of {POSITION_SAMPLINGS}, got {kind!r}")
    if max_position is None:
        raise ValueError(f"position_sampling={kind!r} needs max_position, the number of ids to draw from "
                         "(the longest length the model should serve)")
    _sizes(1, seq_len, max_position)
