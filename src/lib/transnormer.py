"""TransNormer (Qin et al., 2022, "The Devil in Linear Transformer"): NormAttention, DiagAttention, and its diagnostics.

TransNormer diagnoses two problems of kernel linear attention
(:mod:`posenc.linear`) and fixes each:

* **unbounded gradients** (their Prop. 3.1): the denominator
  ``phi(q_i) . z_i`` can be arbitrarily small. :func:`norm_attention` drops
  it and normalises the output with an RMSNorm instead (NormAttention);
  :func:`gradient_relative_std` measures how much gradients vary;
* **attention dilution**: linear attention spreads its weight over the whole
  sequence, measured by :func:`locally_accumulated_attention`.
  DiagAttention (:func:`diag_attention`, :func:`block_diagonal_mask`)
  restricts early layers to non-overlapping blocks.

:func:`transnormer_layout` gives a model's TransNormer layout
(``TinyLM(attention=transnormer_layout(n_layers))``); the layers are in
:mod:`posenc.layers`. Tensors are ``(batch, heads, seq, head_dim)`` throughout.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ._validate import check_bool, check_int
from .linear import FeatureMap, _check_eps, _check_qkv, linear_attention
from .masks import _as_tensor, _check_tensors

__all__ = [
    "rms_norm",
    "norm_attention",
    "block_diagonal_mask",
    "diag_attention",
    "locally_accumulated_attention",
    "gradient_relative_std",
    "transnormer_layout",
]


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
        _check_tensors(x=x, weight=weight)  # one dtype and device: a float64 weight would make the output float64
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
    block_size = check_int("block_size", block_size)
    seq_len = check_int("seq_len", seq_len, low=0)
    block = torch.arange(seq_len, device=device) // block_size
    mask = block[:, None] == block[None, :]
    if check_bool("causal", causal):
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
    block_size = check_int("block_size", block_size)
    if kind not in ("softmax", "relu"):
        raise ValueError(f"kind must be 'softmax' or 'relu', got {kind!r}")
    eps, causal = _check_eps(eps), check_bool("causal", causal)
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
    if weights.numel() == 0:  # a mean over no rows would be NaN
        raise ValueError(f"weights has no rows to average over: shape {tuple(weights.shape)}")
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
