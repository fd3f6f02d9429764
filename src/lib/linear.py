"""Linear attention and TransNormer (Katharopoulos et al., 2020; Qin et al., 2022).

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

TransNormer (Qin et al., 2022, "The Devil in Linear Transformer") diagnoses
two problems of kernel linear attention and fixes each:

* **unbounded gradients** (their Prop. 3.1): the denominator
  ``phi(q_i) . z_i`` can be arbitrarily small. :func:`norm_attention` drops
  it and normalises the output with an RMSNorm instead (NormAttention);
* **attention dilution**: linear attention spreads its weight over the whole
  sequence, measured by :func:`locally_accumulated_attention`.
  DiagAttention (:func:`posenc.diag_attention`) restricts early layers to
  non-overlapping blocks.

RoPE can be used inside linear attention by rotating the features in the
numerator only (Su, 2021): :func:`rope_linear_attention`. The layers built on
these kernels are in :mod:`posenc.layers`; :func:`transnormer_layout` gives a
model's TransNormer layout (``TinyLM(attention=transnormer_layout(n_layers))``).

Tensors are ``(batch, heads, seq, head_dim)`` throughout.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ._validate import _float_tensor, check_bool, check_int, one_of
from .masks import _LAYOUT, _as_tensor, _check_tensors
from .rotary import apply_rope

__all__ = [
    "FEATURE_MAPS",
    "elu_plus_one",
    "relu_feature",
    "feature_map",
    "linear_attention",
    "linear_attention_weights",
    "rms_norm",
    "norm_attention",
    "rope_linear_attention",
    "locally_accumulated_attention",
    "gradient_relative_std",
    "transnormer_layout",
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
# NormAttention
# ---------------------------------------------------------------------------


def rms_norm(
    x: torch.Tensor, eps: float = 1e-6, weight: Optional[torch.Tensor] = None, dim: int = -1
) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich, 2019): ``x / sqrt(mean(x^2) + eps) * weight``.

    The mean is over ``dim``. Without ``weight`` (TransNormer's choice) every
    slice along ``dim`` comes out with root-mean-square 1 (slightly less
    when its RMS is comparable to ``sqrt(eps)``).

    >>> rms_norm(torch.tensor([3.0, 4.0]), eps=0.0)  # RMS of (3, 4) is sqrt(12.5)
    tensor([0.8485, 1.1314])
    """
    eps = _check_eps(eps)
    _check_tensors(x=x)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.ndim <= dim < x.ndim:
        raise ValueError(f"dim must be an integer in [-{x.ndim}, {x.ndim}) for x {tuple(x.shape)}, got {dim!r}")
    out = x * torch.rsqrt(x.pow(2).mean(dim=dim, keepdim=True) + eps)
    if weight is not None:
        _check_tensors(weight=weight)
        if dim not in (-1, x.ndim - 1) or weight.shape != (x.shape[-1],):
            raise ValueError(f"weight must have shape ({x.shape[-1]},) and dim must be -1; "
                             f"got weight {tuple(weight.shape)}, dim {dim}")
        out = out * weight
    return out


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, h, n, e = x.shape
    return x.transpose(1, 2).reshape(b, n, h * e)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, he = x.shape
    return x.reshape(b, n, heads, he // heads).transpose(1, 2)


def norm_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    *,
    feature: Union[str, FeatureMap, None] = "elu+1",
    eps: float = 1e-6,
    per_head: bool = False,
    weight: Optional[torch.Tensor] = None,
    method: str = "chunked",
    chunk_size: int = 64,
) -> torch.Tensor:
    """NormAttention of TransNormer (Qin et al., 2022, Eq. 11).

    ``O = RMSNorm(phi(Q) phi(K)^T V)``: linear attention *without* the
    denominator and without ``1/sqrt(d)``; the RMSNorm bounds the output in
    the forward pass and the gradient in the backward pass (their Sec. 4.2 and
    App. D.2.3). The causal product is computed as in :func:`linear_attention`
    with ``normalize=False``.

    The authors' norm has no gain and normalises over the *concatenated*
    heads (all ``heads * v_dim`` channels of a token together);
    ``per_head=True`` normalises every head separately instead.

    Args:
        q, k: ``(batch, heads, seq, dim)``; v: ``(batch, heads, seq, v_dim)``.
        feature: feature map (TransNormer T2: ``"elu+1"``; T1: ``"elu"``).
        eps: inside the square root of the RMSNorm.
        per_head: normalise each head over its ``v_dim`` channels.
        weight: optional gain, ``(heads * v_dim,)`` (or ``(v_dim,)`` per head).
        method, chunk_size: as in :func:`linear_attention`.

    Returns:
        ``(batch, heads, seq, v_dim)``.
    """
    unnormalised = linear_attention(q, k, v, causal=causal, feature=feature, normalize=False,
                                    method=method, chunk_size=chunk_size)
    if check_bool("per_head", per_head):
        return rms_norm(unnormalised, eps, weight)
    merged = rms_norm(_merge_heads(unnormalised), eps, weight)
    return _split_heads(merged, q.shape[1])


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


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------


