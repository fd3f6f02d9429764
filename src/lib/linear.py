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
  :func:`diag_attention` restricts early layers to non-overlapping blocks
  (DiagAttention), ``O(n w d)`` for block size ``w``.

:class:`TransNormerLM` stacks DiagAttention in the first half of the layers
and NormAttention in the second, with GLU feed-forward blocks. RoPE can be
used inside linear attention by rotating the features in the numerator only
(Su, 2021): :func:`rope_linear_attention`.

Tensors are ``(batch, heads, seq, head_dim)`` throughout.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention as _softmax_attention
from .rope import apply_rope

__all__ = [
    "FEATURE_MAPS",
    "elu_plus_one",
    "relu_feature",
    "feature_map",
    "linear_attention",
    "linear_attention_weights",
    "rms_norm",
    "norm_attention",
    "block_diagonal_mask",
    "diag_attention",
    "rope_linear_attention",
    "locally_accumulated_attention",
    "gradient_relative_std",
    "SoftmaxAttention",
    "LinearAttention",
    "NormAttention",
    "DiagAttention",
    "TransNormerLM",
    "lagged_copy_tokens",
    "train_tiny_lm",
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
    """
    return F.elu(x) + 1.0


def relu_feature(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = max(x, 0)``: non-negative, but exactly zero on half the space.

    With it the denominator ``phi(q_i) . z_i`` of normalised linear attention
    can be zero or arbitrarily small, the situation of Qin et al. (2022, Prop. 3.1).
    """
    return F.relu(x)


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
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.ndim != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a (batch, heads, seq, dim) tensor, got {shape}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape (batch, heads, seq, dim); got {tuple(q.shape)} "
                         f"and {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be (batch, heads, seq, v_dim) with the (batch, heads, seq) of k = "
                         f"{tuple(k.shape[:3])}; got {tuple(v.shape)}")


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _check_method(method: str) -> str:
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    return method


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
    _check_method(method)
    _check_positive_int("chunk_size", chunk_size)
    eps = _check_eps(eps)
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
    eps = _check_eps(eps)
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
    out = x * torch.rsqrt(x.pow(2).mean(dim=dim, keepdim=True) + eps)
    if weight is not None:
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
    if per_head:
        return rms_norm(unnormalised, eps, weight)
    merged = rms_norm(_merge_heads(unnormalised), eps, weight)
    return _split_heads(merged, q.shape[1])


# ---------------------------------------------------------------------------
# DiagAttention
# ---------------------------------------------------------------------------


