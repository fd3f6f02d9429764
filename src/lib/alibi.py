"""ALiBi: attention with linear biases (Press, Smith & Lewis, ICLR 2022).

No position is added to the tokens. Instead every head ``h`` subtracts a
penalty proportional to the distance from the attention logits,

.. math:: \\text{score}_h(i, j) = \\frac{q_i \\cdot k_j}{\\sqrt{d}} - m_h\\,|i - j|,

with a fixed, head-specific slope :math:`m_h`. The penalty is *not* divided by
:math:`\\sqrt{d}`. Slopes form a geometric sequence (Sec. 3 of the paper).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from ._validate import at_least_float32, check_device as _device, check_int
from ._validate import check_float_dtype as _float_dtype
from .masks import _as_tensor, _finite, relative_positions
from .scheme import PositionScheme, register_scheme

__all__ = ["alibi_slopes", "alibi_bias", "ALiBi"]


def _power_of_two_slopes(n: int) -> list:
    # 2^(-8/n), 2^(-16/n), ..., 2^(-8): start and ratio both 2^(-8/n).
    start = 2.0 ** (-8.0 / n)
    return [start ** (h + 1) for h in range(n)]


def alibi_slopes(n_heads: int, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-head ALiBi slopes, exactly as in the authors' code.

    For ``n_heads`` a power of two the slopes are the geometric sequence
    ``2^(-8/n), 2^(-16/n), ..., 2^(-8)`` (8 heads: 1/2, 1/4, ..., 1/256).
    Otherwise, with ``p`` the largest power of two below ``n_heads``, they are
    the ``p`` slopes of ``p`` heads followed by every other slope of ``2p``
    heads (``slopes(2p)[0::2]``) until there are ``n_heads``. The one-line
    formula ``2^(-8h/n)`` differs from this rule (e.g. for 6 or 12 heads).

    Returns:
        ``(n_heads,)`` tensor of positive slopes: decreasing for a power of two;
        otherwise the ``p`` slopes of ``p`` heads come first, then the extra ones
        (6 heads: 1/4, 1/16, 1/64, 1/256, 1/2, 1/8).

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    n_heads, dtype = check_int("n_heads", n_heads), _float_dtype(dtype)
    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = _power_of_two_slopes(p)
    if p < n_heads:
        slopes += _power_of_two_slopes(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float64).to(dtype)


def alibi_bias(
    n_heads_or_slopes: Union[int, Sequence[float], torch.Tensor],
    q_len: int,
    k_len: Optional[int] = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """The additive ALiBi bias ``-m_h * |i - j|`` for every head.

    Query ``i`` sits at key position ``i + k_len - q_len`` (bottom-right
    alignment). Under a causal mask only ``j <= i`` is visible, where
    ``|i - j| = i - j``. Without a mask the same tensor is the symmetric,
    bidirectional variant, which cannot tell left from right.

    Args:
        n_heads_or_slopes: a head count (slopes from :func:`alibi_slopes`) or
            explicit ``(heads,)`` slopes (numbers, NumPy or a tensor; a tensor
            that requires grad keeps its graph: learned slopes train through the bias).
        dtype: a floating-point dtype of the result.
        device: where the bias is built (default: the CPU).

    Returns:
        ``(heads, q_len, k_len)`` tensor, 0 on the diagonal, negative elsewhere.

    Raises:
        ValueError: for a head count that is not an integer ``>= 1``, slopes
            that are not a finite non-empty 1-D sequence, bad lengths, or a
            non-floating ``dtype``.
    """
    _float_dtype(dtype)
    if not isinstance(n_heads_or_slopes, (list, tuple)) and getattr(n_heads_or_slopes, "ndim", 0) == 0:
        slopes = alibi_slopes(check_int("n_heads", n_heads_or_slopes), dtype=torch.float64)  # a head count
    else:
        slopes = _as_tensor("slopes", n_heads_or_slopes)
        if slopes.ndim != 1 or slopes.numel() == 0:
            raise ValueError(f"slopes must be a non-empty 1-D sequence (one per head), got shape {tuple(slopes.shape)}")
        _finite("slopes", slopes, sync=True)
        device = slopes.device if device is None and slopes.is_meta else device  # meta: shapes only
    # Exact in float64; Apple MPS has no float64, float32 is exact there for
    # power-of-two slopes and distances below 2**24.
    work = torch.float32 if device is not None and _device(device).type == "mps" else torch.float64
    # -|i - j| negated in integers, so the diagonal is +0.0 rather than -0.0
    neg_distance = (-relative_positions(q_len, k_len, device=device).abs()).to(work)  # (q, k)
    slopes = slopes.to(device=neg_distance.device, dtype=work)
    return (slopes[:, None, None] * neg_distance).to(dtype)  # (heads, q, k)


@register_scheme("alibi")
class ALiBi(PositionScheme):
    """ALiBi as a position scheme: fixed slopes :func:`alibi_slopes`, bias ``-m_h (i - j)``.

    :meth:`slopes` lets attention fold the bias into the fused kernel; the
    same bias as a table is :meth:`distance_bias`. The slopes are a buffer
    that moves with the model but is neither trained nor saved.

    Shapes: ``distance_bias(n)``: ``(heads, n)``; ``slopes()``: ``(heads,)``.
    """

    name = "alibi"

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.register_buffer("alibi_slopes", alibi_slopes(n_heads), persistent=False)

    def slopes(self) -> torch.Tensor:
        self._require_bound()
        return self.alibi_slopes

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self._require_bound()
        dtype = _float_dtype(dtype)
        work = at_least_float32(dtype)
        distance = torch.arange(check_int("length", length, 0), device=_device(device), dtype=work)
        return (-self.alibi_slopes.to(device=device, dtype=work)[:, None] * distance).to(dtype)