def locally_accumulated_attention(
    weights: torch.Tensor,
    ratios: Union[float, Sequence[float], torch.Tensor],
    *,
    per_query: bool = False,
) -> torch.Tensor:
    """Locally accumulated attention score ``l(i, r, N)`` (Qin et al., 2022, Sec. 3.2, Fig. 2).

    For query ``i`` of a sequence of ``N`` keys, take the neighbourhood of
    ``L = floor(r N + 1/2)`` consecutive keys centred on ``i``'s own position
    (``floor(L/2)`` keys before it, ``L - 1 - floor(L/2)`` after it); near an
    end of the sequence the window is shifted to stay inside it, keeping ``L``
    keys. Then::

        l(i, r, N) = sum of p_ij over the keys j of that neighbourhood,

    with ``p_ij`` the row of weights normalised to sum 1 (so raw non-negative
    scores such as ``phi(q_i) . phi(k_j)`` are accepted). A high ``l`` at small
    ``r`` means attention concentrates near the query; a uniform row gives
    ``l = L / N``, and ``l(i, 1, N) = 1``. With ``k_len > q_len`` query ``i``
    sits at key position ``i + k_len - q_len``.

    Args:
        weights: ``(..., q_len, k_len)`` non-negative attention weights, e.g.
            ``(batch, heads, n, n)``; every row must have a positive sum.
        ratios: ``r`` in ``[0, 1]``, one value or a sequence.
        per_query: return ``l`` for every query instead of the mean over all
            queries (and leading dimensions).

    Returns:
        ``(len(ratios),)`` float64 means (the paper's curve), or
        ``(..., q_len, len(ratios))`` with ``per_query``. A scalar ``ratios``
        drops the last dimension.

    Raises:
        ValueError: for negative or non-finite weights, an all-zero row,
            ``q_len > k_len`` or ratios outside ``[0, 1]``.
    """
    if not isinstance(weights, torch.Tensor) or weights.ndim < 2 or not weights.is_floating_point() \
            or weights.device.type == "meta":
        raise ValueError("weights must be a floating-point tensor (..., q_len, k_len) with values (not on meta)")
    q_len, k_len = weights.shape[-2], weights.shape[-1]
    if q_len > k_len or q_len == 0:
        raise ValueError(f"need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    w = weights.detach().to(torch.float64)
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and non-negative")
    total = w.sum(-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError("every row of weights needs a positive sum")
    w = w / total
    scalar = isinstance(ratios, Real) or (isinstance(ratios, torch.Tensor) and ratios.ndim == 0)
    r = _as_tensor("ratios", ratios, values=True, dtype=torch.float64).reshape(-1).cpu()
    if r.numel() == 0 or not torch.isfinite(r).all() or (r < 0).any() or (r > 1).any():
        raise ValueError(f"ratios must lie in [0, 1], got {ratios!r}")
    length = torch.floor(r * k_len + 0.5).long().clamp(0, k_len)  # (R,) neighbourhood sizes L
    pos = torch.arange(q_len) + (k_len - q_len)  # (q,) key position of each query
    start = (pos[:, None] - length[None, :] // 2).clamp(min=0)  # (q, R)
    start = torch.minimum(start, k_len - length[None, :])  # shift inside the sequence
    end = start + length[None, :]  # exclusive
    cum = F.pad(w.cumsum(-1), (1, 0))  # (..., q, k + 1): cum[..., j] = sum_{j' < j}
    lead = cum.shape[:-2]
    start = start.to(cum.device).expand(*lead, q_len, r.numel())
    end = end.to(cum.device).expand(*lead, q_len, r.numel())
    score = cum.gather(-1, end) - cum.gather(-1, start)  # (..., q, R)
    if not check_bool("per_query", per_query):
        score = score.reshape(-1, r.numel()).mean(0)
    return score[..., 0] if scalar else score


def gradient_relative_std(values: Union[Sequence[float], torch.Tensor]) -> float:
    """Relative standard deviation ``std(g) / mean(g)`` of a series of gradient norms.

    TransNormer's Table 2 (Qin et al., 2022) compares how much gradients
    fluctuate over training; we read it as the spread of the per-iteration
    gradient norm relative to its mean (population standard deviation).

    >>> gradient_relative_std([1.0, 3.0])
    0.5

    Raises:
        ValueError: with fewer than two values, non-finite values or a mean <= 0.
    """
    g = _as_tensor("values", values, values=True, dtype=torch.float64).reshape(-1)
    if g.numel() < 2 or not torch.isfinite(g).all():
        raise ValueError("need at least two finite values")
    mean = g.mean()
    if mean <= 0:
        raise ValueError(f"the mean must be positive, got {mean.item()}")
    return (g.std(unbiased=False) / mean).item()


def transnormer_layout(n_layers: int) -> list:
    """TransNormer's attention kinds for ``n_layers`` layers: DiagAttention first, then NormAttention.

    Qin et al. (2022, Sec. 4.3) put the local DiagAttention in the lower half
    of the layers and NormAttention in the upper half; an odd count gives the
    extra layer to NormAttention. The list is ``TinyLM(attention=...)``'s.

    >>> transnormer_layout(4)
    ['diag', 'diag', 'norm', 'norm']

    Raises:
        ValueError: if ``n_layers`` is not a positive integer.
    """
    n_layers = check_int("n_layers", n_layers)
    return ["diag"] * (n_layers // 2) + ["norm"] * (n_layers - n_layers // 2)
