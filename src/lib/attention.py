"""Softmax attention with position biases and masks, on top of PyTorch's SDPA.

.. math::
    \\mathrm{Attention}(Q, K, V) = \\mathrm{softmax}\\Big(\\frac{QK^\\top}{\\sqrt{d}} + B
    + M\\Big) V,

where :math:`B` is an additive position bias (ALiBi, KERPLE, T5, ...) that is
*not* scaled, and :math:`M` is 0 where attending is allowed and
:math:`-\\infty` elsewhere.

Every call goes through :func:`torch.nn.functional.scaled_dot_product_attention`
(flash / memory-efficient kernels where the inputs allow), except when the
attention weights are asked for, which needs the explicit softmax.

:func:`attention` takes a bias as a tensor, so it has to be stored: ``heads * n^2``
numbers. Causal biases that depend only on the distance ``i - j`` (ALiBi,
KERPLE, Sandwich, the T5 bias, a sliding window) need far less, and
:func:`relative_attention` takes them as ``(heads,)`` slopes or a
``(heads, n)`` table of values per distance, then picks the fastest exact
path: ALiBi as a bias per key that the fused causal CPU kernel adds itself, or
folded into one extra channel of ``q`` and ``k`` (the fused causal kernel runs
unchanged; :mod:`posenc._fused_alibi`), query chunks reading the bias through
a Toeplitz view of the table (no ``n x n`` tensor), or FlexAttention with the
bias as a ``score_mod`` on CUDA.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal, Optional, Tuple, Union, overload

import torch
import torch.nn.functional as F

from ._validate import at_least_float32, check_bool, check_float_dtype as _float_dtype, check_int, check_layout
from ._validate import make_module_callable, one_of
from ._flex import _FLEX, _flex_available, _path_flex
from ._fused_alibi import _path_fold, _path_key_bias, key_bias_available
from .autotune import choose_fastest, length_bucket
from .entropy import attention_entropy, log_length_scale  # here too: they were first defined in this module
from .masks import _as_tensor, _check_qkv, _check_scale, _finite, _layout_hint, causal_mask

__all__ = ["attention", "combine_bias_and_mask", "relative_attention", "ATTENTION_PATHS", "attention_entropy",
           "log_length_scale"]


def _bhsd(q: Any, k: Any, v: Any) -> Tuple[torch.Tensor, ...]:
    """``q``, ``k``, ``v`` of ``layout="bshd"``, ``(batch, seq, heads, head_dim)``, viewed in the library's order."""
    if not all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in (q, k, v)):
        raise ValueError("layout='bshd' expects q, k, v of shape (batch, seq, heads, head_dim), got "
                         f"{', '.join(str(tuple(getattr(t, 'shape', ()))) for t in (q, k, v))}")
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _check_trailing(name: str, t: Any, q: torch.Tensor, k_len: int, floating: bool) -> torch.Tensor:
    """``t`` (bias or mask) as a tensor broadcasting to ``(batch, heads, q_len, k_len)``, on ``q``'s device."""
    if floating and isinstance(t, torch.Tensor) and t.dtype == torch.bool:
        raise ValueError(f"{name} must hold additive float logits, got {t.dtype} (a boolean tensor is a mask=)")
    if not isinstance(t, torch.Tensor) or not floating and t.dtype != torch.bool or t.is_complex():
        t = _as_tensor(name, t, mask=not floating)  # NumPy, lists; raises for the wrong dtype
    (b, heads, q_len), want = q.shape[:3], (*q.shape[:3], k_len)
    if t.ndim < 2 or tuple(t.shape[-2:]) != (q_len, k_len):
        raise ValueError(f"{name} must end in (q_len, k_len) = ({q_len}, {k_len}); got {tuple(t.shape)}"
                         + (_layout_hint(q, t.shape[-2], 1) if t.ndim >= 2 else ""))
    if t.ndim >= 3 and t.shape[-3] not in (1, heads):
        raise ValueError(f"{name} has {t.shape[-3]} heads, expected 1 or {heads}; shape {tuple(t.shape)}"
                         + _layout_hint(q, t.shape[-3]))
    if t.ndim > 4 or t.ndim == 4 and t.shape[0] not in (1, b):
        raise ValueError(f"{name} {tuple(t.shape)} does not broadcast to (batch, heads, q_len, k_len) = {want}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q on {q.device}")
    return t


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over keys; a row with no allowed key (all ``-inf``) gets weights 0, with a zero gradient."""
    dead = scores.amax(-1, keepdim=True) == float("-inf")
    return scores.masked_fill(dead, 0.0).softmax(-1).masked_fill(dead, 0.0)


def _scaled(q: torch.Tensor, scale: Any) -> Tuple[torch.Tensor, float]:
    """``(q, scale)`` with ``scale > 0``, the same logits: SDPA's causal kernel gives NaN for ``scale <= 0``."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _check_scale(scale, q.dtype)
    return (q, scale) if scale > 0 else (-q, -scale) if scale < 0 else (q * 0.0, 1.0)