def block_diagonal_mask(
    seq_len: int, block_size: int, *, causal: bool = True, device: Optional[torch.device] = None
) -> torch.Tensor:
    """Boolean mask of DiagAttention: tokens attend within their own block only.

    Blocks are ``[0, w), [w, 2w), ...`` (non-overlapping); when ``causal``,
    also ``j <= i``.

    Returns:
        ``(seq_len, seq_len)`` bool, True = may attend.

    >>> block_diagonal_mask(4, 2).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    _check_positive_int("block_size", block_size)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be an integer >= 0, got {seq_len!r}")
    block = torch.arange(seq_len, device=device) // block_size
    mask = block[:, None] == block[None, :]
    if causal:
        mask = mask & torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    return mask


def diag_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int = 64,
    causal: bool = True,
    kind: str = "softmax",
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """DiagAttention of TransNormer (Qin et al., 2022, Sec. 4.3): attention inside blocks.

    The sequence is cut into non-overlapping blocks of ``w = block_size``
    tokens (the tail padded); each block attends only to itself, causally when
    ``causal``, with queries scaled by ``1 / sqrt(d)``:

    * ``kind="softmax"`` (TransNormer T2): softmax attention in each block,
      through PyTorch's fused ``scaled_dot_product_attention``;
    * ``kind="relu"`` (T1, ReLA of Zhang et al., 2021): weights
      ``relu(q k^T / sqrt(d))``, then an RMSNorm (no gain) of each head's output.

    Implemented by reshaping to ``(batch, heads, n / w, w, dim)``, so it costs
    ``O(n w d)`` time and ``O(n w)`` memory, never an ``n x n`` matrix. The
    softmax kind equals :func:`posenc.attention` with
    ``mask=block_diagonal_mask(n, w)``.

    Args:
        q, k: ``(batch, heads, seq, dim)``; v: ``(batch, heads, seq, v_dim)``.
        block_size: ``w >= 1`` (64 in the paper).
        kind: ``"softmax"`` or ``"relu"``.
        eps: of the RMSNorm of the ``"relu"`` kind.

    Returns:
        ``(batch, heads, seq, v_dim)``.
    """
    _check_qkv(q, k, v)
    _check_positive_int("block_size", block_size)
    if kind not in ("softmax", "relu"):
        raise ValueError(f"kind must be 'softmax' or 'relu', got {kind!r}")
    eps = _check_eps(eps)
    b, h, n, d = q.shape
    e = v.shape[-1]
    if n == 0:
        return v.new_zeros(b, h, 0, e)
    w = min(block_size, n)
    pad = (-n) % w
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    blocks = (n + pad) // w
    scale = 1.0 / math.sqrt(d)
    if kind == "softmax":
        qb, kb, vb = (t.reshape(b, h * blocks, w, t.shape[-1]) for t in (q, k, v))
        if causal:  # padded keys come after every real query: the causal mask hides them
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        else:
            valid = (torch.arange(blocks * w, device=q.device) < n).reshape(blocks, 1, w)
            mask = valid.expand(h, blocks, 1, w).reshape(1, h * blocks, 1, w)
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        return out.reshape(b, h, blocks * w, e)[:, :, :n]
    qb, kb, vb = (t.reshape(b, h, blocks, w, t.shape[-1]) for t in (q, k, v))
    weights = torch.relu(qb @ kb.transpose(-2, -1) * scale)  # padded keys are 0 -> weight 0
    if causal:
        weights = weights.tril()
    out = (weights @ vb).reshape(b, h, blocks * w, e)[:, :, :n]
    return rms_norm(out, eps)


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
    _check_method(method)
    _check_positive_int("chunk_size", chunk_size)
    eps = _check_eps(eps)
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
    if not isinstance(weights, torch.Tensor) or weights.ndim < 2 or not weights.is_floating_point():
        raise ValueError("weights must be a floating-point tensor (..., q_len, k_len)")
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
    r = torch.as_tensor(ratios, dtype=torch.float64).reshape(-1).cpu()
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
    if not per_query:
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
    g = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    if g.numel() < 2 or not torch.isfinite(g).all():
        raise ValueError("need at least two finite values")
    mean = g.mean()
    if mean <= 0:
        raise ValueError(f"the mean must be positive, got {mean.item()}")
    return (g.std(unbiased=False) / mean).item()


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------

_POS = ("none", "rope", "learned")


class _MultiHead(nn.Module):
    """Shared projections: ``x (batch, seq, d_model)`` -> heads -> mix -> ``(batch, seq, d_model)``."""

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, rope: bool = False,
                 rope_base: float = 10000.0) -> None:
        super().__init__()
        _check_positive_int("d_model", d_model)
        _check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        if rope and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        self.causal, self.rope, self.rope_base = bool(causal), bool(rope), float(rope_base)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, x: torch.Tensor):
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, seq, {self.d_model}), got {tuple(x.shape)}")
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return tuple(_split_heads(t, self.n_heads) for t in (q, k, v))

    def _rotate(self, t: torch.Tensor) -> torch.Tensor:
        return apply_rope(t, None, self.rope_base) if self.rope else t

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x)
        return self.out(_merge_heads(self.mix(q, k, v)))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The ``(batch, heads, seq, seq)`` matrix this layer applies to the values for input ``x``."""
        q, k, _ = self._heads(x)
        return self.weights(q, k)


