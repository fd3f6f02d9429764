"""ReRoPE and Self-Extend: relative positions capped or grouped beyond a window, at evaluation time.

A RoPE model trained at length ``L`` has never seen a relative position
above ``L``. Instead of new frequencies, these two tricks change *which*
relative position a logit sees, keeping the exact one inside a window ``w``:

* ReRoPE (Su, 2023, "Rectified Rotary Position Embeddings"): ``min(i - j, w)``:
  every distance beyond ``w`` reads as ``w`` (:func:`rerope_positions`);
* Self-Extend (Jin et al., 2024, "LLM Maybe LongLM"): beyond ``w``, positions
  divided by a group size ``G`` (floor), shifted to join the window
  (:func:`self_extend_positions`).

Neither is a rotation of ``q`` and ``k`` by their own positions, so both are
computed in two passes, as published: in-window logits with ordinary RoPE,
out-of-window logits with queries and keys rotated at substitute positions,
merged by the mask before one softmax. The RoPE scheme applies them with
``model.rope_scaling = ("rerope", w)`` or ``("self_extend", G, w)``
(:class:`posenc.RoPE`).

The same two-pass form gives StreamingLLM's attention sinks with positions
*inside the rolling cache* (Xiao et al., 2024): :func:`streaming_attention`.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ._validate import check_bool, check_int
from ._rotation import _rotate
from .masks import _check_qkv, _check_scale
from .rotary import _cos_sin_tables, _freqs

__all__ = ["rerope_positions", "self_extend_positions", "rerope_attention", "self_extend_attention",
           "streaming_attention"]


def _query_key_positions(q_len: int, k_len: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    k_len = q_len if k_len is None else check_int("k_len", k_len)
    q_len = check_int("q_len", q_len)
    if k_len < q_len:
        raise ValueError(f"k_len ({k_len}) must be >= q_len ({q_len}): queries are the last key positions")
    return torch.arange(k_len - q_len, k_len), torch.arange(k_len)


def rerope_positions(q_len: int, window: int, k_len: Optional[int] = None) -> torch.Tensor:
    """The relative positions that ReRoPE's logits see: ``min(i - j, w)`` (Su, 2023).

    Returns:
        ``(q_len, k_len)`` int64; entries of the future (``j > i``) are left
        as ``i - j`` (negative), for the causal mask to remove.

    >>> rerope_positions(5, 2)[-1].tolist()
    [2, 2, 2, 1, 0]
    """
    window = check_int("window", window)
    i, j = _query_key_positions(q_len, k_len)
    return (i[:, None] - j).clamp(max=window)


def self_extend_positions(q_len: int, group: int, window: int, k_len: Optional[int] = None) -> torch.Tensor:
    """The relative positions of Self-Extend (Jin et al., 2024): exact within ``w``, grouped beyond.

    ``i - j`` where ``i - j < w``; else ``floor(i / G) - floor(j / G) + w - floor(w / G)``:
    queries at ``floor(i / G) + w - floor(w / G)`` and keys at ``floor(j / G)``, the
    shift making the grouped positions start near ``w`` where the window ends.

    Returns:
        ``(q_len, k_len)`` int64 (future entries ``i - j``, negative).

    >>> self_extend_positions(8, 2, 2)[-1].tolist()
    [4, 4, 3, 3, 2, 2, 1, 0]
    """
    group = check_int("group", group)
    window = check_int("window", window)
    i, j = _query_key_positions(q_len, k_len)
    exact = i[:, None] - j
    grouped = (i // group)[:, None] - j // group + window - window // group
    return torch.where(exact < window, exact, grouped)


def _rotate_part(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool,
                 rotary_dim: int) -> torch.Tensor:
    """``x`` with its first ``rotary_dim`` channels rotated at ``positions`` (the rest unchanged)."""
    cos, sin = _cos_sin_tables(positions, inv_freq, interleaved, x.dtype, x.device)
    rotated = _rotate(x[..., :rotary_dim], cos, sin, interleaved)
    return rotated if rotary_dim == x.shape[-1] else torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _two_pass(q, k, v, window, q_far, k_far, *, base, interleaved, inv_freq, rotary_dim, scale, mask_window,
              sinks, return_weights, chunk=256):
    """Logits with RoPE at the true positions where ``i - j < window``, at ``q_far``/``k_far`` elsewhere.

    ``q``, ``k``, ``v``: checked by the caller (``_check_qkv``); ``inv_freq``: real and finite, as
    :func:`posenc.apply_rope` takes it (``None``: RoPE's frequencies of ``base``)."""
    dim = q.shape[-1]
    rotary_dim = dim if rotary_dim is None else check_int("rotary_dim", rotary_dim, low=2)
    if rotary_dim > dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and <= head_dim {dim}, got {rotary_dim}")
    inv_freq = _freqs(rotary_dim, base, inv_freq)
    sinks = check_int("sinks", sinks, low=0)
    return_weights = check_bool("return_weights", return_weights)
    q_pos, k_pos = _query_key_positions(q.shape[2], k.shape[2])
    scale = 1.0 / math.sqrt(dim) if scale is None else _check_scale(scale, q.dtype)
    rot = dict(inv_freq=inv_freq, interleaved=check_bool("interleaved", interleaved), rotary_dim=rotary_dim)
    q_near, k_near = _rotate_part(q, q_pos, **rot), _rotate_part(k, k_pos, **rot)
    q_far, k_far = _rotate_part(q, q_far, **rot), _rotate_part(k, k_far, **rot)
    if mask_window is not None:
        mask_window = check_int("mask_window", mask_window)
    q_pos, k_pos = q_pos.to(q.device), k_pos.to(q.device)
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if (not return_weights and scale > 0 and mask_window is None and not wants_grad and _FLASH_WITH_LSE is not None
            and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and q.dtype == k.dtype == v.dtype
            and q.shape[2] == k.shape[2] and v.shape[-1] == q.shape[-1]):
        return _band_and_triangle(q_near, k_near, q_far, k_far, v, window, scale, chunk)
    if not return_weights and scale > 0:  # the fused kernel, two copies of each key
        return torch.cat([_fused_chunk(q_near, k_near, q_far, k_far, v, q_pos, a, min(a + chunk, q.shape[2]), window,
                                       mask_window, sinks, scale) for a in range(0, q.shape[2], chunk)], dim=2)
    outs, weights = [], []
    for a in range(0, q.shape[2], chunk):  # masks and scores of one chunk of queries at a time: O(chunk n)
        e = min(a + chunk, q.shape[2])
        hi = int(q_pos[e - 1]) + 1  # keys after the chunk's last query are all masked
        d = q_pos[a:e, None] - k_pos[:hi]  # (chunk, keys): i - j
        allowed = d >= 0
        if mask_window is not None:
            allowed = allowed & ((d < mask_window) | (k_pos[:hi] < sinks))
        s_near = q_near[:, :, a:e] @ k_near[:, :, :hi].transpose(-2, -1)
        s_far = q_far[:, :, a:e] @ k_far[:, :, :hi].transpose(-2, -1)
        scores = torch.where(d < window, s_near, s_far) * scale
        p = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        outs.append(p @ v[:, :, :hi])
        if return_weights:
            weights.append(torch.nn.functional.pad(p, (0, k.shape[2] - hi)))
    out = torch.cat(outs, dim=2)
    return (out, torch.cat(weights, dim=2)) if return_weights else out


#: PyTorch's CPU flash attention returning the log-sum-exp of each row (its gradient is not defined).
_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _band_and_triangle(q_near, k_near, q_far, k_far, v, window, scale, chunk):
    """Inference on a CPU, exact: the band ``0 <= i - j < w`` (true positions) in chunks of queries, and the
    triangle ``j <= i - w`` (substitute positions) as one causal flash attention over the sequence shifted by
    ``w``, merged by their log-sum-exps. Causal SDPA's work plus a band of ``w`` keys, instead of two copies."""
    n = q_near.shape[2]
    chunk = max(chunk, min(window, 1024))
    outs, lses = [], []
    for a in range(0, n, chunk):
        e, lo = min(a + chunk, n), max(0, a - window + 1)
        d = torch.arange(a, e)[:, None] - torch.arange(lo, e)  # (chunk, keys): i - j
        mask = torch.zeros(d.shape, dtype=q_near.dtype).masked_fill_((d < 0) | (d >= window), float("-inf"))
        out, lse = _FLASH_WITH_LSE(q_near[:, :, a:e], k_near[:, :, lo:e], v[:, :, lo:e], 0.0, False,
                                   attn_mask=mask, scale=scale)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs, dim=2), torch.cat(lses, dim=2)  # every row has its own key: no empty row
    if n <= window:
        return out
    far, far_lse = _FLASH_WITH_LSE(q_far[:, :, window:], k_far[:, :, :n - window], v[:, :, :n - window], 0.0, True,
                                   scale=scale)  # query i against keys j <= i - w
    near_lse = lse[:, :, window:]
    top = torch.maximum(near_lse, far_lse)
    w_near, w_far = (near_lse - top).exp().unsqueeze(-1), (far_lse - top).exp().unsqueeze(-1)
    merged = (w_near * out[:, :, window:] + w_far * far) / (w_near + w_far)
    return torch.cat((out[:, :, :window], merged), dim=2)