def _empty(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weights: bool):
    """The output (and weights) when there is no query: batch, heads or q_len is 0."""
    out = v.new_zeros(*q.shape[:3], v.shape[-1])
    return (out, q.new_zeros(*q.shape[:3], k.shape[2])) if weights else out


def combine_bias_and_mask(bias: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                          dtype: torch.dtype) -> Optional[torch.Tensor]:
    """One SDPA ``attn_mask``: boolean if there is no bias, else additive float.

    Returns:
        ``None``, the boolean mask, or ``bias`` with ``-inf`` where ``mask`` is False.
    """
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool):
        raise ValueError(f"mask must be a boolean tensor (True = may attend), got {getattr(mask, 'dtype', type(mask))}")
    if bias is None:
        return mask
    if not isinstance(bias, torch.Tensor) or bias.dtype == torch.bool or bias.is_complex():
        raise ValueError(f"bias must be a tensor of additive logits, got {getattr(bias, 'dtype', type(bias))}")
    bias = bias.to(_float_dtype(dtype))
    if mask is None:
        return bias
    if not all(x == y or 1 in (x, y) for x, y in zip(reversed(bias.shape), reversed(mask.shape))):
        raise ValueError(f"bias {tuple(bias.shape)} and mask {tuple(mask.shape)} do not broadcast")
    if bias.device != mask.device:
        raise ValueError(f"bias is on {bias.device} but mask on {mask.device}")
    return torch.where(mask, bias, float("-inf"))


# For type checkers (and the API reference): a Tensor, or (output, weights) with return_weights=True
@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[torch.Tensor] = ...,
              mask: Optional[torch.Tensor] = ..., causal: bool = ..., scale: Optional[float] = ...,
              return_weights: Literal[False] = ..., layout: str = ...) -> torch.Tensor: ...
@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[torch.Tensor] = ...,
              mask: Optional[torch.Tensor] = ..., causal: bool = ..., scale: Optional[float] = ...,
              return_weights: Literal[True], layout: str = ...) -> Tuple[torch.Tensor, torch.Tensor]: ...
