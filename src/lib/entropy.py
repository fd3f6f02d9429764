"""How spread out attention is: its entropy, and the log-n scale that keeps it from growing with the length.

* :func:`attention_entropy`: ``H(p) = -sum_j p_j log p_j`` of attention weights.
* :func:`log_length_scale`: the factor ``log n / log L`` for the logits (Su, 2021;
  Chiang & Cholak, 2022), chapter 1's remedy for attention that dilutes as ``n`` grows.
"""

from __future__ import annotations

import math

import torch

from ._validate import check_bool, check_int

__all__ = ["attention_entropy", "log_length_scale"]


def attention_entropy(weights: torch.Tensor, dim: int = -1, *, keepdim: bool = False) -> torch.Tensor:
    """Shannon entropy, in nats, of attention distributions.

    .. math::
        H(p) = -\\sum_j p_j \\log p_j, \\qquad 0 \\log 0 = 0,

    so masked keys (weight exactly 0) contribute nothing. ``H`` lies between 0
    (all weight on one key) and ``log n`` (uniform over ``n`` keys). Used to
    show that, at fixed logit statistics, attention spreads out (its entropy
    grows like ``log n``) as the number of attended tokens ``n`` grows
    (Su, "entropy invariance", 2021).

    Args:
        weights: probabilities summing to 1 along ``dim``, e.g. the
            ``(batch, heads, q_len, k_len)`` weights of
            :func:`attention` with ``return_weights=True``.
        dim: the key dimension (default: last).
        keepdim: keep ``dim`` with size 1.

    Returns:
        ``weights.shape`` without ``dim`` (e.g. ``(batch, heads, q_len)``), in
        float32 or float64 (float64 if ``weights`` is float64).

    Raises:
        ValueError: if ``weights`` is not floating point, is empty along ``dim``,
            has negative or non-finite entries, or does not sum to 1 along ``dim``.
    """
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point() or weights.device.type == "meta":
        raise ValueError("weights must be a floating-point tensor of probabilities (with values: not on meta)")
    if weights.ndim == 0 or check_int("dim", dim, -weights.ndim) >= weights.ndim:
        raise ValueError(f"dim {dim} out of range for weights of shape {tuple(weights.shape)} (keys along dim)")
    keepdim = check_bool("keepdim", keepdim)
    if weights.shape[dim] == 0:
        raise ValueError(f"weights has no keys along dim {dim}: shape {tuple(weights.shape)}")
    work = weights.to(torch.float64 if weights.dtype == torch.float64 else torch.float32)
    if not torch.isfinite(work).all():
        raise ValueError("weights contain NaN or infinity (a fully masked row?)")
    if (work < 0).any():
        raise ValueError("weights must be non-negative probabilities")
    tol = 1e-2 if weights.dtype in (torch.float16, torch.bfloat16) else 1e-3
    total = work.sum(dim=dim)
    if not torch.allclose(total, torch.ones_like(total), rtol=0.0, atol=tol):
        raise ValueError(f"weights must sum to 1 along dim {dim} (softmax probabilities; a query allowed no key has "
                         f"weights 0); largest deviation {(total - 1).abs().max().item():.3g}")
    return -torch.special.xlogy(work, work).sum(dim=dim, keepdim=keepdim)


def log_length_scale(n: int, train_len: int, *, clamp: bool = True) -> float:
    """The log-n logit scale ``log(n) / log(train_len)`` for length ``n``.

    Multiplying the attention logits by this factor ("log-n scaling", Su,
    "entropy invariance", 2021; Chiang & Cholak, 2022) keeps the entropy of
    sharp attention roughly constant when a model trained on ``train_len``
    tokens attends to ``n`` tokens. Pass it times ``1/sqrt(head_dim)`` as the
    ``scale`` of :func:`attention`.

    Args:
        n: number of tokens attended at inference (``>= 1``).
        train_len: training length ``L`` (``>= 2``, since ``log 1 = 0``).
        clamp: return ``max(1, log n / log L)``, i.e. only sharpen beyond the
            training length (default); ``False`` gives ``log_L(n)`` for all ``n``.

    Returns:
        the factor as a Python float (``1.0`` at ``n = train_len``).
    """
    n, train_len, clamp = check_int("n", n), check_int("train_len", train_len, low=2), check_bool("clamp", clamp)
    factor = math.log(n) / math.log(train_len)
    return max(1.0, factor) if clamp else factor