def _fused_chunk(q_near, k_near, q_far, k_far, v, q_pos, a, e, window, mask_window, sinks, scale):
    """Queries ``a:e`` through SDPA: ``[q_near, q_far]`` against near copies ``[k_near, 0]`` and far copies
    ``[0, k_far]`` of the keys, a boolean mask picking the copy each query sees (the two passes in one kernel)."""
    first, last = int(q_pos[a]), int(q_pos[e - 1])
    dev = q_near.device
    near = torch.arange(max(0, first - window + 1), last + 1, device=dev)  # keys some query sees exactly
    top = max(0, last - window + 1)  # keys some query sees at a substitute position: 0 .. top-1
    if mask_window is None:
        far = torch.arange(top, device=dev)
    else:  # only sinks and keys inside the mask window can be seen at all
        head = min(sinks, top)
        start = min(max(head, first - mask_window + 1), top)
        far = torch.cat((torch.arange(head, device=dev), torch.arange(start, top, device=dev)))
    keys = torch.cat((near, far))
    d = q_pos[a:e, None] - keys  # (chunk, 2 copies)
    is_far = torch.arange(len(keys), device=dev) >= len(near)
    ok = (d >= 0) & torch.where(is_far, d >= window, d < window)
    if mask_window is not None:
        ok = ok & ((d < mask_window) | (keys < sinks))
    kn, kf = k_near[:, :, near], k_far[:, :, far]
    k2 = torch.cat((torch.cat((kn, torch.zeros_like(kn)), -1), torch.cat((torch.zeros_like(kf), kf), -1)), dim=2)
    q2 = torch.cat((q_near[:, :, a:e], q_far[:, :, a:e]), -1)
    return torch.nn.functional.scaled_dot_product_attention(q2, k2, v[:, :, keys], attn_mask=ok, scale=scale)