@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[torch.Tensor] = ...,
              mask: Optional[torch.Tensor] = ..., causal: bool = ..., scale: Optional[float] = ...,
              return_weights: bool = ..., layout: str = ...
              ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
              mask: Optional[torch.Tensor] = None, causal: bool = True, scale: Optional[float] = None,
              return_weights: bool = False, layout: str = "bhsd",
              ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled dot-product attention with an optional position bias and mask.

    Args:
        q: ``(batch, heads, q_len, head_dim)``.
        k: ``(batch, heads, k_len, head_dim)`` with ``k_len >= q_len``.
        v: ``(batch, heads, k_len, v_dim)``.
        bias: additive logits ``(heads, q_len, k_len)``, or broadcastable to
            ``(batch, heads, q_len, k_len)``; added after the ``scale``.
        mask: boolean, broadcastable to ``(batch, heads, q_len, k_len)``,
            True = may attend.
        causal: also forbid keys after the query (bottom-right aligned when
            ``k_len > q_len``).
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        return_weights: also return the ``(batch, heads, q_len, k_len)``
            attention probabilities (computed explicitly; slower).
        layout: ``"bhsd"`` (the shapes above) or ``"bshd"``: ``q``, ``k``,
            ``v`` and the output are ``(batch, seq, heads, head_dim)``; bias,
            mask and weights keep their ``(heads, q_len, k_len)`` order. The
            layout cannot be read off the shapes: a ``(batch, seq, heads,
            head_dim)`` tensor passed as ``"bhsd"`` without a bias attends
            across heads instead of positions, without an error.

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``.

    A query allowed no key (a mask row without True, or a bias row of ``-inf``)
    gets a zero output row and zero weights, with or without ``return_weights``.

    NaN in the inputs is not checked (a pass over every input on every call of
    a training step): the explicit paths return NaN rows, but PyTorch's fused
    CPU kernel, used without ``bias``, ``mask`` and ``return_weights``, returns a
    query row holding NaN as zeros. Check with ``torch.isfinite`` where it can
    happen; a model's NaN is caught where its loss or weights become NaN
    (:func:`posenc.train`).

    Raises:
        TypeError: for a ``q``, ``k`` or ``v`` that is not a tensor.
        ValueError: for other shapes, dtypes (integer, mixed) or devices than
            described above, flags other than True or False, or a ``scale``
            that is not finite or that ``q``'s dtype cannot hold (e.g. ``1e-300``
            or ``1e300`` for float32: it would give NaN).
    """
    if check_layout(layout) == "bshd":  # to the library's order and back
        out = attention(*_bhsd(q, k, v), bias=bias, mask=mask, causal=causal, scale=scale,
                        return_weights=return_weights)
        return (out[0].transpose(1, 2), out[1]) if isinstance(out, tuple) else out.transpose(1, 2)
    _check_qkv(q, k, v)
    q_len, k_len = q.shape[2], k.shape[2]
    causal, return_weights = check_bool("causal", causal), check_bool("return_weights", return_weights)
    if bias is not None:
        bias = _check_trailing("bias", bias, q, k_len, True)
    if mask is not None:
        mask = _check_trailing("mask", mask, q, k_len, False)
    q, scale = _scaled(q, scale)
    if q.numel() == 0:  # no query (head_dim is >= 1)
        return _empty(q, k, v, return_weights)

    if causal:
        if bias is None and mask is None and q_len == k_len and not return_weights:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        allowed = causal_mask(q_len, k_len, device=q.device)
        mask = allowed if mask is None else mask & allowed

    bias = None if bias is None else bias.to(q.dtype)  # as combine_bias_and_mask, on inputs checked above
    attn_mask = bias if mask is None else mask if bias is None else torch.where(mask, bias, float("-inf"))
    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    scores = (q @ k.transpose(-2, -1)) * scale  # (b, h, q, k)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = _softmax(scores)
    return weights @ v, weights


# ---------------------------------------------------------------------------
# Relative (distance-only) causal biases without an n x n tensor
# ---------------------------------------------------------------------------

#: The implementations :func:`relative_attention` can use (``path=``).
ATTENTION_PATHS = ("auto", "key_bias", "fold", "chunked", "flex", "bias", "naive")

#: Query rows per call of the chunked path.
_CHUNK = 256

# Where the fixed rule of "auto" switches paths on the CPU, from forward and forward+backward timings
# against SDPA (head_dim 16 and 64, 32 ... 8192 queries): a stored bias is cheapest up to 128 queries;
# from there on ALiBi's mask per key where the kernel takes it, else the chunked view, and ALiBi's fold
# (its 65th channel runs the fused kernel ~10% slower) only on long sequences with wide heads.
_STORE_MAX = 128
# The stored bias is timed against the others up to this many numbers (batch * heads * q_len * k_len).
_STORE_TIMED = 1 << 26
_FOLD_MIN_LEN = 4096
_FOLD_MIN_DIM = 64


def _relative_inputs(q, k, v, slopes, distance_bias, window):
    """Validate the arguments of :func:`relative_attention`; tensors on q's device, float."""
    _check_qkv(q, k, v)
    heads, k_len = q.shape[1], k.shape[2]
    if slopes is not None:
        slopes = _as_tensor("slopes", slopes, q.device)
        if slopes.ndim != 1 or slopes.shape[0] != heads:
            raise ValueError(f"slopes must be ({heads},), one per head of q {tuple(q.shape)}; got shape "
                             f"{tuple(slopes.shape)}" + _layout_hint(q, slopes.shape[0] if slopes.ndim else -1))
        _finite("slopes", slopes)
    if distance_bias is not None:
        distance_bias = _as_tensor("distance_bias", distance_bias)
        if distance_bias.ndim != 2 or distance_bias.shape[0] != heads:
            raise ValueError(f"distance_bias must be a float (heads={heads}, n) tensor of values per distance; "
                             f"got {tuple(distance_bias.shape)}"
                             + _layout_hint(q, distance_bias.shape[0] if distance_bias.ndim else -1))
        if distance_bias.shape[1] < k_len:
            raise ValueError(f"distance_bias covers distances 0..{distance_bias.shape[1] - 1} but "
                             f"k_len = {k_len} needs 0..{k_len - 1}")
        distance_bias = distance_bias[:, :k_len].to(q.device)
        if distance_bias.is_cpu and bool((distance_bias.isnan() | (distance_bias == math.inf)).any()):
            raise ValueError("distance_bias must hold finite values, or -inf to mask a distance; got NaN or +inf")
    return slopes, distance_bias, None if window is None else check_int("window", window)