class SoftmaxAttention(_MultiHead):
    """Multi-head softmax attention (SDPA), optionally with RoPE: the baseline.

    Args:
        d_model, n_heads: model width and number of heads.
        causal: causal mask.
        rope: rotate ``q`` and ``k`` with :func:`posenc.apply_rope`.
    """

    def mix(self, q, k, v):
        return _softmax_attention(self._rotate(q), self._rotate(k), v, causal=self.causal)

    def weights(self, q, k):
        q, k = self._rotate(q), self._rotate(k)
        return _softmax_attention(q, k, k, causal=self.causal, return_weights=True)[1]


class LinearAttention(_MultiHead):
    """Multi-head kernel linear attention with the denominator (the "1 + elu" baseline).

    Args:
        d_model, n_heads, causal: as usual.
        feature: feature map name (default ``"elu+1"``).
        rope: RoPE in the numerator only (:func:`rope_linear_attention`).
        eps, method, chunk_size: see :func:`linear_attention`.
    """

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, feature: str = "elu+1",
                 rope: bool = False, eps: float = 1e-6, method: str = "chunked", chunk_size: int = 64) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope)
        feature_map(feature)
        _check_method(method)
        self.feature, self.eps = feature, _check_eps(eps)
        self.method, self.chunk_size = method, _check_positive_int("chunk_size", chunk_size)

    def mix(self, q, k, v):
        kw = dict(causal=self.causal, feature=self.feature, eps=self.eps, method=self.method,
                  chunk_size=self.chunk_size)
        if self.rope:
            return rope_linear_attention(q, k, v, base=self.rope_base, **kw)
        return linear_attention(q, k, v, **kw)

    def denominator(self, x: torch.Tensor) -> torch.Tensor:
        """The denominators ``phi(q_i) . z_i`` (``z_i = sum_{j<=i} phi(k_j)`` when causal) for input ``x``.

        Returns:
            ``(batch, heads, seq)``, without the ``eps``. Prop. 3.1 of Qin et al.
            (2022) is about these getting close to 0.
        """
        q, k, _ = self._heads(x)
        phi = feature_map(self.feature)
        fq, fk = phi(q), phi(k)
        z = fk.cumsum(2) if self.causal else fk.sum(2, keepdim=True)
        return (fq * z).sum(-1)

    def weights(self, q, k):
        if not self.rope:
            return linear_attention_weights(q, k, causal=self.causal, feature=self.feature, eps=self.eps)
        phi = feature_map(self.feature)
        fq, fk = phi(q), phi(k)
        num = self._rotate(fq) @ self._rotate(fk).transpose(-2, -1)
        den = fq @ fk.transpose(-2, -1)
        if self.causal:
            num, den = num.tril(), den.tril()
        return num / (den.sum(-1, keepdim=True) + self.eps)


class NormAttention(_MultiHead):
    """TransNormer's NormAttention layer: ``RMSNorm(phi(Q) phi(K)^T V)`` (Qin et al., 2022, Eq. 11).

    No denominator, no ``1/sqrt(d)``. The norm is over the concatenated heads
    and has no gain, as in the authors' code; ``per_head=True`` normalises
    each head separately and ``gain=True`` adds a learnable gain.

    Args:
        d_model, n_heads, causal: as usual.
        feature: ``"elu+1"`` (T2) or ``"elu"`` (T1), or any name in :data:`FEATURE_MAPS`.
        per_head, gain, eps: the RMSNorm.
        rope: rotate ``phi(q)``, ``phi(k)`` with RoPE (there is no denominator to protect).
        method, chunk_size: see :func:`linear_attention`.
    """

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, feature: str = "elu+1",
                 per_head: bool = False, gain: bool = False, eps: float = 1e-6, rope: bool = False,
                 method: str = "chunked", chunk_size: int = 64) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope)
        feature_map(feature)
        _check_method(method)
        self.feature, self.per_head, self.eps = feature, bool(per_head), _check_eps(eps)
        self.method, self.chunk_size = method, _check_positive_int("chunk_size", chunk_size)
        size = self.head_dim if per_head else d_model
        self.gain = nn.Parameter(torch.ones(size)) if gain else None

    def mix(self, q, k, v):
        phi = feature_map(self.feature)
        fq, fk = self._rotate(phi(q)), self._rotate(phi(k))
        return norm_attention(fq, fk, v, causal=self.causal, feature=None, eps=self.eps,
                              per_head=self.per_head, weight=self.gain, method=self.method,
                              chunk_size=self.chunk_size)

    def weights(self, q, k):
        """Raw scores ``phi(q_i) . phi(k_j)`` (before the norm; rows do not sum to 1)."""
        phi = feature_map(self.feature)
        return linear_attention_weights(self._rotate(phi(q)), self._rotate(phi(k)), causal=self.causal,
                                        feature=None, normalize=False)