def rerope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *, base: float = 10000.0,
                     interleaved: bool = False, inv_freq: Optional[torch.Tensor] = None,
                     rotary_dim: Optional[int] = None, scale: Optional[float] = None,
                     mask_window: Optional[int] = None, sinks: int = 0, return_weights: bool = False):
    """Causal ReRoPE attention (Su, 2023): RoPE logits at relative position ``min(i - j, w)``.

    Two passes, as published: logits ``<R_i q_i, R_j k_j>`` (ordinary RoPE)
    where ``i - j < w``, and ``<R_w q_i, k_j>`` (queries rotated at the fixed
    position ``w``, keys not rotated: relative position ``w``) elsewhere,
    merged by the mask, then a causal softmax. No position beyond ``w`` is ever
    seen, so a model trained at length ``L >= w`` meets no new angle at any
    length; the price is that distances beyond ``w`` are told apart by
    content only.

    Cost: for inference on a CPU (no gradient, no ``mask_window``, as many
    queries as keys) PyTorch's flash attention runs the band ``i - j < w``
    in chunks of queries and the far triangle ``j <= i - w`` in one causal
    call over the sequence shifted by ``w``; the two are merged exactly by
    their log-sum-exps: about 1.4-1.6 times causal SDPA at n = 4096, w = 512
    (``benchmarks/attention.py``). Otherwise (gradients: that log-sum-exp has
    none) each chunk of 256 queries goes through SDPA once, against a near
    copy ``[R_j k_j, 0]`` of the keys in its window and a far copy
    ``[0, k_j]`` of the earlier ones, with queries ``[R_i q_i, R_w q_i]`` and a
    boolean mask picking the copy: memory ``O(256 n)`` per head, about four
    times the work of causal attention. The explicit softmax runs only for
    ``return_weights``.

    Args:
        q, k: ``(batch, heads, seq, head_dim)`` queries and keys **not yet
            rotated** (``q_len <= k_len``: queries are the last key positions).
        v: ``(batch, heads, k_len, v_dim)``.
        window: ``w >= 1``.
        base, interleaved, inv_freq: the RoPE of the model.
        rotary_dim: rotate only the first ``rotary_dim`` channels (partial RoPE).
        scale: multiplier of the logits; default ``1 / sqrt(head_dim)``.
        mask_window, sinks: also restrict each query to its ``mask_window``
            latest keys plus the first ``sinks`` (:func:`posenc.sliding_window_mask`).
        return_weights: also return the ``(batch, heads, q_len, k_len)`` weights.

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``.

    Raises:
        TypeError: for a ``q``, ``k`` or ``v`` that is not a tensor.
        ValueError: for other shapes, dtypes (integer, mixed) or devices (as
            :func:`posenc.attention`); an ``inv_freq`` that is not ``(rotary_dim
            // 2,)`` finite real numbers; flags other than True or False; other
            wrong arguments.
    """
    _check_qkv(q, k, v)
    window = check_int("window", window)
    q_pos, k_pos = _query_key_positions(q.shape[-2], k.shape[-2])
    return _two_pass(q, k, v, window, torch.full_like(q_pos, window), torch.zeros_like(k_pos), base=base,
                     interleaved=interleaved, inv_freq=inv_freq, rotary_dim=rotary_dim, scale=scale,
                     mask_window=mask_window, sinks=sinks, return_weights=return_weights)