def _distance_values(d, slopes, distance_bias, window, dtype):
    """Bias at integer distances ``d`` (any shape) per head: ``(heads, *d.shape)``, -inf where not allowed.

    Computed in float32 for half precision (cast at the end): float16 holds no distance above 65504, and
    bfloat16 rounds distances above 256.
    """
    heads = slopes.shape[0] if slopes is not None else distance_bias.shape[0] if distance_bias is not None else 1
    shape = (heads,) + (1,) * d.ndim
    allowed = d >= 0
    if window is not None:
        allowed = allowed & (d < window)
    work = at_least_float32(dtype)
    out = torch.zeros(shape, dtype=work, device=d.device).expand(heads, *d.shape)
    if slopes is not None:
        out = out - slopes.to(work).view(shape) * d.clamp(min=0).to(work)
    if distance_bias is not None:
        out = out + distance_bias.to(work)[:, d.clamp(min=0, max=distance_bias.shape[1] - 1)]
    return out.masked_fill(~allowed, float("-inf")).to(dtype)


def _path_naive(q, k, v, scale, slopes, distance_bias, window):
    """Explicit scores, bias and softmax: the reference, and the only path returning weights."""
    q_len, k_len = q.shape[2], k.shape[2]
    d = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len) - torch.arange(k_len, device=q.device)
    scores = (q @ k.transpose(-2, -1)) * scale + _distance_values(d, slopes, distance_bias, window, q.dtype)
    weights = _softmax(scores)  # (batch, heads, q_len, k_len)
    return weights @ v, weights


