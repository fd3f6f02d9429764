"""Attention sinks: a sliding window that keeps the first tokens (Xiao et al., 2024, StreamingLLM).

A model trained with full causal attention learns to park surplus attention
on the first few tokens, whatever they say: they are visible to every query,
so they make a cheap "no-op" target. A plain sliding window removes them once
the sequence is longer than the window, and the model breaks down. Keeping
the first ``sinks`` keys visible to every query, in addition to its
``window`` latest keys, restores it (StreamingLLM keeps 4).

:func:`sink_attention` is causal softmax attention with that mask, on
PyTorch's fused ``scaled_dot_product_attention``: queries go in chunks of 256,
and each chunk reads only its sink keys and the keys of its window, so the
cost is that of windowed attention, ``O(n (window + sinks))``.

Positions. StreamingLLM keeps a rolling key/value cache and gives positions
*within the cache*: with RoPE, the sinks sit at cache positions ``0 ..
sinks-1`` and the window right after them, so no query ever sees a relative
distance above ``sinks + window``. Here the whole sequence is evaluated at
once and every token keeps its **original position**: a query at position
``i`` sees a sink at distance ``i`` (rotations are applied before this
function, ALiBi / table biases by the true distance ``i - j``). The
full-sequence variant isolates the effect of the mask; for RoPE models the
cache-position variant differs only in the distances to the sinks.

Learned sink logits (gpt-oss, OpenAI 2025; the "off-by-one" softmax of Miller,
2023, is the case of a logit fixed at 0) give a head a way to attend to
nothing without a token to park on: a learned logit ``a_h`` per head joins
every row's normaliser, ``w_ij = exp(s_ij) / (exp(a_h) + sum_j' exp(s_ij'))``,
so the weights on the real tokens sum to ``sigmoid(lse_i - a_h) < 1``
(:func:`sink_logit_attention`, ``TinyLM(..., sink_logit=True)``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from ._validate import check_bool, check_int
from .attention import _check_qkv, _distance_values, _empty, _relative_inputs, _scaled, _softmax, relative_attention
from .masks import sliding_window_mask

__all__ = ["sink_attention", "attention_on_first_tokens", "attention_logsumexp", "sink_logit_attention"]

_CHUNK = 256


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, sinks: int,
                   slopes: Optional[torch.Tensor] = None, distance_bias: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None, return_weights: bool = False):
    """Causal attention to the ``window`` latest keys and the first ``sinks`` keys (StreamingLLM).

    Query ``i`` (at key position ``i + k_len - q_len``) may attend to key ``j``
    if ``j <= i`` and (``i - j < window`` or ``j < sinks``):
    :func:`posenc.sliding_window_mask` with ``sinks``. ``sinks=0`` is the plain
    sliding window. Positions are the original ones (see the module notes).

    Args:
        q: ``(batch, heads, q_len, head_dim)``, already rotated if the model rotates.
        k, v: ``(batch, heads, k_len, head_dim)`` and ``(..., k_len, v_dim)``.
        window: ``w >= 1``.
        sinks: ``>= 0`` first keys kept.
        slopes, distance_bias: ALiBi slopes ``(heads,)`` / a ``(heads, >= k_len)``
            table by distance, as in :func:`posenc.relative_attention`.
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        return_weights: also return the ``(batch, heads, q_len, k_len)`` weights
            (explicit softmax).

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``.

    >>> q = k = v = torch.randn(1, 2, 600, 8)
    >>> out = sink_attention(q, k, v, window=64, sinks=4)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(
    ...     q, k, v, attn_mask=sliding_window_mask(600, window=64, sinks=4))
    >>> bool((out - ref).abs().max() < 1e-5)
    True
    """
    _check_qkv(q, k, v)
    slopes, distance_bias, window = _relative_inputs(q, k, v, slopes, distance_bias, window)
    if window is None:
        raise ValueError("sink_attention needs a window >= 1 (without one every key is visible anyway)")
    sinks = check_int("sinks", sinks, low=0)
    return_weights = check_bool("return_weights", return_weights)
    q, scale = _scaled(q, scale)
    if q.numel() == 0:  # no query
        return _empty(q, k, v, return_weights)
    q_len, k_len = q.shape[2], k.shape[2]
    offset = k_len - q_len
    biased = slopes is not None or distance_bias is not None
    if return_weights:
        mask = sliding_window_mask(q_len, k_len, window=window, sinks=sinks, device=q.device)
        scores = (q @ k.transpose(-2, -1)) * scale
        if biased:
            d = torch.arange(offset, k_len, device=q.device)[:, None] - torch.arange(k_len, device=q.device)
            scores = scores + _distance_values(d, slopes, distance_bias, None, q.dtype)
        weights = _softmax(scores.masked_fill(~mask, float("-inf")))
        return weights @ v, weights
    outs = []
    for a in range(0, q_len, _CHUNK):
        e = min(a + _CHUNK, q_len)
        lo, hi = max(0, offset + a - window + 1), offset + e  # the chunk's window keys: lo .. hi-1
        head = min(sinks, lo)  # sink keys not already in the window range
        idx = torch.cat((torch.arange(head), torch.arange(lo, hi))).to(q.device)
        d = torch.arange(offset + a, offset + e, device=q.device)[:, None] - idx  # (chunk, keys)
        allowed = (d >= 0) & ((d < window) | (idx < sinks))
        if biased:
            mask = _distance_values(d, slopes, distance_bias, None, q.dtype).masked_fill(~allowed, float("-inf"))[None]
        else:
            mask = allowed
        kc = k[:, :, idx] if head else k[:, :, lo:hi]
        vc = v[:, :, idx] if head else v[:, :, lo:hi]
        outs.append(F.scaled_dot_product_attention(q[:, :, a:e], kc, vc, attn_mask=mask, scale=scale))
    return torch.cat(outs, dim=2)


def attention_logsumexp(q: torch.Tensor, k: torch.Tensor, *, slopes: Optional[torch.Tensor] = None,
                        distance_bias: Optional[torch.Tensor] = None, window: Optional[int] = None,
                        scale: Optional[float] = None) -> torch.Tensor:
    """``lse_i = log sum_j exp(s_ij)`` over the keys query ``i`` may see, ``(batch, heads, q_len)``.

    ``s_ij = scale q_i . k_j + bias(i - j)``, causal (and within ``window``), as
    :func:`posenc.relative_attention` computes them. Queries go in chunks of
    256 that read only the keys they may see; half precision is summed in
    float32. Differentiable (autograd keeps each chunk's scores for backward).
    """
    slopes, distance_bias, window = _relative_inputs(q, k, k, slopes, distance_bias, window)
    q, scale = _scaled(q, scale)
    if q.dtype in (torch.float16, torch.bfloat16):
        q, k = q.float(), k.float()
    q_len, k_len = q.shape[2], k.shape[2]
    offset, out = k_len - q_len, []
    for a in range(0, q_len, _CHUNK):
        e = min(a + _CHUNK, q_len)
        lo, hi = (max(0, offset + a - window + 1) if window is not None else 0), offset + e
        d = torch.arange(offset + a, offset + e, device=q.device)[:, None] - torch.arange(lo, hi, device=q.device)
        scores = (q[:, :, a:e] @ k[:, :, lo:hi].transpose(-2, -1)) * scale
        scores = scores + _distance_values(d, slopes, distance_bias, window, q.dtype)
        out.append(torch.logsumexp(scores, dim=-1))
    return torch.cat(out, dim=2) if out else q.new_zeros(q.shape[:3])


def sink_logit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink_logits: torch.Tensor, *,
                         slopes: Optional[torch.Tensor] = None, distance_bias: Optional[torch.Tensor] = None,
                         window: Optional[int] = None, scale: Optional[float] = None, return_weights: bool = False):
    """Causal softmax attention with a learned sink logit per head in every row's normaliser (gpt-oss).

    ``w_ij = exp(s_ij) / (exp(a_h) + sum_j' exp(s_ij'))``: the softmax over the
    row extended by one logit ``a_h`` whose value is zero, and that extra
    column dropped. Computed as :func:`posenc.relative_attention` (the fused
    paths) times the share left to the real tokens,
    ``sigmoid(lse_i - a_h)``, with ``lse_i`` from :func:`attention_logsumexp`:
    one more pass over the scores, no ``(heads, n, n)`` tensor.

    Args:
        q, k, v, slopes, distance_bias, window, scale: as in :func:`posenc.relative_attention`.
        sink_logits: ``(heads,)`` finite logits ``a_h``; ``-inf`` would be plain softmax.
        return_weights: also return the ``(batch, heads, q_len, k_len)`` weights (rows sum to less than 1).

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``.

    >>> q = k = v = torch.randn(1, 2, 5, 4)
    >>> out, w = sink_logit_attention(q, k, v, torch.zeros(2), return_weights=True)
    >>> bool((w.sum(-1) < 1).all())
    True
    """
    _check_qkv(q, k, v)
    if not isinstance(sink_logits, torch.Tensor) or sink_logits.shape != (q.shape[1],) or \
            not sink_logits.is_floating_point() or not bool(torch.isfinite(sink_logits).all()):
        raise ValueError(f"sink_logits must be a finite float ({q.shape[1]},) tensor, one logit per head of q "
                         f"{tuple(q.shape)}; got {getattr(sink_logits, 'shape', type(sink_logits).__name__)} "
                         f"{getattr(sink_logits, 'dtype', '')}")
    out = relative_attention(q, k, v, slopes=slopes, distance_bias=distance_bias, window=window, scale=scale,
                             return_weights=return_weights)
    lse = attention_logsumexp(q, k, slopes=slopes, distance_bias=distance_bias, window=window, scale=scale)
    kept = torch.sigmoid(lse - sink_logits.to(lse.device, lse.dtype)[None, :, None])[..., None]  # (b, h, q, 1)
    if return_weights:
        return out[0] * kept.to(out[0].dtype), out[1] * kept.to(out[1].dtype)
    return out * kept.to(out.dtype)


@torch.no_grad()
def attention_on_first_tokens(model: Any, idx: torch.Tensor, first: int = 4, *, from_position: int = 0) -> torch.Tensor:
    """How much attention a model puts on the first ``first`` tokens, per layer and head.

    The mean over sequences and over queries at positions ``>= from_position``
    of the attention weight that lands on keys ``0 .. first-1``. Large values
    in a model trained with full attention are the "attention sinks" of Xiao
    et al. (2024); a query at position ``i`` that spread its attention evenly
    would give them ``first / (i + 1)``.

    Args:
        model: a :class:`posenc.TinyLM` (its window, sinks and scaling apply).
        idx: ``(batch, seq)`` token ids.
        first: ``>= 1`` first keys counted.
        from_position: the first query position averaged over (``0 .. seq-1``).

    Returns:
        ``(n_layers, n_heads)`` float tensor of shares in ``[0, 1]``.

    >>> m = __import__("posenc").TinyLM(5, 16, 2, 2, position="rope")
    >>> attention_on_first_tokens(m, torch.zeros(1, 8, dtype=torch.long), 8).round(decimals=4).tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    """
    first = check_int("first", first)
    if not isinstance(idx, torch.Tensor) or idx.ndim != 2:
        raise ValueError(f"idx must be (batch, seq) token ids, got {getattr(idx, 'shape', type(idx).__name__)}")
    from_position = check_int("from_position", from_position, low=0)
    if from_position >= idx.shape[1]:
        raise ValueError(f"from_position must be an integer in [0, {idx.shape[1] - 1}], got {from_position!r}")
    if "norm" in getattr(model, "attention_kinds", ()):
        raise ValueError("NormAttention layers ('norm') normalise their output, not their weights: their scores are "
                         f"no shares of attention; this model has attention={model.attention_kinds}")
    _, weights = model(idx, return_attention=True)
    shares = torch.stack([w[:, :, from_position:, :first].sum(-1).mean((0, 2)) for w in weights]).float().cpu()
    if not bool(((shares > -1e-4) & (shares < 1 + 1e-4)).all()):  # e.g. a feature map with negative values
        raise ValueError(f"the attention weights of this model are not a distribution over the keys (shares from "
                         f"{shares.min().item():.3g} to {shares.max().item():.3g}); no share of attention to report")
    return shares