def self_extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, window: int, *,
                          base: float = 10000.0, interleaved: bool = False, inv_freq: Optional[torch.Tensor] = None,
                          rotary_dim: Optional[int] = None, scale: Optional[float] = None,
                          mask_window: Optional[int] = None, sinks: int = 0, return_weights: bool = False):
    """Causal Self-Extend attention (Jin et al., 2024, "LLM Maybe LongLM"): grouped positions beyond ``w``.

    Logits see the relative positions of :func:`self_extend_positions`: exact
    neighbour attention for ``i - j < w``; beyond, queries rotated at
    ``floor(i / G) + w - floor(w / G)`` and keys at ``floor(j / G)``. The
    largest relative position at length ``n`` is about ``n / G + w``, so a model
    trained at ``L`` is stretched to about ``G (L - w)``. Two passes merged by
    the mask; arguments and returns as in :func:`rerope_attention`, plus the
    group size ``group`` (``G >= 1``; 1 is plain RoPE).
    """
    _check_qkv(q, k, v)
    group = check_int("group", group)
    window = check_int("window", window)
    q_pos, k_pos = _query_key_positions(q.shape[-2], k.shape[-2])
    return _two_pass(q, k, v, window, q_pos // group + window - window // group, k_pos // group, base=base,
                     interleaved=interleaved, inv_freq=inv_freq, rotary_dim=rotary_dim, scale=scale,
                     mask_window=mask_window, sinks=sinks, return_weights=return_weights)


def streaming_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, sinks: int, *,
                        base: float = 10000.0, interleaved: bool = False, inv_freq: Optional[torch.Tensor] = None,
                        rotary_dim: Optional[int] = None, scale: Optional[float] = None,
                        return_weights: bool = False):
    """StreamingLLM (Xiao et al., 2024) with RoPE positions inside the rolling cache.

    The cache holds the first ``sinks`` tokens and the ``window`` latest ones,
    and positions are given within it: sinks at ``0 .. sinks-1``, then the
    window, so the query sits at ``min(i, sinks + window - 1)``. Distances to the
    window keys are the true ``i - j``; distances to the sinks become
    ``min(i, sinks + window - 1) - j``, never more than the cache size: no
    query sees a relative position it did not see in training when
    ``sinks + window <= L``. Computed in two passes (window keys with ordinary
    RoPE, sink keys with the query rotated at its cache position), for the whole
    sequence at once; equal to decoding token by token with the rolling cache.
    :func:`posenc.sink_attention` keeps the original positions instead.

    Args:
        q, k: ``(batch, heads, seq, head_dim)`` **not yet rotated**; v: ``(batch, heads, k_len, v_dim)``.
        window, sinks: ``>= 1`` and ``>= 0``.
        base, interleaved, inv_freq, rotary_dim, scale, return_weights: as in :func:`rerope_attention`.

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``. Raises as
        :func:`rerope_attention`.
    """
    _check_qkv(q, k, v)
    window = check_int("window", window)
    sinks = check_int("sinks", sinks, low=0)
    q_pos, k_pos = _query_key_positions(q.shape[-2], k.shape[-2])
    return _two_pass(q, k, v, window, q_pos.clamp(max=sinks + window - 1), k_pos, base=base,
                     interleaved=interleaved, inv_freq=inv_freq, rotary_dim=rotary_dim, scale=scale,
                     mask_window=window, sinks=sinks, return_weights=return_weights)