class DiagAttention(_MultiHead):
    """TransNormer's DiagAttention layer: attention within non-overlapping blocks.

    Args:
        d_model, n_heads, causal: as usual.
        block_size: block length ``w`` (64 in the paper).
        kind: ``"softmax"`` (T2) or ``"relu"`` (T1); see :func:`diag_attention`.
        rope: rotate ``q`` and ``k`` with RoPE first.
    """

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, block_size: int = 64,
                 kind: str = "softmax", rope: bool = False, eps: float = 1e-6) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope)
        if kind not in ("softmax", "relu"):
            raise ValueError(f"kind must be 'softmax' or 'relu', got {kind!r}")
        self.block_size, self.kind = _check_positive_int("block_size", block_size), kind
        self.eps = _check_eps(eps)

    def mix(self, q, k, v):
        return diag_attention(self._rotate(q), self._rotate(k), v, block_size=self.block_size,
                              causal=self.causal, kind=self.kind, eps=self.eps)

    def weights(self, q, k):
        """Block-diagonal weights (softmax probabilities, or ReLU scores before the norm)."""
        q, k = self._rotate(q), self._rotate(k)
        mask = block_diagonal_mask(q.shape[-2], self.block_size, causal=self.causal, device=q.device)
        if self.kind == "softmax":
            return _softmax_attention(q, k, k, mask=mask, causal=self.causal, return_weights=True)[1]
        scores = torch.relu(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
        return scores * mask


class _RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)


