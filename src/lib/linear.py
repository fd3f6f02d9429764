"""Linear attention (Katharopoulos et al., 2020) and RoPE inside it (Su, 2021).

Softmax attention scores every query against every key, ``O(n^2)`` in the
length ``n``. Kernel-based *linear attention* replaces ``exp(q . k)`` by an
inner product of non-negative features, ``phi(q) . phi(k)``, so the products
can be re-associated (Katharopoulos et al., 2020, Eq. 5)::

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j)),

which costs ``O(n d e)``. Causal attention keeps running sums: the state
``S_i = sum_{j<=i} phi(k_j) v_j^T`` and the normaliser ``z_i = sum_{j<=i}
phi(k_j)`` (an RNN). This module computes the causal form four equal ways
(``method``): ``"quadratic"`` (masked ``n x n`` matrix, the reference),
``"recurrent"`` (the RNN, one step per token), ``"cumsum"`` (all states at
once) and ``"chunked"`` (blocks of ``chunk_size``: the states between blocks,
a small masked matrix inside each block), the one to use.

RoPE can be used inside linear attention by rotating the features in the
numerator only (Su, 2021): :func:`rope_linear_attention`. TransNormer's fixes
of kernel linear attention (NormAttention, DiagAttention) are in
:mod:`posenc.transnormer`; the layers built on these kernels are in
:mod:`posenc.layers`.

Tensors are ``(batch, heads, seq, head_dim)`` throughout.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ._validate import _float_tensor, check_bool, check_int, one_of
from .masks import _LAYOUT, _check_tensors
from .rotary import apply_rope

__all__ = [
    "FEATURE_MAPS",
    "elu_plus_one",
    "relu_feature",
    "feature_map",
    "linear_attention",
    "linear_attention_weights",
    "rope_linear_attention",
]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]

_METHODS = ("chunked", "recurrent", "cumsum", "quadratic")

#: The chunked form works through the sequence in segments of about this many
#: tokens, carrying the state from one segment to the next: the intermediates
#: of a segment stay in the CPU cache, so the cost stays linear at long lengths.
_SEGMENT_TOKENS = 1024


# ---------------------------------------------------------------------------
# Feature maps
# ---------------------------------------------------------------------------


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``, the feature map of Katharopoulos et al. (2020, Eq. 7).

    Positive everywhere (``exp(x)`` for ``x < 0``, ``x + 1`` for ``x >= 0``), so
    every score ``phi(q) . phi(k)`` is positive. No ``1 / sqrt(d)`` is applied.

    >>> elu_plus_one(torch.tensor([-1.0, 0.0, 2.0])).tolist()  # doctest: +ELLIPSIS
    [0.367..., 1.0, 3.0]

    Raises ``ValueError`` for an integer or boolean tensor (``exp`` of an
    integer has no integer value: convert it, e.g. ``x.float()``).
    """
    return F.elu(_float_tensor(x, "x")) + 1.0


