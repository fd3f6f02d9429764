"""Relative positions and boolean attention masks.

Conventions used throughout :mod:`posenc`:

* masks are boolean ``(q_len, k_len)`` tensors with ``True`` = *may attend*;
* when ``k_len > q_len`` (decoding with a key/value cache) the queries are the
  **last** ``q_len`` positions, i.e. query ``i`` sits at key position
  ``i + k_len - q_len`` ("bottom-right" alignment, as in fused attention kernels).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._validate import check_int

__all__ = ["check_lengths", "relative_positions", "causal_mask", "sliding_window_mask"]


def check_lengths(q_len: int, k_len: Optional[int] = None) -> int:
    """Validate a query/key length pair and return ``k_len`` (defaulting to ``q_len``).

    Raises:
        ValueError: if a length is not a positive integer or ``k_len < q_len``.
    """
    if k_len is None:
        k_len = q_len
    for name, value in (("q_len", q_len), ("k_len", k_len)):
        check_int(name, value)
    if k_len < q_len:
        raise ValueError(
            f"k_len ({k_len}) must be >= q_len ({q_len}): queries are the last q_len key positions"
        )
    return k_len


def relative_positions(
    q_len: int, k_len: Optional[int] = None, *, device: Optional[torch.device] = None
) -> torch.Tensor:
    """Signed offsets ``j - i`` between key position ``j`` and query position ``i``.

    Returns:
        ``(q_len, k_len)`` int64 tensor; entry ``[i, j]`` is ``j - (i + k_len - q_len)``,
        so keys in the past of a query are negative and the diagonal of the
        bottom-right square is zero.
    """
    k_len = check_lengths(q_len, k_len)
    q_pos = torch.arange(k_len - q_len, k_len, device=device)  # (q_len,)
    k_pos = torch.arange(k_len, device=device)  # (k_len,)
    return k_pos[None, :] - q_pos[:, None]  # (q_len, k_len)


def causal_mask(
    q_len: int, k_len: Optional[int] = None, *, device: Optional[torch.device] = None
) -> torch.Tensor:
    """Boolean causal mask: query ``i`` may attend to keys at positions ``<= i``.

    Returns:
        ``(q_len, k_len)`` bool tensor, True = may attend (bottom-right aligned).

    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return relative_positions(q_len, k_len, device=device) <= 0


def sliding_window_mask(
    q_len: int,
    k_len: Optional[int] = None,
    *,
    window: int,
    causal: bool = True,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Local attention: each query sees only the ``window`` nearest keys.

    Causal (default): query ``i`` attends to keys ``i - window + 1 ... i`` (itself
    included), so every query sees at most ``window`` keys: the "super baseline"
    of length extrapolation when ``window`` equals the training length.
    Bidirectional (``causal=False``): keys with ``|i - j| < window``.

    Returns:
        ``(q_len, k_len)`` bool tensor, True = may attend.

    >>> sliding_window_mask(4, window=2).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_int("window", window)
    rel = relative_positions(q_len, k_len, device=device)
    near = rel.abs() < window
    return near & (rel <= 0) if causal else near