def _path_bias(q, k, v, scale, slopes, distance_bias, window):
    """The bias stored as one ``(1, heads, q_len, k_len)`` float mask, through SDPA."""
    q_len, k_len = q.shape[2], k.shape[2]
    d = torch.arange(q_len, device=q.device)[:, None] + (k_len - q_len) - torch.arange(k_len, device=q.device)
    if slopes is None and distance_bias is None:  # a window alone: a boolean mask is enough
        allowed = (d >= 0) & (d < window) if window is not None else d >= 0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    bias = _distance_values(d, slopes, distance_bias, window, q.dtype)[None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _path_chunked(q, k, v, scale, slopes, distance_bias, window, chunk=_CHUNK):
    """Query chunks; each reads its bias as a strided (Toeplitz) view of one ``(heads, q+k)`` row.

    With the keys in reverse order, ``j' = k_len - 1 - j``, the distance of
    query ``i`` to key ``j'`` is ``i + j' - (q_len - 1)``: constant along
    anti-diagonals, so the ``(chunk, keys)`` bias block is a view of the row
    ``g[p] = bias(p - (q_len - 1))`` with strides ``(1, 1)``. Nothing of size
    ``n^2`` is stored, and each chunk only visits the keys it may see (causal
    and window), so the work is that of causal attention.
    """
    h, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    p = torch.arange(q_len + k_len - 1, device=q.device) - (q_len - 1)
    g = _distance_values(p, slopes, distance_bias, window, q.dtype)
    g = g.expand(h, -1).contiguous()  # (heads, q_len + k_len - 1)
    if torch.is_grad_enabled() and g.requires_grad:  # a learned bias: PyTorch's fused kernels give no
        return _ChunkedBiasAttention.apply(q, k, v, g, scale, window, chunk)  # gradient for it
    return _chunked_forward(q, k, v, g, scale, window, chunk)


def _chunks(q_len: int, k_len: int, window: Optional[int], chunk: int):
    """``(a, e, first, last)``: queries ``a:e`` see the reversed keys ``first:last``."""
    offset = k_len - q_len
    for a in range(0, q_len, chunk):
        e = min(a + chunk, q_len)
        hi = offset + e  # keys 0 .. hi-1 are at or before the last query of the chunk
        lo = max(0, offset + a - window + 1) if window is not None else 0
        yield a, e, k_len - hi, k_len - lo


def _bias_block(g: torch.Tensor, a: int, e: int, first: int, last: int) -> torch.Tensor:
    """``(1, heads, e - a, last - first)`` view of the row ``g``: bias of queries ``a:e``, reversed keys ``first:last``."""
    return g.as_strided((1, g.shape[0], e - a, last - first), (0, g.stride(0), 1, 1), g.storage_offset() + a + first)


def _chunked_forward(q, k, v, g, scale, window, chunk):
    k_rev, v_rev = k.flip(2), v.flip(2)
    outs = [F.scaled_dot_product_attention(q[:, :, a:e], k_rev[:, :, first:last], v_rev[:, :, first:last],
                                           attn_mask=_bias_block(g, a, e, first, last), scale=scale)
            for a, e, first, last in _chunks(q.shape[2], k.shape[2], window, chunk)]
    return torch.cat(outs, dim=2)


class _ChunkedBiasAttention(torch.autograd.Function):
    """The chunked path with a gradient for the bias row ``g``, in ``O(heads * chunk * n)`` memory.

    Forward: the fused kernel per chunk, as without gradients. Backward, per
    chunk, from the saved inputs and output (as FlashAttention does): the
    weights ``P`` again, ``dS = P * (dP - rowsum(dO * O))``, and the gradient
    of ``g[p]`` is the sum of ``dS`` over the anti-diagonal ``i + j' = p``.
    """

    @staticmethod
    def forward(ctx, q, k, v, g, scale, window, chunk):
        # detached: PyTorch's CPU kernel selection refuses its fused kernel for a mask that requires
        # grad (even under no_grad) and would run the unfused math path
        out = _chunked_forward(q.detach(), k.detach(), v.detach(), g.detach(), scale, window, chunk)
        ctx.save_for_backward(q, k, v, g, out)
        ctx.scale, ctx.window = scale, window
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, g, out = ctx.saved_tensors
        return (*_chunked_backward(q, k, v, g, out, d_out, ctx.scale, ctx.window), None, None, None)


#: Numbers in one score block of the chunked backward (batch * heads * rows * keys): a chunk has as
#: many queries (16 to 256) as make a block of about this size. Measured here (8 heads, head_dim 64,
#: forward+backward with a learned table, both CPU kernel sets, 4096 and 8192 keys): blocks of 2^20
#: numbers 1.2-1.4x slower than 2^22 (more, smaller matrix products); 2^22 to 2^24 within the spread.
_BACKWARD_BLOCK = 1 << 22


def _chunked_backward(q, k, v, g, out, d_out, scale, window):
    """Gradients of the chunked path: ``(dq, dk, dv, dg)``, one pass over query chunks (as FlashAttention's backward).

    Per chunk: the weights ``P`` again from ``q k^T`` and the bias view,
    ``dS = P * (dO v^T - rowsum(dO * O))``, then ``dq = dS k``, ``dk += dS^T q``,
    ``dv += P^T dO``; ``g[p]`` gets the sum of ``dS`` over the anti-diagonal
    ``i + j' = p`` (a strided view of the block, rows shifted by their index,
    summed over rows). Sums over chunks are kept in float32 at least.
    """
    b, h, q_len, k_len = *q.shape[:3], k.shape[2]
    k_rev, v_rev = k.flip(2), v.flip(2)
    acc = torch.promote_types(q.dtype, torch.float32)  # bfloat16 would round at every addition
    dq = torch.empty_like(q)
    dk_rev, dv_rev, dg = (torch.zeros_like(t, dtype=acc) for t in (k, v, g))
    delta = (d_out * out).sum(-1, keepdim=True)  # (b, h, q_len, 1): rowsum(dO * O)
    # every query sees its own key (distance 0, g[:, q_len - 1]): no row is empty unless that bias is -inf
    live = bool(torch.isfinite(g[:, q_len - 1]).all())
    keys = min(k_len, window) if window is not None else k_len
    rows = max(16, min(_CHUNK, _BACKWARD_BLOCK // max(1, b * h * keys)))
    # the chunks' large intermediates in buffers made once (a new buffer per chunk costs page faults):
    # scores, then dS in their place; the weights; the anti-diagonal sums' shifted copies
    blocks = q.new_empty(2, b * h * rows * min(k_len, keys + rows))
    workspace = q.new_empty(h * rows * (k_len + rows), dtype=acc)
    q_scaled = q * scale  # the logits' scale applied once to q (n x dim numbers) rather than to every block
    for a, e, first, last in _chunks(q_len, k_len, window, rows):
        n_rows, n_keys = e - a, last - first
        qc, kc, vc, do = q_scaled[:, :, a:e], k_rev[:, :, first:last], v_rev[:, :, first:last], d_out[:, :, a:e]
        size = b * h * n_rows * n_keys
        s = torch.matmul(qc, kc.transpose(-2, -1), out=blocks[0, :size].view(b, h, n_rows, n_keys))
        s.add_(_bias_block(g, a, e, first, last))
        p = torch.softmax(s, -1, out=blocks[1, :size].view_as(s)) if live else _softmax(s)  # (b, h, rows, keys)
        dv_rev[:, :, first:last] += (p.transpose(-2, -1) @ do).to(acc)
        ds = torch.matmul(do, vc.transpose(-2, -1), out=s).sub_(delta[:, :, a:e]).mul_(p)  # dS where S was
        dq[:, :, a:e] = (ds @ kc).mul_(scale)
        dk_rev[:, :, first:last] += (ds.transpose(-2, -1) @ qc).to(acc)
        # anti-diagonal sums: row r shifted right by r in a (heads, rows, keys + rows) buffer, summed over rows
        width = n_keys + n_rows
        shifted = workspace[:h * n_rows * width].view(h, n_rows, width)
        shifted[:, :, :n_rows] = 0
        shifted[:, :, n_rows:] = ds[0] if b == 1 else ds.sum(0, dtype=acc)
        dg[:, a + first: a + first + width - 1] += shifted.as_strided(
            (h, n_rows, width - 1), (n_rows * width, width - 1, 1), n_rows).sum(1)
    return dq, dk_rev.flip(2).to(k.dtype), dv_rev.flip(2).to(v.dtype), dg.to(g.dtype)


def _timed_path(q, k, v, scale, slopes, distance_bias, window) -> str:
    """"auto": the fastest exact path for this shape class, timed on its first call (posenc.autotune).

    Timed where the choice depends on the machine: on a CPU beyond ``_STORE_MAX``
    queries, between the chunked view, the stored bias (while it is at most
    ``_STORE_TIMED`` numbers) and, for ALiBi, its bias per key and its fold.
    ``_pick_path`` is the fixed rule (``POSENC_AUTOTUNE=0``). Timing runs on
    copies, so no gradient reaches the inputs.
    """
    rule = _pick_path(q, k, slopes, distance_bias, window)
    q_len, k_len = q.shape[2], k.shape[2]
    if rule == "flex" or q_len <= _STORE_MAX:
        return rule
    inputs = [q, k, v, slopes, distance_bias]
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    paths = {"chunked": lambda q, k, v, s, b: _path_chunked(q, k, v, scale, s, b, window)}
    if q.shape[0] * q.shape[1] * q_len * k_len <= _STORE_TIMED:
        paths["bias"] = lambda q, k, v, s, b: _path_bias(q, k, v, scale, s, b, window)
    alibi_only = _alibi_only(q, k, slopes, distance_bias, window)
    if alibi_only and q.dtype in (torch.float32, torch.float64):
        paths["fold"] = lambda q, k, v, s, b: _path_fold(q, k, v, scale, s)
    key_bias = alibi_only and _key_bias_applies(q, slopes)
    if key_bias:
        paths["key_bias"] = lambda q, k, v, s, b: _path_key_bias(q, k, v, scale, s)

    def timed(path):
        def run():
            copies = [None if t is None else t.detach().requires_grad_(grad and t.requires_grad) for t in inputs]
            with torch.set_grad_enabled(grad):
                out = path(*copies)
                if grad:
                    out.sum().backward()
        return run

    key = ("relative_attention", q.device.type, q.device.index, q.dtype, q.shape[-1], length_bucket(q_len),
           q_len == k_len, slopes is not None, distance_bias is not None, window is not None, key_bias, grad)
    return choose_fastest(key, {name: timed(path) for name, path in paths.items()}, fallback=rule if rule in paths
                  else "chunked", device=q.device)


def _alibi_only(q, k, slopes, distance_bias, window) -> bool:
    """Slopes and nothing else, every query seeing every earlier key: where ALiBi's two fused-kernel paths apply."""
    return slopes is not None and distance_bias is None and window is None and q.shape[2] == k.shape[2]


def _key_bias_applies(q, slopes) -> bool:
    """The CPU flash kernel can add ALiBi's bias per key: a CPU tensor, slopes without a gradient to give."""
    return (q.device.type == "cpu" and not (slopes.requires_grad and torch.is_grad_enabled())
            and key_bias_available())


def _pick_path(q, k, slopes, distance_bias, window) -> str:
    q_len = q.shape[2]
    if q.device.type == "cuda" and _flex_available(q.device) and not _FLEX.get("broken"):
        return "flex"
    if q_len <= _STORE_MAX:
        return "bias"  # the (heads, q, k) bias is small; the other paths' extra work would cost more
    if _alibi_only(q, k, slopes, distance_bias, window) and q.dtype in (torch.float32, torch.float64):
        if _key_bias_applies(q, slopes):
            return "key_bias"
        if q_len >= _FOLD_MIN_LEN and q.shape[-1] >= _FOLD_MIN_DIM:
            return "fold"
    return "chunked"


@overload
def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, slopes: Optional[torch.Tensor] = ...,
                       distance_bias: Optional[torch.Tensor] = ..., window: Optional[int] = ...,
                       scale: Optional[float] = ..., path: str = ..., layout: str = ...,
                       return_weights: Literal[False] = ...) -> torch.Tensor: ...
@overload
def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, slopes: Optional[torch.Tensor] = ...,
                       distance_bias: Optional[torch.Tensor] = ..., window: Optional[int] = ...,
                       scale: Optional[float] = ..., path: str = ..., layout: str = ...,
                       return_weights: Literal[True]) -> Tuple[torch.Tensor, torch.Tensor]: ...
@overload
def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, slopes: Optional[torch.Tensor] = ...,
                       distance_bias: Optional[torch.Tensor] = ..., window: Optional[int] = ...,
                       scale: Optional[float] = ..., path: str = ..., layout: str = ...,
                       return_weights: bool = ...) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...
