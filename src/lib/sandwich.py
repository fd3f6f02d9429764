"""Sandwich: a relative bias from the dot product of two sinusoidal position vectors (Chi et al., ACL 2023).

"Dissecting Transformer Length Extrapolation via the Lens of Receptive Field
Analysis" takes ``p_m . p_n`` of Vaswani's sinusoidal vectors, which depends
on ``m - n`` only, shifts it so that it is 0 at distance 0, and scales it per
head like ALiBi's slopes. :func:`sandwich_bias` is the bias
``(heads, q_len, k_len)`` that goes into the attention logits after the
``1/sqrt(d)`` scale; :func:`sandwich_qk` is the same thing written as
concatenated query and key vectors. When ``k_len > q_len`` the queries are the
last ``q_len`` key positions (bottom-right alignment, as for ALiBi). The bias
is symmetric in ``|m - n|``: combine it with a causal mask for a language model.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._validate import check_even_dim, check_int, check_number
from ._validate import check_device as _device
from ._validate import check_float_dtype as _float_dtype
from .masks import _as_tensor, _by_distance, _check_tensors, _finite, _layout_hint
from .masks import check_lengths, relative_positions
from .scheme import PositionScheme, _kept, register_scheme
from .sinusoidal import sinusoidal_embedding

__all__ = ["sandwich_bias", "sandwich_qk", "Sandwich"]


def _check_base(base: float) -> float:
    if not check_number("base", base) > 1:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    return float(base)


def sandwich_bias(
    n_heads: int,
    q_len: int,
    k_len: Optional[int] = None,
    *,
    dim: int = 128,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Sandwich bias (Chi et al., 2023): per head ``h = 1 .. H``

    .. math::
        B_h(m, n) = \\frac{\\sum_{i=1}^{d/2} \\cos\\big((m - n) / \\text{base}^{2i/d}\\big)
        - d/2}{8h / H}.

    The sum is ``p_m . p_n`` for sinusoidal vectors of dimension ``d = dim``;
    subtracting ``d/2`` makes the bias 0 at distance 0 and ``<= 0`` everywhere
    (each cosine is at most 1), and does not change attention (softmax ignores
    a constant per row). Dividing by ``8h/H`` gives the heads different
    strengths, like ALiBi's slopes: head 1 is the steepest.

    Index range: the paper's sum runs over ``i = 1 .. d/2``, i.e. the
    frequencies ``base^(-2/d) ... base^(-1)``, while Vaswani's table and
    :func:`posenc.sinusoidal_similarity` use ``i = 0 .. d/2 - 1``, i.e.
    ``1 ... base^(-(d-2)/d)``. The two sums share ``d/2 - 1`` terms and differ
    by one: this one drops ``cos(r)`` and adds ``cos(r / base)``, so

    ``sum_{i=1}^{d/2} = sinusoidal_similarity(r, d) - cos(r) + cos(r / base)``,

    a difference of at most 2 in absolute value, before the head scaling.

    Args:
        n_heads: number of heads ``H``.
        q_len, k_len: query and key lengths (``k_len >= q_len``, default ``q_len``).
        dim: dimension ``d`` of the sinusoidal vectors (even; a free
            hyperparameter, independent of the head dimension).
        base: the sinusoidal wavelength scale (10000).
        dtype: a floating-point dtype of the result.

    Returns:
        ``(n_heads, q_len, k_len)`` tensor, 0 at distance 0, ``<= 0`` elsewhere.
    """
    n_heads = check_int("n_heads", n_heads)
    check_even_dim(dim, "sandwich_bias")
    _check_base(base)
    _float_dtype(dtype)
    k_len = check_lengths(q_len, k_len)
    # The bias depends on the offset only: evaluate it once per distinct offset
    # (float64 on the CPU), then gather; never a (q, k, d/2) tensor.
    rel = relative_positions(q_len, k_len)  # (q, k), offsets -(k_len-1) .. k_len-q_len
    lo = int(rel.min())
    offsets = torch.arange(lo, int(rel.max()) + 1, dtype=torch.float64)  # (n_off,)
    i = torch.arange(1, dim // 2 + 1, dtype=torch.float64)  # 1 .. d/2
    freqs = torch.as_tensor(base, dtype=torch.float64) ** (-2.0 * i / dim)  # (d/2,)
    profile = torch.cos(offsets[:, None] * freqs).sum(-1) - dim / 2  # (n_off,)
    values = profile[rel - lo]  # (q, k)
    h = torch.arange(1, n_heads + 1, dtype=torch.float64)
    scale = 8.0 * h / n_heads  # (heads,)
    return (values[None] / scale[:, None, None]).to(dtype=dtype, device=_device(device))


def sandwich_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    lam: Union[float, torch.Tensor],
    dim: int = 128,
    *,
    base: float = 10000.0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sandwich as concatenation: ``[q_m, sqrt(lam) p_m]`` and ``[k_n, sqrt(lam) p_n]``.

    With ``p`` Vaswani's sinusoidal vectors (:func:`posenc.sinusoidal_embedding`),

    .. math::
        [q_m, \\sqrt{\\lambda} p_m] \\cdot [k_n, \\sqrt{\\lambda} p_n]
        = q_m \\cdot k_n + \\lambda\\, p_m \\cdot p_n,

    and ``p_m . p_n`` depends on ``m - n`` only
    (:func:`posenc.sinusoidal_similarity`): absolute vectors that act as a
    relative bias. The price is a head dimension grown by ``dim``, so this form
    is of theoretical interest; in practice the bias is added to the logits.
    Note that :func:`posenc.attention` multiplies the whole dot product by its
    ``scale`` (``1/sqrt(head_dim)`` by default), the ``lam`` term included.

    Args:
        q: ``(batch, heads, q_len, head_dim)``; queries sit at the last ``q_len``
            key positions.
        k: ``(batch, heads, k_len, head_dim)``.
        lam: ``lambda >= 0``, a number or a ``(heads,)`` tensor (one per head).
        dim: dimension of the sinusoidal vectors (even).

    Returns:
        ``(q', k')`` with last dimension ``head_dim + dim``.
    """
    _check_tensors(q=q, k=k)
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"q and k must be (batch, heads, seq, head_dim), got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must agree on batch, heads and head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    check_even_dim(dim, "sandwich_qk")
    _check_base(base)
    heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    check_lengths(q_len, k_len)
    lam_t = _as_tensor("lam", lam, dtype=torch.float64)
    if lam_t.ndim > 1 or (lam_t.ndim == 1 and lam_t.numel() != heads):
        raise ValueError(f"lam must be a number or a ({heads},) tensor, got shape {tuple(lam_t.shape)}"
                         + _layout_hint(q, lam_t.numel()))
    _finite("lam", lam_t, sync=not lam_t.requires_grad)
    if not lam_t.requires_grad and not bool((lam_t >= 0).all()):
        raise ValueError(f"lam must be >= 0, got {lam_t.tolist()}")
    root = lam_t.sqrt().reshape(1, -1, 1, 1).to(dtype=q.dtype, device=q.device)  # (1, h or 1, 1, 1)
    p = sinusoidal_embedding(k_len, dim, base, dtype=q.dtype).to(q.device)  # (k_len, dim)
    p_q = (root * p[k_len - q_len:]).expand(q.shape[0], heads, q_len, dim)
    p_k = (root * p).expand(k.shape[0], heads, k_len, dim)
    return torch.cat([q, p_q], dim=-1), torch.cat([k, p_k], dim=-1)


@register_scheme("sandwich")
class Sandwich(PositionScheme):
    """Sandwich as a position scheme (Chi et al., 2023): :func:`sandwich_bias` by distance, no parameters.

    Args:
        dim: dimension of the sinusoidal vectors; base: their base.

    Shapes: ``distance_bias(n)``: ``(heads, n)``.
    """

    name = "sandwich"

    def __init__(self, dim: int = 128, base: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.base = check_even_dim(dim, "sandwich"), _check_base(base)
        self._cache: dict = {}

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self._require_bound()
        def table() -> torch.Tensor:
            with torch.inference_mode(False):  # a normal tensor, even if first asked for in inference mode
                return _by_distance(sandwich_bias(self.n_heads, 1, length, dim=self.dim, base=self.base,
                                                  dtype=_float_dtype(dtype), device=device))
        return _kept(self._cache, (length, str(_device(device)), _float_dtype(dtype)), table)
