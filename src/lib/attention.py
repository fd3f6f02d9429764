"""Softmax attention with position biases and masks, on top of PyTorch's SDPA.

.. math::
    \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\Big(\\frac{QK^\\top}{\\sqrt{d}} + B
    + M\\Big) V,

where :math:`B` is an additive position bias (ALiBi, KERPLE, T5, ...) that is
*not* scaled, and :math:`M` is 0 where attending is allowed and
:math:`-\\infty` elsewhere.

Every call goes through :func:`torch.nn.functional.scaled_dot_product_attention`
(flash / memory-efficient kernels where the inputs allow), except when the
attention weights are asked for, which needs the explicit softmax.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ._validate import check_int
from .masks import causal_mask

__all__ = ["attention", "combine_bias_and_mask", "attention_entropy", "log_length_scale"]


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            "q, k, v must be (batch, heads, seq, head_dim); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "q, k, v must agree on batch and heads, and k, v on seq; got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim; got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(
            f"q_len ({q.shape[2]}) must be <= k_len ({k.shape[2]}): queries are the last key positions"
        )


def _check_trailing(name: str, t: torch.Tensor, q_len: int, k_len: int, heads: int) -> None:
    if t.ndim < 2 or tuple(t.shape[-2:]) != (q_len, k_len):
        raise ValueError(f"{name} must end in (q_len, k_len) = ({q_len}, {k_len}); got {tuple(t.shape)}")
    if t.ndim >= 3 and t.shape[-3] not in (1, heads):
        raise ValueError(f"{name} has {t.shape[-3]} heads, expected 1 or {heads}; shape {tuple(t.shape)}")


def combine_bias_and_mask(
    bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    dtype: torch.dtype,
) -> Optional[torch.Tensor]:
    """One SDPA ``attn_mask``: boolean if there is no bias, else additive float.

    Returns:
        ``None``, the boolean mask, or ``bias`` with ``-inf`` where ``mask`` is False.
    """
    if bias is None:
        return mask
    bias = bias.to(dtype)
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf"))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
    causal: bool = True,
    scale: Optional[float] = None,
    return_weights: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled dot-product attention with an optional position bias and mask.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, heads, k_len, head_dim)`` with ``k_len >= q_len``.
        v: ``(batch, heads, k_len, v_dim)``.
        bias: additive logits ``(heads, q_len, k_len)``, or broadcastable to
            ``(batch, heads, q_len, k_len)``; added after the ``scale``.
        mask: boolean, broadcastable to ``(batch, heads, q_len, k_len)``,
            True = may attend.
        causal: also forbid keys after the query (bottom-right aligned when
            ``k_len > q_len``).
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        return_weights: also return the ``(batch, heads, q_len, k_len)``
            attention probabilities (computed explicitly; slower).

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``.

    Every query must be allowed at least one key, else its row is NaN.
    """
    _check_qkv(q, k, v)
    heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    if bias is not None:
        _check_trailing("bias", bias, q_len, k_len, heads)
    if mask is not None:
        _check_trailing("mask", mask, q_len, k_len, heads)
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])

    if causal:
        if bias is None and mask is None and q_len == k_len and not return_weights:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        allowed = causal_mask(q_len, k_len, device=q.device)
        mask = allowed if mask is None else mask & allowed

    attn_mask = combine_bias_and_mask(bias, mask, q.dtype)
    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    scores = (q @ k.transpose(-2, -1)) * scale  # (b, h, q, k)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


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
    if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
        raise ValueError("weights must be a floating-point tensor of probabilities")
    if weights.ndim == 0:
        raise ValueError("weights must have at least one dimension (the keys)")
    if not -weights.ndim <= dim < weights.ndim:
        raise ValueError(f"dim {dim} out of range for weights of shape {tuple(weights.shape)}")
    if weights.shape[dim] == 0:
        raise ValueError(f"weights has no keys along dim {dim}: shape {tuple(weights.shape)}")
    work = weights.to(torch.float64 if weights.dtype == torch.float64 else torch.float32)
    if not torch.isfinite(work).all():
        raise ValueError("weights contain NaN or infinity (a fully masked row?)")
    if (work < 0).any():
        raise ValueError("weights must be non-negative probabilities")
    low_precision = weights.dtype in (torch.float16, torch.bfloat16)
    tol = 1e-2 if low_precision else 1e-3
    total = work.sum(dim=dim)
    if not torch.allclose(total, torch.ones_like(total), rtol=0.0, atol=tol):
        worst = (total - 1).abs().max().item()
        raise ValueError(
            f"weights must sum to 1 along dim {dim} (softmax probabilities); "
            f"largest deviation {worst:.3g}"
        )
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
    check_int("n", n)
    check_int("train_len", train_len, low=2)
    factor = math.log(n) / math.log(train_len)
    return max(1.0, factor) if clamp else factor
