"""Bias kernels: KERPLE, Sandwich and the T5 bias.

Every function here returns an additive position bias of shape
``(heads, q_len, k_len)`` that goes into the attention logits after the
``1/sqrt(d)`` scale (``pe.attention(q, k, v, bias=...)``). Offsets come from
:func:`posenc.masks.relative_positions`, so when ``k_len > q_len`` the queries
are the last ``q_len`` key positions (bottom-right alignment, as for ALiBi).

* **KERPLE** (Chi et al., NeurIPS 2022) generalises ALiBi's ``-m|i - j|`` with
  two positive parameters per head, learned with the model:

  .. math::
      b_{\\text{power}}(m, n) = -r_1 |m - n|^{r_2} \\quad (r_1 > 0,\\ 0 < r_2 \\le 2),
      \\qquad
      b_{\\log}(m, n) = -r_1 \\log(1 + r_2 |m - n|) \\quad (r_1, r_2 > 0).

* **Sandwich** (Chi et al., ACL 2023) uses the dot product of two sinusoidal
  position vectors, ``lambda p_m . p_n``, shifted so that it is 0 at distance 0
  and scaled per head like ALiBi's slopes.

* **T5 bias** (Raffel et al., JMLR 2020) learns one scalar per (bucket, head);
  offsets are put in buckets, exact for small distances and log-spaced up to
  ``max_distance``, beyond which all offsets share the last bucket.

All biases here are symmetric in ``|m - n|`` except the bidirectional T5 bias;
combine them with a causal mask (``pe.attention(..., causal=True)``) for a
language model.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from ._validate import check_bool, check_even_dim, check_int, check_number
from ._validate import check_device as _device
from ._validate import check_float_dtype as _float_dtype
from .masks import _as_tensor, _check_tensors, _finite, _layout_hint
from .masks import check_lengths, relative_positions
from .scheme import PositionScheme, _kept, register_scheme
from .sinusoidal import sinusoidal_embedding

__all__ = ["kerple_power_bias", "kerple_log_bias", "KerpleBias", "sandwich_bias", "sandwich_qk",
           "t5_relative_buckets", "T5RelativeBias", "Kerple", "Sandwich", "T5Bias"]

ParamLike = Union[float, torch.Tensor]


# ---------------------------------------------------------------------------
# KERPLE
# ---------------------------------------------------------------------------


def _as_head_params(r1: ParamLike, r2: ParamLike) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two per-head parameter vectors of one length, float, on one device."""
    out = []
    # a number or a list next to a floating tensor takes that tensor's dtype directly (not rounded through float32)
    like = next((v.dtype for v in (r1, r2) if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
    for name, value in (("r1", r1), ("r2", r2)):
        plain = not isinstance(value, (torch.Tensor, np.ndarray, np.generic))
        t = _as_tensor(name, value, dtype=like if plain else None)  # numbers, NumPy, integer tensors; bool refused
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1 or t.numel() == 0:
            raise ValueError(f"{name} must be a scalar or a non-empty (heads,) tensor, got shape {tuple(t.shape)}")
        out.append(t)
    a, b = out
    if a.device != b.device:
        raise ValueError(f"r1 and r2 must be on one device, got {a.device} and {b.device}")
    if a.numel() != b.numel():
        if a.numel() == 1:
            a = a.expand(b.numel())
        elif b.numel() == 1:
            b = b.expand(a.numel())
        else:
            raise ValueError(f"r1 and r2 must have the same number of heads, got {a.numel()} and {b.numel()}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    return a.to(dtype), b.to(dtype)


def _check_values(r1: torch.Tensor, r2: torch.Tensor, r2_max: Optional[float], kernel: str) -> None:
    # Ranges only for plain tensors: a learned parameter is kept in range by KerpleBias
    # (clamping), and checking it here would force a device sync every step. NaN: on the CPU.
    if r1.requires_grad or r2.requires_grad or r1.device.type == "meta":
        for name, t in (("r1", r1), ("r2", r2)):
            _finite(name, t)
        return
    if not bool(torch.isfinite(r1).all()) or not bool((r1 > 0).all()):
        raise ValueError(f"KERPLE {kernel} kernel needs r1 > 0 for every head, got {r1.tolist()}")
    r2_ok = torch.isfinite(r2) & (r2 > 0)
    if r2_max is not None:
        r2_ok &= r2 <= r2_max
    if not bool(r2_ok.all()):
        bound = f"0 < r2 <= {r2_max:g}" if r2_max is not None else "r2 > 0"
        raise ValueError(f"KERPLE {kernel} kernel needs {bound} for every head, got {r2.tolist()}")


def _distances(q_len: int, k_len: Optional[int], like: torch.Tensor) -> torch.Tensor:
    return relative_positions(q_len, k_len, device=like.device).abs().to(like.dtype)  # (q, k)


def kerple_power_bias(r1: ParamLike, r2: ParamLike, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
    """KERPLE power kernel ``-r1 * |m - n| ** r2`` for every head (Chi et al., 2022, Eq. 8).

    With ``r2 = 1`` it is ALiBi with slope ``r1``; ``r2 < 1`` flattens the
    penalty at long range, ``r2 > 1`` steepens it. ``-|m - n|^p`` is a
    conditionally positive definite kernel only for ``0 < p <= 2``, hence the bound.

    Args:
        r1: ``(heads,)`` tensor (or a number for one head), ``r1 > 0``.
        r2: ``(heads,)`` tensor (or a number), ``0 < r2 <= 2``. A length-1
            ``r1`` or ``r2`` is broadcast to the other's number of heads.
        q_len, k_len: query and key lengths (``k_len >= q_len``, default ``q_len``).

    Returns:
        ``(heads, q_len, k_len)`` tensor in the dtype and on the device of the
        parameters, 0 at distance 0 and negative elsewhere. Autograd flows to
        ``r1`` and ``r2`` (the gradient with respect to ``r2`` is 0 at distance 0).

    Raises:
        ValueError: on bad shapes or lengths; on out-of-range values when
            neither ``r1`` nor ``r2`` requires grad (values of learned
            parameters are not checked: :class:`KerpleBias` clamps them).
    """
    r1, r2 = _as_head_params(r1, r2)
    _check_values(r1, r2, 2.0, "power")
    dist = _distances(q_len, k_len, r1)  # (q, k)
    bias = -r1[:, None, None] * dist.pow(r2[:, None, None])  # (heads, q, k)
    return bias + 0.0  # -0.0 -> +0.0 on the diagonal


def kerple_log_bias(r1: ParamLike, r2: ParamLike, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
    """KERPLE logarithmic kernel ``-r1 * log(1 + r2 * |m - n|)`` (Chi et al., 2022, Eq. 9).

    For short distances ``log(1 + x) ~ x``, so it starts like ALiBi with slope
    ``r1 * r2``; at long range the penalty grows only logarithmically.

    Args:
        r1, r2: ``(heads,)`` tensors (or numbers), both ``> 0``.
        q_len, k_len: query and key lengths (``k_len >= q_len``, default ``q_len``).

    Returns:
        ``(heads, q_len, k_len)`` tensor, 0 at distance 0, negative elsewhere,
        differentiable in ``r1`` and ``r2``.

    Raises:
        ValueError: as :func:`kerple_power_bias` (values checked only when
            neither parameter requires grad).
    """
    r1, r2 = _as_head_params(r1, r2)
    _check_values(r1, r2, None, "log")
    dist = _distances(q_len, k_len, r1)  # (q, k)
    bias = -r1[:, None, None] * torch.log1p(r2[:, None, None] * dist)  # (heads, q, k)
    return bias + 0.0


class KerpleBias(nn.Module):
    """Learnable KERPLE bias with per-head parameters ``r1``, ``r2``.

    Initialisation follows the authors' code: every head draws its parameters
    uniformly,

    * ``kind="power"`` (``-r1 |m-n|^r2``): ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``;
    * ``kind="log"`` (``-r1 log(1 + r2 |m-n|)``): ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``,

    unless ``r1`` / ``r2`` give explicit starting values. Positivity is kept by
    clamping: at every forward pass (and in :meth:`clamp_parameters`) the stored
    values are projected in place to ``>= eps`` (0.01, as in the authors' code),
    and the power kind's ``r2`` to ``<= 2``. The projection acts on the
    parameters themselves, like a projected-gradient step, so gradients keep
    flowing (a functional ``clamp`` inside the graph would zero them once a
    parameter left the range).

    Args:
        n_heads: number of heads.
        kind: ``"power"`` or ``"log"``.
        r1, r2: optional initial values, numbers or ``(n_heads,)`` tensors (finite).
        eps: lower bound of both parameters.
        generator: optional :class:`torch.Generator` for the random initialisation.
        dtype, device: of the parameters (a floating-point dtype).

    Shapes:
        ``forward(q_len, k_len=None)`` -> ``(n_heads, q_len, k_len)``.
    """

    def __init__(self, n_heads: int, kind: str = "power", *, r1: Optional[ParamLike] = None,
                 r2: Optional[ParamLike] = None, eps: float = 0.01, generator: Optional[torch.Generator] = None,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        super().__init__()
        n_heads = check_int("n_heads", n_heads)
        if kind not in ("power", "log"):
            raise ValueError(f"kind must be 'power' or 'log', got {kind!r}")
        if not 0 < check_number("eps", eps) < 2:
            raise ValueError(f"eps must be in (0, 2), got {eps!r}")
        _float_dtype(dtype)
        device = _device(device)
        self.n_heads, self.kind, self.eps = n_heads, kind, float(eps)
        scale_r1, scale_r2 = (1.0, 2.0) if kind == "power" else (2.0, 1.0)
        self.r1 = nn.Parameter(self._init(r1, scale_r1, "r1", generator, dtype, device))
        self.r2 = nn.Parameter(self._init(r2, scale_r2, "r2", generator, dtype, device))
        self.clamp_parameters()

    def _init(self, value, scale, name, generator, dtype, device) -> torch.Tensor:
        if value is None:
            return (torch.rand(self.n_heads, generator=generator, dtype=dtype) * scale).to(device)
        t = _as_tensor(name, value, dtype=dtype).to(device)
        if t.ndim == 0:
            t = t.expand(self.n_heads)
        if tuple(t.shape) != (self.n_heads,):
            raise ValueError(f"{name} must be a number or a ({self.n_heads},) tensor, got shape {tuple(t.shape)}")
        _finite(name, t, sync=True)
        return t.clone()

    @torch.no_grad()
    def clamp_parameters(self) -> None:
        """Project ``r1``, ``r2`` into their ranges in place (no autograd record)."""
        self.r1.data.clamp_(min=self.eps)
        self.r2.data.clamp_(min=self.eps, max=2.0 if self.kind == "power" else None)

    def forward(self, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
        self.clamp_parameters()
        fn = kerple_power_bias if self.kind == "power" else kerple_log_bias
        return fn(self.r1, self.r2, q_len, k_len)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, kind={self.kind!r}, eps={self.eps:g}"


# ---------------------------------------------------------------------------
# Sandwich
# ---------------------------------------------------------------------------


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
    lam: ParamLike,
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


# ---------------------------------------------------------------------------
# T5 relative bias
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# As position schemes of a model (posenc.PositionScheme)
# ---------------------------------------------------------------------------


def _by_distance(bias: torch.Tensor) -> torch.Tensor:
    """``(heads, 1, n)`` bias of the last of ``n`` queries -> ``(heads, n)`` by distance ``0 .. n-1``."""
    return bias[:, 0].flip(-1)


class Kerple(PositionScheme):
    """KERPLE as a position scheme: learned ``r1, r2`` per head *and per layer*, as in the authors' code.

    Args:
        kind: ``"power"`` (``-r1 |m-n|^r2``) or ``"log"`` (``-r1 log(1 + r2 |m-n|)``).

    Shapes: ``distance_bias(n)``: ``(n_layers, heads, n)``.
    """

    name = "kerple"

    def __init__(self, kind: str = "log") -> None:
        super().__init__()
        if kind not in ("power", "log"):
            raise ValueError(f"kind must be 'power' or 'log', got {kind!r}")
        self.kind = kind
        self.name = f"kerple_{kind}"
        self.layers: Optional[nn.ModuleList] = None

    def config(self):
        return dict(scheme=f"kerple_{self.kind}")

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        if self.layers is None:
            self.layers = nn.ModuleList(KerpleBias(n_heads, kind=self.kind) for _ in range(n_layers))

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Every layer draws ``r1``, ``r2`` uniformly as in the authors' code (see :class:`KerpleBias`)."""
        s1, s2 = (1.0, 2.0) if self.kind == "power" else (2.0, 1.0)
        for layer in self.layers:
            layer.r1.copy_(torch.rand(self.n_heads, generator=generator) * s1)
            layer.r2.copy_(torch.rand(self.n_heads, generator=generator) * s2)
            layer.clamp_parameters()

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self._require_bound()
        return torch.stack([_by_distance(layer(1, length)) for layer in self.layers]).to(_float_dtype(dtype))


register_scheme("kerple_power", lambda: Kerple("power"))
register_scheme("kerple_log", lambda: Kerple("log"))


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
                                                  device=device)).to(dtype)
        return _kept(self._cache, (length, str(_device(device)), _float_dtype(dtype)), table)


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