def relu_feature(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = max(x, 0)``: non-negative, but exactly zero on half the space.

    With it the denominator ``phi(q_i) . z_i`` of normalised linear attention
    can be zero or arbitrarily small, the situation of Qin et al. (2022, Prop. 3.1).

    Raises ``ValueError`` for an integer or boolean tensor, as :func:`elu_plus_one`
    (``TypeError`` for an object that is neither a tensor nor a NumPy array).
    """
    return F.relu(_float_tensor(x, "x"))


#: Named feature maps accepted wherever a ``feature`` argument is taken.
#: ``"elu"`` (possibly negative) is TransNormer T1's map inside NormAttention,
#: which has no denominator; ``"identity"`` means the inputs are features already.
FEATURE_MAPS: Dict[str, FeatureMap] = {
    "elu+1": elu_plus_one,
    "relu": relu_feature,
    "elu": F.elu,
    "identity": lambda x: x,
}


def feature_map(name: Union[str, FeatureMap, None]) -> FeatureMap:
    """The feature map called ``name`` in :data:`FEATURE_MAPS` (a callable is returned as is).

    ``None`` means ``"identity"``.

    Raises:
        ValueError: for an unknown name.
    """
    if name is None:
        return FEATURE_MAPS["identity"]
    if callable(name):
        return name
    if isinstance(name, str) and name.lower() in FEATURE_MAPS:
        return FEATURE_MAPS[name.lower()]
    raise ValueError(f"unknown feature map {name!r}; expected one of {sorted(FEATURE_MAPS)} or a callable")


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Floating-point ``(batch, heads, seq, dim)`` tensors of one dtype and device (``k is v``: weights only)."""
    _check_tensors(q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be a (batch, heads, seq, dim) tensor, got {tuple(t.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (batch, heads, seq, dim); got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be (batch, heads, seq, v_dim) with the (batch, heads, seq) of k = "
                         f"{tuple(k.shape[:3])}; got {tuple(v.shape)} ({_LAYOUT})")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(f"q, k and v need a head dimension >= 1, got {tuple(q.shape)} and v {tuple(v.shape)}")


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _check_method(method: str) -> str:
    return one_of("method", method, _METHODS)


# ---------------------------------------------------------------------------
# Linear attention
# ---------------------------------------------------------------------------


def _causal_numerator_denominator(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, method: str, chunk_size: int, need_den: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Causal ``sum_{j<=i} (fq_i . fk_j) v_j`` and ``sum_{j<=i} fq_i . fk_j``.

    Returns ``(num (b, h, n, e), den (b, h, n) or None)``.
    """
    b, h, n, d = fq.shape
    e = v.shape[-1]
    if n == 0:  # no token: nothing to sum (the chunked form would concatenate no segment)
        return v.new_zeros(b, h, 0, e), (fq.new_zeros(b, h, 0) if need_den else None)
    if method == "quadratic":
        scores = (fq @ fk.transpose(-2, -1)).tril()  # (b, h, n, n), diagonal kept
        return scores @ v, (scores.sum(-1) if need_den else None)
    if method == "cumsum":
        state = (fk[..., :, None] * v[..., None, :]).cumsum(2)  # S_i, (b, h, n, d, e)
        num = (fq[..., None, :] @ state).squeeze(-2)
        den = (fq * fk.cumsum(2)).sum(-1) if need_den else None
        return num, den
    if method == "recurrent":
        state = fq.new_zeros(b, h, d, e)  # S_i
        z = fq.new_zeros(b, h, d)  # z_i
        nums, dens = [], []
        for i in range(n):
            state = state + fk[:, :, i, :, None] * v[:, :, i, None, :]
            nums.append((fq[:, :, i, None, :] @ state).squeeze(-2))
            if need_den:
                z = z + fk[:, :, i]
                dens.append((fq[:, :, i] * z).sum(-1))
        num = torch.stack(nums, dim=2) if nums else v.new_zeros(b, h, 0, e)
        den = (torch.stack(dens, dim=2) if dens else fq.new_zeros(b, h, 0)) if need_den else None
        return num, den
    # chunked: chunks of c tokens, processed in segments of about _SEGMENT_TOKENS tokens so that the
    # intermediates of a segment stay in the cache; `carry` is the state of all earlier segments.
    c = min(chunk_size, max(n, 1))
    if need_den:  # a column of ones in V makes the last output column the denominator
        v = torch.cat((v, v.new_ones(b, h, n, 1)), dim=-1)
    pad = (-n) % c
    if pad:  # zero keys and values add nothing; padded queries are dropped at the end
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    chunks, width = (n + pad) // c, v.shape[-1]
    qc = fq.reshape(b * h, chunks, c, d)
    kc = fk.reshape(b * h, chunks, c, d)
    vc = v.reshape(b * h, chunks, c, width)
    per_segment = max(1, _SEGMENT_TOKENS // c)
    carry = fq.new_zeros(b * h, 1, d, width)
    outs = []
    for first in range(0, chunks, per_segment):
        q_, k_, v_ = (t[:, first:first + per_segment] for t in (qc, kc, vc))
        states = k_.transpose(-2, -1) @ v_  # phi(K_t)^T V_t per chunk: (bh, K, d, width)
        prefix = states.cumsum(1).sub_(states).add_(carry)  # everything before chunk t (exclusive)
        local = (q_ @ k_.transpose(-2, -1)).tril_()  # (bh, K, c, c), diagonal kept
        outs.append((local @ v_).add_(q_ @ prefix))  # intra-chunk + inter-chunk
        carry = carry + states.sum(1, keepdim=True)
    out = torch.cat(outs, dim=1).reshape(b, h, chunks * c, width)[:, :, :n]
    if need_den:
        return out[..., :e], out[..., e]
    return out, None


def _numerator_denominator(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, causal: bool, method: str, chunk_size: int,
    need_den: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Numerator ``(b, h, n, e)`` and denominator ``(b, h, n)`` (or ``None``) of linear attention."""
    if causal:
        return _causal_numerator_denominator(fq, fk, v, method, chunk_size, need_den)
    if method == "quadratic":
        scores = fq @ fk.transpose(-2, -1)
        return scores @ v, (scores.sum(-1) if need_den else None)
    num = fq @ (fk.transpose(-2, -1) @ v)  # phi(Q) (phi(K)^T V): (b, h, n, e)
    den = (fq @ fk.sum(-2)[..., None]).squeeze(-1) if need_den else None
    return num, den


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    feature: Union[str, FeatureMap, None] = "elu+1",
    normalize: bool = True,
    eps: float = 1e-6,
    method: str = "chunked",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Kernel linear attention (Katharopoulos et al., 2020, Eqs. 4-9).

    Non-causal::

        out = phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(k_j))

    Causal, with the inclusive running sums ``S_i = sum_{j<=i} phi(k_j) v_j^T``
    and ``z_i = sum_{j<=i} phi(k_j)``::

        out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps)

    All ``method`` values give the same result up to rounding:

    * ``"quadratic"``: ``tril(phi(Q) phi(K)^T) V``, ``O(n^2)`` time and memory;
    * ``"recurrent"``: the RNN, one Python step per token, ``O(d e)`` state;
    * ``"cumsum"``: every ``S_i`` at once, ``O(n d e)`` memory;
    * ``"chunked"`` (default): split into chunks of ``c`` tokens; each chunk
      gets ``q`` times the state of all *earlier* chunks (an exclusive prefix
      sum of ``phi(K_c)^T V_c``) plus ``tril(q k^T) v`` inside the chunk,
      diagonal included. ``O(n c d + n d e)`` time, no ``n x n`` matrix. The
      length need not be a multiple of ``c``.

    Non-causal attention uses the re-associated form (``"quadratic"``: the
    unmasked matrix).

    Args:
        q, k: ``(batch, heads, seq, dim)``, the same shape (no ``1/sqrt(d)``).
        v: ``(batch, heads, seq, v_dim)``.
        causal: token ``i`` sees tokens ``j <= i`` only.
        feature: a name in :data:`FEATURE_MAPS`, a callable, or ``None`` (inputs
            are features already).
        normalize: divide by ``phi(q_i) . z_i + eps``; ``False`` returns the
            numerator alone (the un-normalised attention of NormAttention).
        eps: added to the denominator.
        method: ``"chunked"``, ``"recurrent"``, ``"cumsum"`` or ``"quadratic"``.
        chunk_size: ``c`` for ``"chunked"``.

    Returns:
        ``(batch, heads, seq, v_dim)``.

    Raises:
        ValueError: for wrong shapes, an unknown method or feature map,
            ``chunk_size < 1`` or a negative ``eps``.
    """
    _check_qkv(q, k, v)
    method = _check_method(method)
    chunk_size = check_int("chunk_size", chunk_size)
    eps, causal, normalize = _check_eps(eps), check_bool("causal", causal), check_bool("normalize", normalize)
    phi = feature_map(feature)
    fq, fk = phi(q), phi(k)
    num, den = _numerator_denominator(fq, fk, v, causal, method, chunk_size, normalize)
    if not normalize:
        return num
    return num / (den[..., None] + eps)


def linear_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    causal: bool = True,
    feature: Union[str, FeatureMap, None] = "elu+1",
    normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The attention matrix that linear attention never forms, for inspection.

    ``P_ij = phi(q_i) . phi(k_j) / (sum_{j'} phi(q_i) . phi(k_j') + eps)`` over
    the visible keys (``j <= i`` when causal), so that
    ``linear_attention(q, k, v) == P @ v`` (Qin et al., 2022, Eq. 5).

    Args:
        q, k: ``(batch, heads, seq, dim)``.
        normalize: divide each row by its sum (+ ``eps``); ``False`` gives the raw
            scores ``phi(q_i) . phi(k_j)`` (masked to 0 above the diagonal when causal).

    Returns:
        ``(batch, heads, seq, seq)``.
    """
    _check_qkv(q, k, k)
    eps, causal, normalize = _check_eps(eps), check_bool("causal", causal), check_bool("normalize", normalize)
    phi = feature_map(feature)
    scores = phi(q) @ phi(k).transpose(-2, -1)
    if causal:
        scores = scores.tril()
    if normalize:
        scores = scores / (scores.sum(-1, keepdim=True) + eps)
    return scores


# ---------------------------------------------------------------------------
# RoPE in linear attention
# ---------------------------------------------------------------------------


def rope_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    causal: bool = True,
    *,
    feature: Union[str, FeatureMap, None] = "elu+1",
    normalize: bool = True,
    eps: float = 1e-6,
    base: float = 10000.0,
    interleaved: bool = False,
    method: str = "chunked",
    chunk_size: int = 64,
) -> torch.Tensor:
    """Linear attention with RoPE in the numerator only (Su, 2021, "RoPE", Sec. "linear attention").

    ::

        out_i = sum_j [R_i phi(q_i)]^T [R_j phi(k_j)] v_j / (sum_j phi(q_i)^T phi(k_j) + eps)

    Rotated scores can be negative, so the denominator keeps the unrotated
    features: it stays positive (with a positive feature map), the numerator
    depends on positions only through ``i - j``, and the numerator still has
    the linear-time form (rotate the features, then any ``method``).

    Args:
        q, k: ``(batch, heads, seq, dim)`` with ``dim`` even; v: ``(batch, heads, seq, v_dim)``.
        positions: ``(seq,)`` positions for :func:`posenc.apply_rope` (default ``0..seq-1``).
        normalize: ``False`` returns the rotated numerator alone.
        base, interleaved: RoPE settings.
        causal, feature, eps, method, chunk_size: as in :func:`linear_attention`.

    Returns:
        ``(batch, heads, seq, v_dim)``.
    """
    _check_qkv(q, k, v)
    if q.shape[-1] % 2:
        raise ValueError(f"RoPE rotates channel pairs: head_dim must be even, got {q.shape[-1]}")
    method = _check_method(method)
    chunk_size = check_int("chunk_size", chunk_size)
    eps, causal, normalize = _check_eps(eps), check_bool("causal", causal), check_bool("normalize", normalize)
    phi = feature_map(feature)
    fq, fk = phi(q), phi(k)
    rq = apply_rope(fq, positions, base, interleaved)
    rk = apply_rope(fk, positions, base, interleaved)
    num, _ = _numerator_denominator(rq, rk, v, causal, method, chunk_size, need_den=False)
    if not normalize:
        return num
    if causal:
        den = (fq * fk.cumsum(2)).sum(-1)
    else:
        den = (fq @ fk.sum(-2)[..., None]).squeeze(-1)
    return num / (den[..., None] + eps)
