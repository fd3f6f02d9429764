"""The T5 bias: one learned scalar per bucket of offsets and head (Raffel et al., JMLR 2020).

Offsets are put in buckets, exact for small distances and log-spaced up to
``max_distance``, beyond which all offsets share the last bucket; each
(bucket, head) has one learned value, added to the attention logits
(``(heads, q_len, k_len)``, ``pe.attention(q, k, v, bias=...)``). Offsets come
from :func:`posenc.masks.relative_positions`, so when ``k_len > q_len`` the
queries are the last ``q_len`` key positions. The causal buckets see only the
past; the bidirectional ones (T5's encoder) give keys after the query buckets
of their own.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from ._validate import check_bool, check_int, check_number
from ._validate import check_device as _device
from ._validate import check_float_dtype as _float_dtype
from .masks import _by_distance, relative_positions
from .scheme import PositionScheme, register_scheme

__all__ = ["t5_relative_buckets", "T5RelativeBias", "T5Bias"]


def t5_relative_buckets(
    rel: torch.Tensor,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucketing of offsets ``rel = key position - query position``.

    Causal (``bidirectional=False``): only the past counts; a distance
    ``n = max(-rel, 0)`` goes to bucket ``n`` if ``n < num_buckets / 2``
    (exact buckets), else to

    ``num_buckets/2 + floor(log(n / (num_buckets/2)) / log(max_distance / (num_buckets/2)) * num_buckets/2)``,

    capped at ``num_buckets - 1``: log-spaced buckets whose formula would
    reach ``num_buckets`` at ``n = max_distance``, so the last bucket holds
    every distance from a little below ``max_distance`` on (from 113 with T5's
    32 buckets and 128) and all distances beyond it. Bidirectional: the buckets are split in two halves
    of ``num_buckets // 2``, the lower half for ``rel <= 0`` and the upper half
    for keys after the query (``rel > 0``), each bucketed as above by ``|rel|``.
    With 32 buckets and ``max_distance = 128`` (T5): causal distances 0..15 are
    exact; bidirectional distances 0..7 are exact on each side.

    Computed as Mesh TensorFlow / Hugging Face ``_relative_position_bucket``
    does (log in float32, truncation toward zero), so bucket boundaries agree.

    Args:
        rel: integer tensor of offsets, any shape (e.g. from
            :func:`posenc.relative_positions`).
        bidirectional: encoder-style two-sided buckets, or decoder-style causal.
        num_buckets: total number of buckets (>= 2 causal, >= 4 bidirectional).
        max_distance: distance from which all offsets share the last bucket.

    Returns:
        int64 tensor of bucket indices in ``[0, num_buckets)``, shape of ``rel``.
    """
    try:
        rel = torch.as_tensor(rel)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"rel must be an integer tensor of offsets, got {type(rel).__name__}") from None
    bidirectional = check_bool("bidirectional", bidirectional)
    if rel.is_floating_point() or rel.is_complex() or rel.dtype == torch.bool:
        raise ValueError(f"rel must be an integer tensor of offsets, got dtype {rel.dtype}")
    num_buckets, max_distance = check_int("num_buckets", num_buckets), check_int("max_distance", max_distance)
    n = num_buckets // 2 if bidirectional else num_buckets  # buckets per side
    max_exact = n // 2
    if max_exact < 1:
        need = 4 if bidirectional else 2
        raise ValueError(f"num_buckets must be >= {need} ({'bidirectional' if bidirectional else 'causal'}), got {num_buckets}")
    if max_distance <= max_exact:
        raise ValueError(f"max_distance ({max_distance}) must exceed the {max_exact} exact buckets")
    rel = rel.long()
    if bidirectional:
        offset = (rel > 0).long() * n  # keys after the query use the upper half
        dist = rel.abs()
    else:
        offset = torch.zeros_like(rel)
        dist = (-rel).clamp(min=0)  # future keys (rel > 0) fold onto distance 0
    is_small = dist < max_exact
    # clamp(min=1) only touches the exact range, where the log is not used
    scaled = torch.log(dist.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (n - max_exact)).long()
    large = large.clamp(max=n - 1)
    return offset + torch.where(is_small, dist, large)


class T5RelativeBias(nn.Module):
    """T5's learned relative bias: one scalar per (bucket, head) (Raffel et al., 2020).

    ``bias[h, i, j] = weight[bucket(j - i), h]`` with :func:`t5_relative_buckets`.
    Beyond ``max_distance`` every offset shares the last bucket, so at lengths
    longer than in training the bias stays constant: it extrapolates by not
    changing. In T5 one such table per attention stack is shared by all its
    layers, and logits are not scaled by ``1/sqrt(d)``.

    Args:
        n_heads: number of heads.
        num_buckets, max_distance, bidirectional: see :func:`t5_relative_buckets`
            (T5: 32, 128; encoder bidirectional, decoder causal).
        init_std: the weights start as ``N(0, init_std^2)`` (Hugging Face's T5
            uses ``d_model ** -0.5``).
        generator: optional :class:`torch.Generator` for the initialisation.

    Shapes:
        ``forward(q_len, k_len=None)`` -> ``(n_heads, q_len, k_len)``.
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, *, bidirectional: bool = False,
                 init_std: float = 0.05, generator: Optional[torch.Generator] = None,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        super().__init__()
        n_heads = check_int("n_heads", n_heads)
        if not check_number("init_std", init_std) >= 0:
            raise ValueError(f"init_std must be >= 0, got {init_std!r}")
        _float_dtype(dtype)
        # validates num_buckets / max_distance
        t5_relative_buckets(torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance)
        self.n_heads, self.num_buckets, self.max_distance = n_heads, num_buckets, max_distance
        self.bidirectional = bool(bidirectional)
        weight = torch.randn(num_buckets, n_heads, generator=generator, dtype=dtype) * init_std
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads, _weight=weight.to(_device(device)))

    def buckets(self, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
        """``(q_len, k_len)`` bucket indices of the offsets ``j - i``."""
        device = self.relative_attention_bias.weight.device
        rel = relative_positions(q_len, k_len, device=device)
        return t5_relative_buckets(rel, self.bidirectional, self.num_buckets, self.max_distance)

    def forward(self, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
        values = self.relative_attention_bias(self.buckets(q_len, k_len))  # (q, k, heads)
        return values.permute(2, 0, 1)  # (heads, q, k)

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")


@register_scheme("t5")
class T5Bias(PositionScheme):
    """The T5 bias as a position scheme (Raffel et al., 2020): one learned table shared by every layer.

    Args:
        num_buckets, max_distance: see :func:`t5_relative_buckets` (causal buckets).

    Shapes: ``distance_bias(n)``: ``(heads, n)``.
    """

    name = "t5"

    def __init__(self, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        num_buckets, max_distance = check_int("num_buckets", num_buckets), check_int("max_distance", max_distance)
        t5_relative_buckets(torch.zeros(1, dtype=torch.long), False, num_buckets, max_distance)  # validates
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bias: Optional[T5RelativeBias] = None

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        if self.bias is None:
            self.bias = T5RelativeBias(n_heads, self.num_buckets, self.max_distance)

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """The table starts ``N(0, 0.05^2)``."""
        w = self.bias.relative_attention_bias.weight
        w.copy_(torch.randn(w.shape, generator=generator) * 0.05)

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self._require_bound()
        return _by_distance(self.bias(1, length)).to(_float_dtype(dtype))
