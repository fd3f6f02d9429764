"""The element-wise rotation of channel pairs, shared by RoPE (:mod:`posenc.rotary`), xPos and ReRoPE.

``x * cos + turn(x) * sin`` with ``turn`` mapping each pair ``(a, b)`` to
``(-b, a)`` (RoFormer Eq. 34), the pairs interleaved ``(2i, 2i+1)`` or
half-split ``(i, i + d/2)``; cos and sin tables come from the callers.
"""

from __future__ import annotations

from typing import Tuple

import torch


def _pairs(dim: int, interleaved: bool) -> Tuple[slice, slice]:
    """The first and second channels of the pairs: even and odd ones, or the two halves."""
    if interleaved:
        return slice(0, None, 2), slice(1, None, 2)
    return slice(0, dim // 2), slice(dim // 2, None)


def _turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
            transposed: bool = False) -> torch.Tensor:
    """``a' = a cos - b sin``, ``b' = b cos + a sin`` in one new tensor (the sine terms added in place);
    ``transposed``: ``a' = a cos + b sin``, ``b' = b cos - a sin``, each sine taken at the other channel of its pair."""
    a, b = _pairs(x.shape[-1], interleaved)
    out = x * cos  # (..., seq, dim), the broadcast shape
    sign = 1 if transposed else -1
    out[..., a].addcmul_(x[..., b], sin[..., b] if transposed else sin[..., a], value=sign)
    out[..., b].addcmul_(x[..., a], sin[..., a] if transposed else sin[..., b], value=-sign)
    return out


class _Rotation(torch.autograd.Function):
    """The rotation; its backward is the transpose, ``grad_a = g_a cos + g_b sin_b``, ``grad_b = g_b cos - g_a sin_a``:
    three element-wise operations, where autograd through the in-place form copies each updated slice and
    rebuilds the gradient from zeroed tensors."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _turned(x, cos, sin, interleaved)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _turned(grad, cos, sin, ctx.interleaved, transposed=True), None, None, None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``x * cos + turn(x) * sin``, ``turn`` mapping each channel pair ``(a, b)`` to ``(-b, a)``.

    One new tensor instead of the five of the direct form: the sine terms are added in place to the two
    halves (or the even and odd channels) of ``x * cos``. When ``x`` alone needs a gradient (and is not
    broadcast), the backward pass is the transposed rotation (:class:`_Rotation`).
    """
    if (torch.is_grad_enabled() and x.requires_grad and not (cos.requires_grad or sin.requires_grad)
            and torch.broadcast_shapes(x.shape, cos.shape, sin.shape) == x.shape):
        return _Rotation.apply(x, cos, sin, interleaved)
    return _turned(x, cos, sin, interleaved)