def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, slopes: Optional[torch.Tensor] = None,
                       distance_bias: Optional[torch.Tensor] = None, window: Optional[int] = None,
                       scale: Optional[float] = None, path: str = "auto", return_weights: bool = False,
                       layout: str = "bhsd") -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Causal attention with a bias that depends only on the distance ``i - j``.

    .. math::
        \\mathrm{logit}_{h,ij} = \\text{scale}\\; q_i^\\top k_j - m_h (i - j) + b_h(i - j),
        \\qquad 0 \\le i - j < w,

    with ALiBi slopes ``m`` (Press et al., 2022), a table ``b`` of values per
    distance (KERPLE, Sandwich, T5, ...) and a sliding window ``w``; every part
    is optional. Because the bias is given per distance, it is never stored as
    a ``(heads, q_len, k_len)`` tensor unless ``path="bias"`` or ``"naive"``.

    Paths (all equal to the ``"naive"`` reference, see the tests):

    * ``"key_bias"``: ALiBi only (slopes, no table, no window, ``q_len ==
      k_len``), on a CPU. Softmax ignores a constant per query, so ``-m (i - j)``
      may be replaced by ``+m j``, a bias of the key alone: a ``(1, heads, 1,
      n)`` mask that PyTorch's flash kernel for the CPU broadcasts over the
      queries and adds to its causal scores, in the same call. No channel, no
      chunk, no ``n x n`` tensor. Exact in real arithmetic; float32 rounding of
      the larger logits gives errors of about ``max(m) n 2^-25`` (1e-4 at ``n =
      4096``, ``m = 1/2``); half precision runs in float32. Not for learned
      slopes (the kernel gives no gradient for its mask: use ``"fold"``).
    * ``"fold"``: ALiBi only, the same ``+m j`` as one extra channel of ``q``
      (1) and ``k`` (``m j / scale``): any fused causal kernel runs it, at
      ``head_dim + 1`` channels. The same rounding; half precision in float32.
    * ``"chunked"``: 256 queries per call, each chunk's bias a strided view of
      one row of ``heads * (q_len + k_len)`` numbers, keys limited to those
      the chunk may see (causal, window). Exact; any bias.
    * ``"flex"``: :func:`torch.nn.attention.flex_attention` with the bias as a
      ``score_mod`` and causal / window as a block mask, compiled on CUDA
      (eager, slow, on CPU: for tests; no backward there).
    * ``"bias"``: the bias built in full and passed to SDPA as a float mask.
    * ``"naive"``: explicit scores and softmax (also returns the weights).

    ``"auto"`` picks ``"flex"`` on CUDA when available, else ``"bias"`` for up
    to 128 queries; beyond, it times the exact paths that apply on the first
    call of each shape class and keeps the fastest (:mod:`posenc.autotune`;
    ``POSENC_AUTOTUNE=0`` turns timing off). The fixed rule it falls back on:
    for ALiBi in float32 or float64, ``"key_bias"`` where it applies, else
    ``"fold"`` for 4096 queries or more with ``head_dim >= 64``; ``"chunked"``
    otherwise.

    Args:
        q: ``(batch, heads, q_len, head_dim)``; the queries are the last
            ``q_len`` key positions.
        k, v: ``(batch, heads, k_len, head_dim)`` and ``(..., k_len, v_dim)``.
        slopes: ``(heads,)`` ALiBi slopes, e.g. :func:`posenc.alibi_slopes`.
        distance_bias: ``(heads, n)`` with ``n >= k_len``: the value added at
            distance ``0 .. n-1`` (differentiable: learned biases train through it);
            ``-inf`` forbids a distance.
        window: each query sees its ``window`` most recent keys (itself included).
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        path: one of :data:`ATTENTION_PATHS`.
        return_weights: also return the ``(batch, heads, q_len, k_len)``
            weights (uses ``"naive"``).
        layout: ``"bhsd"`` (the shapes above) or ``"bshd"``: ``q``, ``k``,
            ``v`` and the output are ``(batch, seq, heads, head_dim)``, as in
            :func:`attention` (the layout cannot be read off the shapes).

    Returns:
        ``(batch, heads, q_len, v_dim)``, or ``(output, weights)``. A query
        allowed no key (``-inf`` table entries) gets a zero row, on every path.

    Raises:
        TypeError: for a ``q``, ``k`` or ``v`` that is not a tensor.
        ValueError: for other shapes, dtypes (integer, mixed) or devices; slopes
            or a table whose head count is not ``q``'s; NaN or infinite slopes
            (checked on the CPU); a ``scale`` as in :func:`attention`; a path that
            cannot take the inputs.

    >>> import posenc as pe
    >>> q = k = v = torch.randn(1, 8, 1024, 64)
    >>> fast = pe.relative_attention(q, k, v, slopes=pe.alibi_slopes(8))    # fused kernel, no bias tensor
    >>> slow = pe.attention(q, k, v, bias=pe.alibi_bias(8, 1024))            # an (8, 1024, 1024) bias
    >>> bool((fast - slow).abs().max() < 1e-4)
    True
    """
    if check_layout(layout) == "bshd":  # to the library's order and back
        out = relative_attention(*_bhsd(q, k, v), slopes=slopes, distance_bias=distance_bias, window=window,
                                 scale=scale, path=path, return_weights=return_weights)
        return (out[0].transpose(1, 2), out[1]) if isinstance(out, tuple) else out.transpose(1, 2)
    slopes, distance_bias, window = _relative_inputs(q, k, v, slopes, distance_bias, window)
    path = one_of("path", path, ATTENTION_PATHS)
    q, scale = _scaled(q, scale)
    if check_bool("return_weights", return_weights) and path not in ("auto", "naive"):
        raise ValueError(f"return_weights needs the explicit path 'naive', not {path!r}")
    if path in ("fold", "key_bias") and not _alibi_only(q, k, slopes, distance_bias, window):
        raise ValueError(f"path={path!r} takes ALiBi slopes only (no distance_bias, no window) and q_len == k_len")
    if path == "key_bias" and not _key_bias_applies(q, slopes):
        raise ValueError("path='key_bias' needs a CPU tensor, slopes that need no gradient (learned slopes: "
                         "path='fold') and a torch whose CPU flash kernel takes a causal flag and a mask together"
                         + ("" if key_bias_available() else " (this one does not)"))
    if q.numel() == 0:  # no query (head_dim is >= 1)
        return _empty(q, k, v, return_weights)
    if return_weights:
        return _path_naive(q, k, v, scale, slopes, distance_bias, window)
    if slopes is None and distance_bias is None and window is None and q.shape[2] == k.shape[2] \
            and path in ("auto", "fold", "key_bias"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if path == "auto":
        path = _timed_path(q, k, v, scale, slopes, distance_bias, window)
    if path == "key_bias":
        return _path_key_bias(q, k, v, scale, slopes)
    if path == "fold":
        return _path_fold(q, k, v, scale, slopes)
    if path == "chunked":
        return _path_chunked(q, k, v, scale, slopes, distance_bias, window)
    if path == "flex":
        if not _flex_available(q.device):
            raise ValueError("path='flex' needs torch.nn.attention.flex_attention (torch >= 2.5; triton on CUDA)")
        if q.device.type == "cuda" and not _FLEX.get("broken"):
            try:
                return _path_flex(q, k, v, scale, slopes, distance_bias, window)
            except Exception as err:  # a compiler problem must not stop a notebook: fall back, once loudly
                _FLEX["broken"] = True
                warnings.warn(f"FlexAttention failed ({type(err).__name__}: {err}); using the chunked path",
                              RuntimeWarning, stacklevel=2)
                return _path_chunked(q, k, v, scale, slopes, distance_bias, window)
        return _path_flex(q, k, v, scale, slopes, distance_bias, window)
    if path == "bias":
        return _path_bias(q, k, v, scale, slopes, distance_bias, window)
    return _path_naive(q, k, v, scale, slopes, distance_bias, window)[0]


# ``import posenc.attention as m`` gives this module; ``pe.attention(...)`` calls the function
make_module_callable(__name__, attention)