class _FeedForward(nn.Module):
    """GLU (Shazeer, 2020): ``W_o (silu(W_1 x) * W_2 x)``; or a GELU MLP when ``glu=False``."""

    def __init__(self, d_model: int, d_hidden: int, glu: bool = True) -> None:
        super().__init__()
        self.glu = glu
        self.inp = nn.Linear(d_model, (2 if glu else 1) * d_hidden, bias=False)
        self.out = nn.Linear(d_hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.glu:
            gate, value = self.inp(x).chunk(2, dim=-1)
            return self.out(F.silu(gate) * value)
        return self.out(F.gelu(self.inp(x)))


class _Block(nn.Module):
    def __init__(self, attn: nn.Module, d_model: int, d_hidden: int, glu: bool) -> None:
        super().__init__()
        self.norm1, self.attn = _RMSNorm(d_model), attn
        self.norm2, self.ffn = _RMSNorm(d_model), _FeedForward(d_model, d_hidden, glu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


_KINDS = ("softmax", "linear", "norm", "diag")


class TransNormerLM(nn.Module):
    """A small decoder-only language model with TransNormer's layer layout (Qin et al., 2022).

    By default the first ``n_layers // 2`` layers use DiagAttention and the
    rest NormAttention, with GLU feed-forward blocks (their T2 variant: softmax
    in the blocks, ``1 + elu`` features in NormAttention). ``kinds`` chooses the
    attention of every layer, so the same class builds the baselines:
    ``["softmax"] * L`` (a vanilla pre-norm Transformer), ``["linear"] * L``
    (the ``1 + elu`` linear Transformer), ``["norm"] * L``.

    Args:
        vocab_size, d_model, n_layers, n_heads: sizes.
        kinds: per-layer attention, each of ``"softmax"``, ``"linear"``, ``"norm"``, ``"diag"``.
        diag_block: DiagAttention block size (64 in the paper).
        diag_kind: ``"softmax"`` (T2) or ``"relu"`` (T1).
        feature: feature map of the linear and norm layers.
        glu: GLU feed-forward (else a GELU MLP); hidden width ``ffn_mult * d_model``.
        pos: ``"learned"`` absolute embeddings (up to ``max_len``), ``"rope"``
            in every attention layer (numerator-only in linear layers), or ``"none"``.
        max_len: longest sequence for ``pos="learned"``.
        norm_per_head: NormAttention normalises every head separately.
        chunk_size: chunk of the linear and norm layers.

    Shapes:
        ``forward(idx)``: ``(batch, seq)`` token ids -> ``(batch, seq, vocab_size)`` logits.
    """

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, *,
                 kinds: Optional[Sequence[str]] = None, diag_block: int = 64, diag_kind: str = "softmax",
                 feature: str = "elu+1", glu: bool = True, ffn_mult: float = 2.0, pos: str = "learned",
                 max_len: int = 1024, causal: bool = True, norm_per_head: bool = False,
                 chunk_size: int = 64) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("n_layers", n_layers),
                            ("n_heads", n_heads), ("max_len", max_len)):
            _check_positive_int(name, value)
        if pos not in _POS:
            raise ValueError(f"pos must be one of {_POS}, got {pos!r}")
        if kinds is None:
            kinds = ["diag"] * (n_layers // 2) + ["norm"] * (n_layers - n_layers // 2)
        kinds = list(kinds)
        if len(kinds) != n_layers or any(kd not in _KINDS for kd in kinds):
            raise ValueError(f"kinds must list {n_layers} entries from {_KINDS}, got {kinds!r}")
        self.kinds, self.pos, self.max_len = kinds, pos, max_len
        rope = pos == "rope"
        d_hidden = max(1, int(round(ffn_mult * d_model)))

        def make(kind: str) -> nn.Module:
            if kind == "softmax":
                return SoftmaxAttention(d_model, n_heads, causal=causal, rope=rope)
            if kind == "linear":
                return LinearAttention(d_model, n_heads, causal=causal, feature=feature, rope=rope,
                                       chunk_size=chunk_size)
            if kind == "norm":
                return NormAttention(d_model, n_heads, causal=causal, feature=feature, rope=rope,
                                     per_head=norm_per_head, chunk_size=chunk_size)
            return DiagAttention(d_model, n_heads, causal=causal, block_size=diag_block, kind=diag_kind,
                                 rope=rope)

        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model) if pos == "learned" else None
        self.blocks = nn.ModuleList(_Block(make(kd), d_model, d_hidden, glu) for kd in kinds)
        self.norm = _RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.ndim != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be (batch, seq) integer token ids, got {tuple(idx.shape)} {idx.dtype}")
        x = self.embed(idx)
        if self.pos_embed is not None:
            if idx.shape[1] > self.max_len:
                raise ValueError(f"sequence length {idx.shape[1]} exceeds max_len={self.max_len} "
                                 "of the learned position embeddings")
            x = x + self.pos_embed(torch.arange(idx.shape[1], device=idx.device))
        return x

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self._embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @torch.no_grad()
    def attention_inputs(self, idx: torch.Tensor) -> List[torch.Tensor]:
        """Per layer, the ``(batch, seq, d_model)`` input of its attention (after the pre-norm)."""
        x = self._embed(idx)
        inputs = []
        for block in self.blocks:
            inputs.append(block.norm1(x))
            x = block(x)
        return inputs

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> List[torch.Tensor]:
        """Per layer, the ``(batch, heads, seq, seq)`` matrix applied to the values.

        Softmax and DiagAttention layers: probabilities; linear layers:
        ``phi(q_i).phi(k_j)`` normalised by the row sum; NormAttention layers:
        the raw scores ``phi(q_i).phi(k_j)`` (before the RMSNorm).
        """
        return [block.attn.attention_weights(x) for block, x in zip(self.blocks, self.attention_inputs(idx))]


