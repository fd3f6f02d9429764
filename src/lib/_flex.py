"""FlexAttention for :func:`posenc.relative_attention`'s ``path="flex"`` (the "auto" path on CUDA).

The distance bias is a ``score_mod`` (ALiBi's ``-m_h * (i - j)``, a learned
table read at ``i - j``), causal attention and a window are a block mask, and
on CUDA the call is compiled by ``torch.compile`` (Dong et al., 2024,
"Flex Attention: A Programming Model for Generating Optimized Attention
Kernels"). Elsewhere it runs eagerly, without a backward.

Shapes: q ``(batch, heads, q_len, head_dim)``, k and v ``(batch, heads, k_len,
head_dim)``; the query at row ``i`` sits at position ``i + k_len - q_len``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Dict, Optional, Tuple

import torch

_FLEX: Dict[str, bool] = {}  # "broken": True once compiling failed (the chunked path from then on)
_MASKS: Dict[Tuple[str, int, int, Optional[int]], Any] = {}  # block masks by (device, q_len, k_len, window)
_FLEX_COMPILED: Dict[Tuple[bool, bool], Callable[..., torch.Tensor]] = {}
#: compiled entries allowed per score kind (one per length, dtype, grad or not) before dynamo runs it eagerly
_FLEX_RECOMPILES = 64


def _flex_available(device: torch.device) -> bool:
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401  (torch >= 2.5)
        if device.type == "cuda":
            import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _flex_compiles(device: torch.device) -> bool:
    """Whether FlexAttention runs compiled here (on CUDA; eager elsewhere)."""
    return device.type == "cuda"


def _flex_score(q, k, v, slopes, table, block_mask, scale):
    """FlexAttention with the bias of distance ``i + offset - j`` as a ``score_mod`` (``slopes``/``table`` or None).

    Compiled per score kind (:func:`_flex_kernel`), for static shapes: each
    length compiles once. (Dynamic shapes put the lengths into the score and
    mask functions as symbols, which torch 2.11's inductor fails to lower for
    FlexAttention: "'ShapeAsConstantBuffer' object has no attribute 'dtype'".)
    """
    from torch.nn.attention.flex_attention import flex_attention

    offset, last = k.shape[2] - q.shape[2], k.shape[2] - 1

    def score_mod(score, b, h, q_idx, kv_idx):
        dist = q_idx + offset - kv_idx
        if slopes is not None:
            score = score - slopes[h] * dist
        if table is not None:
            score = score + table[h, torch.clamp(dist, 0, last)]
        return score
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _flex_kernel(has_slopes: bool, has_table: bool) -> Callable[..., torch.Tensor]:
    """The compiled :func:`_flex_score` for one score kind: a copy of the function per kind, since dynamo
    keeps its compiled entries per code object, and past ``recompile_limit`` (8 by default) of them it runs
    the function eagerly, which materialises the full score matrix (64 GiB at n = 32768 in bf16)."""
    key = (has_slopes, has_table)
    if key not in _FLEX_COMPILED:
        code = _flex_score.__code__.replace(co_name=f"_flex_score_{int(has_slopes)}{int(has_table)}")
        fn = type(_flex_score)(code, _flex_score.__globals__, code.co_name)
        _FLEX_COMPILED[key] = torch.compile(fn, dynamic=False)
    return _FLEX_COMPILED[key]


def _path_flex(q, k, v, scale, slopes, distance_bias, window):
    """FlexAttention: the bias as a ``score_mod``, causal and window as a block mask (compiled on CUDA)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if q.device.type != "cuda":  # eager FlexAttention has no backward (and refuses inputs that need one)
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", 0) for t in (q, k, v, slopes, distance_bias)):
            raise ValueError("path='flex' has no backward off CUDA (eager FlexAttention): use path='chunked'")
        q, k, v = q.detach(), k.detach(), v.detach()
    q_len, k_len = q.shape[2], k.shape[2]
    offset = k_len - q_len
    reach = window if window is not None else k_len + 1  # an int either way: one compiled mask per kind

    def mask_mod(b, h, q_idx, kv_idx):
        dist = q_idx + offset - kv_idx
        return (dist >= 0) & (dist < reach)

    key = (str(q.device), q_len, k_len, window)
    if key not in _MASKS:
        if len(_MASKS) >= 16:
            del _MASKS[next(iter(_MASKS))]  # the oldest mask
        with torch.inference_mode(False):  # cached: usable (saved for backward) outside inference mode too
            _MASKS[key] = create_block_mask(mask_mod, None, None, q_len, k_len, device=q.device)
    slopes = slopes.to(q.dtype) if slopes is not None else None
    table = distance_bias.to(q.dtype) if distance_bias is not None else None
    if not _flex_compiles(q.device):
        return _flex_score(q, k, v, slopes, table, _MASKS[key], scale)
    kernel = _flex_kernel(slopes is not None, table is not None)
    import torch._dynamo.config as dynamo_config

    limit = max(getattr(dynamo_config, "recompile_limit", 8), _FLEX_RECOMPILES)
    with dynamo_config.patch(recompile_limit=limit) if hasattr(dynamo_config, "recompile_limit") else nullcontext():
        return kernel(q, k, v, slopes, table, _MASKS[key], scale)
