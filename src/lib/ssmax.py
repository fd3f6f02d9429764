"""Scaling the logits by the number of keys: fixed log-n scaling and Scalable-Softmax (SSMax).

A softmax over ``n`` logits flattens as ``n`` grows: its largest weight tends
to 0 unless the logits grow too ("attention fading"). Both remedies here
multiply the logits of query ``i`` by a function of ``n_i``, the number of
keys it sees (``i + 1`` under a causal mask, at most ``window``):

* **log-n scaling** (Su, 2021, "entropy invariance"; Chiang & Cholak, 2022):
  a fixed factor ``max(1, log n_i / log L)`` for a model trained at length
  ``L``, 1 within the training length (:func:`log_n_factors`;
  ``TinyLM(log_n_scaling=True)``);
* **Scalable-Softmax** (Nakanishi, 2025, "Scalable-Softmax Is Superior for
  Attention"): ``softmax(s log(n) z)``, i.e. the logits ``z``
  multiplied by ``s_h log n_i`` with ``s_h`` learned per head and layer
  (:func:`scalable_softmax`, :func:`ssmax_factors`;
  ``TinyLM(log_n_scaling="ssmax")``).

In a model both act on the queries (``q_i`` times the factor), which scales
``q_i . k_j`` and leaves the fused attention kernels in use; a distance bias
(ALiBi, ...) added after the product is not scaled. SSMax's factor for the
first query is 0 (``log 1``): it sees one key, whose weight is 1 anyway.

SSMax's ``s_h`` start at 1 in :class:`posenc.SoftmaxAttention`
(``ssmax=True``): the logits times ``log n_i``. The paper learns ``s`` per
layer and head; its starting value is this library's choice (one that does
not depend on the training length, which is not part of a model's config).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._validate import check_int
from .masks import _finite

__all__ = ["keys_seen", "log_n_factors", "ssmax_factors", "scalable_softmax"]


def keys_seen(seq_len: int, window: Optional[int] = None, *, device: Optional[torch.device] = None) -> torch.Tensor:
    """The number of keys ``n_i`` that causal query ``i`` sees: ``i + 1``, at most ``window``.

    Returns:
        ``(seq_len,)`` float64.

    >>> keys_seen(5, window=3).tolist()
    [1.0, 2.0, 3.0, 3.0, 3.0]
    """
    seq_len = check_int("seq_len", seq_len, low=0)
    seen = torch.arange(1, seq_len + 1, dtype=torch.float64, device=device)
    if window is not None:
        seen = seen.clamp(max=check_int("window", window))
    return seen


def log_n_factors(seq_len: int, train_len: int, *, window: Optional[int] = None) -> torch.Tensor:
    """Fixed log-n scaling: ``max(1, log n_i / log L)`` for every query (``n_i``: :func:`keys_seen`).

    Returns:
        ``(seq_len,)`` float64 factors, 1 while ``n_i <= train_len``.

    >>> log_n_factors(4, 2).tolist()
    [1.0, 1.0, 1.5849625007211563, 2.0]
    """
    train_len = check_int("train_len", train_len, low=2)
    return (keys_seen(seq_len, window).log() / math.log(train_len)).clamp(min=1.0)


def ssmax_factors(seq_len: int, s: torch.Tensor, *, window: Optional[int] = None) -> torch.Tensor:
    """SSMax's factors ``s_h log n_i`` that multiply the queries (Nakanishi, 2025).

    Args:
        seq_len: number of queries (causal self-attention).
        s: ``(heads,)`` scaling parameters (learned: the gradient flows to them).
        window: causal sliding window, if any (``n_i`` at most ``window``).

    Returns:
        ``(heads, seq_len, 1)`` in ``s``'s dtype and device; 0 for the first
        query (``log 1 = 0``: it sees one key, whose weight is 1 anyway).

    Raises:
        ValueError: for an ``s`` that is not a ``(heads,)`` floating tensor, or
            holds NaN or infinity (checked on the CPU only: a GPU would wait).
    """
    if not isinstance(s, torch.Tensor) or s.ndim != 1 or not s.is_floating_point():
        raise ValueError(f"s must be a (heads,) floating tensor of scaling parameters, got "
                         f"{tuple(getattr(s, 'shape', ())) if isinstance(s, torch.Tensor) else type(s).__name__}")
    _finite("s", s)
    log_n = keys_seen(seq_len, window, device=s.device).log().to(s.dtype)
    return s[:, None, None] * log_n[:, None]


def _check_s(s: torch.Tensor, scores: torch.Tensor) -> None:
    """``ValueError`` unless ``s`` is a real, finite scalar tensor or one factor per head of ``scores``."""
    got = f"{s.dtype} of shape {tuple(s.shape)}" if isinstance(s, torch.Tensor) else type(s).__name__
    if not isinstance(s, torch.Tensor) or s.ndim > 1 or s.dtype == torch.bool or s.is_complex():
        raise ValueError(f"s must be a real scalar tensor or a (heads,) tensor of scaling parameters, got {got}")
    if s.ndim == 1 and (scores.ndim < 3 or s.shape[0] not in (1, scores.shape[-3])):
        raise ValueError(f"s of shape {tuple(s.shape)} holds one factor per head: scores must be (..., heads, q_len, "
                         f"k_len) with heads = {s.shape[0]}, got {tuple(scores.shape)} (or pass a scalar s)")
    _finite("s", s)


def _check_dim(dim: int, ndim: int) -> int:
    """``dim`` as an index of one of ``ndim`` dimensions (negative from the end), else ``ValueError``."""
    try:
        index = check_int("dim", dim, low=-ndim)
    except ValueError:
        index = None
    if index is None or index >= ndim:
        raise ValueError(f"dim must be an integer in [{-ndim}, {ndim - 1}] (a dimension of scores), got {dim!r}")
    return index


def scalable_softmax(scores: torch.Tensor, s: torch.Tensor, *, dim: int = -1) -> torch.Tensor:
    """Scalable-Softmax (Nakanishi, 2025): ``softmax(s log(n) z)`` over ``dim``.

    ``n`` is the number of entries of each row that are not ``-inf`` (the keys
    a query sees, masks included), so a causal row ``i`` has ``n = i + 1``.

    Args:
        scores: logits ``z``, e.g. ``(batch, heads, q_len, k_len)`` with ``-inf``
            where a query may not attend; every row needs one finite entry.
        s: a scalar or ``(heads,)`` scaling parameters, broadcast as
            ``s[:, None, None]`` against ``(..., heads, q_len, k_len)``.
        dim: the dimension of the keys (the last by default).

    Returns:
        Weights of ``scores``' shape; each row sums to 1.

    Raises:
        ValueError: for ``scores`` that are not a floating tensor; an ``s`` that
            is not a real scalar or ``(heads,)`` tensor (one factor, or one per
            head of ``scores``' third dimension from the end), or holds NaN or
            infinity (checked on the CPU only); a ``dim`` that is not one of
            ``scores``' dimensions; NaN or ``+inf`` scores, or a row without a
            finite entry.

    >>> z = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    >>> bool(scalable_softmax(z, torch.tensor(1.0))[0, 0] > torch.softmax(z, -1)[0, 0])  # sharper: 4 keys
    True
    """
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise ValueError(f"scores must be a floating tensor of logits, got {type(scores).__name__}")
    _check_s(s, scores)
    dim = _check_dim(dim, scores.ndim)
    if bool((scores.isnan() | (scores == float("inf"))).any()):
        raise ValueError("scores must be finite logits, or -inf where a query may not attend; got NaN or +inf")
    visible = (scores != float("-inf")).sum(dim=dim, keepdim=True)
    if bool((visible == 0).any()):
        raise ValueError("every row of scores needs a key it may attend to (a finite entry)")
    factor = (s[:, None, None] if s.ndim == 1 else s) * visible.to(scores.dtype).log()
    masked = scores == float("-inf")  # kept at -inf, out of the product (-inf * 0 or its gradient: NaN)
    return torch.softmax((scores.masked_fill(masked, 0.0) * factor).masked_fill(masked, float("-inf")), dim=dim)