# ---------------------------------------------------------------------------
# A synthetic task and a compact training loop
# ---------------------------------------------------------------------------


def lagged_copy_tokens(
    batch: int,
    seq_len: int,
    vocab_size: int,
    *,
    lag: int = 2,
    p_copy: float = 0.8,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Random token sequences where each token repeats the one ``lag`` places back with probability ``p_copy``.

    ``x_t = x_{t - lag}`` with probability ``p_copy``, else uniform over the
    vocabulary (the first ``lag`` tokens are uniform). Predicting ``x_{t+1}``
    needs the token ``lag - 1`` places before the current one: a purely local
    task, the kind softmax attention solves with a sharp "look back" head and
    diluted attention struggles with. The best achievable loss per token
    (after the first ``lag``) is the entropy of
    ``p_copy * onehot + (1 - p_copy) * uniform``.

    Returns:
        ``(batch, seq_len)`` int64 on the CPU.
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("vocab_size", vocab_size), ("lag", lag)):
        _check_positive_int(name, value)
    if not (isinstance(p_copy, Real) and 0.0 <= p_copy <= 1.0):
        raise ValueError(f"p_copy must be in [0, 1], got {p_copy!r}")
    x = torch.randint(vocab_size, (batch, seq_len), generator=generator)
    copy = torch.rand(batch, seq_len, generator=generator) < p_copy
    for t in range(lag, seq_len):
        x[:, t] = torch.where(copy[:, t], x[:, t - lag], x[:, t])
    return x


def train_tiny_lm(
    model: nn.Module,
    make_batch: Callable[[torch.Generator], torch.Tensor],
    *,
    steps: int,
    lr: float = 3e-3,
    warmup: int = 0,
    weight_decay: float = 0.0,
    clip: Optional[float] = None,
    seed: int = 0,
    device: Optional[torch.device] = None,
    progress: bool = False,
    num_threads: Optional[int] = 1,
) -> Dict[str, List[float]]:
    """Train a next-token model with AdamW; record the loss and gradient norm of every step.

    Args:
        model: maps ``(batch, seq)`` ids to ``(batch, seq, vocab)`` logits.
        make_batch: ``generator -> (batch, seq + 1)`` token ids; inputs are
            ``[:, :-1]``, targets ``[:, 1:]``.
        steps: optimisation steps.
        lr, weight_decay: AdamW; ``warmup`` steps of linear warm-up, then constant.
        clip: clip the global gradient norm (the *recorded* norm is before clipping).
        seed: seeds the batch generator (the model's initialisation is the caller's).
        device: where to train (default: the model's device).
        progress: show a tqdm progress bar.
        num_threads: CPU threads while training (restored afterwards); tiny
            models are dominated by per-operation overhead, and one thread
            avoids oversubscribing the cores when several notebooks run side
            by side. ``None`` leaves the setting alone.

    Returns:
        ``{"loss": [...], "grad_norm": [...]}``, one float per step.
    """
    _check_positive_int("steps", steps)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if not (isinstance(lr, Real) and lr > 0):
        raise ValueError(f"lr must be positive, got {lr!r}")
    if num_threads is not None:
        _check_positive_int("num_threads", num_threads)
    if device is None:
        device = next(model.parameters()).device
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _train_loop(model, make_batch, steps, lr, warmup, weight_decay, clip, seed, device, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _train_loop(
    model: nn.Module, make_batch: Callable[[torch.Generator], torch.Tensor], steps: int, lr: float, warmup: int,
    weight_decay: float, clip: Optional[float], seed: int, device: torch.device, progress: bool,
) -> Dict[str, List[float]]:
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    history: Dict[str, List[float]] = {"loss": [], "grad_norm": []}
    iterator = range(steps)
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(iterator, leave=False)
    for step in iterator:
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
        tokens = make_batch(gen).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
        norm = torch.cat(grads).norm().item()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        history["loss"].append(loss.item())
        history["grad_norm"].append(norm)
    model.eval()
    return history
