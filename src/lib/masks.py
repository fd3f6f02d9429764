"""Relative positions and boolean attention masks.

Conventions used throughout :mod:`posenc`:

* masks are boolean ``(q_len, k_len)`` tensors with ``True`` = *may attend*;
* when ``k_len > q_len`` (decoding with a key/value cache) the queries are the
  **last** ``q_len`` positions, i.e. query ``i`` sits at key position
  ``i + k_len - q_len`` ("bottom-right" alignment, as in fused attention kernels).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import torch

from ._validate import check_bool, check_device as _device, check_int, check_number

__all__ = ["check_lengths", "relative_positions", "causal_mask", "sliding_window_mask"]

# Private checks shared by the attention and bias modules (this module is imported by all of them).

_LAYOUT = "tensors are (batch, heads, seq, head_dim): is a (batch, seq, heads, head_dim) tensor passed?"


def _layout_hint(q: torch.Tensor, size: int, dim: int = 2) -> str:
    """The layout reminder, only when ``size`` matches ``q``'s dimension ``dim`` rather than its heads:
    then ``q`` is likely ``(batch, seq, heads, head_dim)``; otherwise the other tensor is what is wrong."""
    return f" ({_LAYOUT})" if q.ndim == 4 and size == q.shape[dim] != q.shape[1 if dim == 2 else 2] else ""


def _as_tensor(name: str, value: Any, device: Optional[torch.device] = None, values: bool = False,
               mask: bool = False, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Numbers, sequences, NumPy arrays or tensors as a float tensor (integers converted; bool, complex refused).

    ``values``: the caller reads the numbers, so a meta tensor (which has none) is refused.
    ``mask``: a boolean tensor is expected instead (True = may attend).
    ``dtype``: the result's (Python floats go to it directly, not through float32).
    """
    if isinstance(value, torch.Tensor) and value.is_floating_point() and not (mask or values) and dtype is None and (
            device is None or value.device == device):
        return value  # the common case, at no cost
    try:
        t = torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{name} must be a tensor or a sequence of numbers, got {type(value).__name__}") from err
    if mask and t.dtype != torch.bool:
        raise ValueError(f"{name} must be boolean (True = may attend), got {t.dtype}")
    if mask:
        return t
    if t.dtype == torch.bool or t.is_complex() or values and t.is_meta:
        raise ValueError(f"{name} must hold real numbers, got {t.dtype} on {t.device}")
    if dtype is not None:
        return torch.as_tensor(value, dtype=dtype, device=device)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _finite(name: str, t: torch.Tensor, sync: bool = False) -> None:
    """``ValueError`` on NaN or infinity; checked on the CPU only unless ``sync`` (never on meta: no values)."""
    if not (t.is_cpu or sync and not t.is_meta):
        return
    if not (all(map(math.isfinite, t.tolist())) if t.ndim == 1 and t.numel() <= 256 else bool(torch.isfinite(t).all())):
        raise ValueError(f"{name} must be finite, got {t.tolist() if t.numel() <= 16 else 'NaN or infinity'}")


def _check_tensors(**named: Any) -> None:
    """Floating-point tensors (``TypeError`` otherwise) of one dtype on one device (``ValueError``)."""
    first = None
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} (convert with torch.as_tensor)")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        first = t if first is None else first
    if any(t.dtype != first.dtype or t.device != first.device for t in named.values()):
        got = ", ".join(f"{n}: {t.dtype} on {t.device}" for n, t in named.items())
        raise ValueError(f"{', '.join(named)} must share one dtype and device; got {got}")


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Softmax attention's ``q``, ``k``, ``v``: ``TypeError`` for an object that is not a tensor, else ``ValueError``
    unless they are floating-point ``(batch, heads, seq, head_dim)`` of one dtype and device, ``q_len <= k_len``."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
            and q.is_floating_point() and q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
        _check_tensors(q=q, k=k, v=v)  # raises, saying what is wrong
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be (batch, heads, seq, head_dim); got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"q, k, v must agree on batch and heads, and k, v on seq; got {q.shape}, {k.shape}, "
                         f"{v.shape} ({_LAYOUT})")
    if q.shape[-1] != k.shape[-1] or q.shape[-1] == 0:
        raise ValueError(f"q and k must share a head_dim >= 1; got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"q_len ({q.shape[2]}) must be <= k_len ({k.shape[2]}): queries are the last key positions")


def _check_scale(scale: Any, dtype: torch.dtype) -> float:
    """``scale`` as a float: finite, and 0 or of a magnitude that ``dtype``'s attention holds (it computes in
    float32 for half precision), else ``ValueError``: a scale that rounds to 0 or to infinity there gives NaN."""
    scale = check_number("scale", scale)
    info = torch.finfo(torch.promote_types(dtype, torch.float32))
    if scale != 0 and not info.tiny <= abs(scale) <= info.max:
        raise ValueError(f"scale must be 0 or of magnitude in [{info.tiny:.3g}, {info.max:.3g}] (the range of "
                         f"{info.dtype}, in which {dtype} attention computes), got {scale!r}")
    return scale


def check_lengths(q_len: int, k_len: Optional[int] = None) -> int:
    """Validate a query/key length pair and return ``k_len`` (defaulting to ``q_len``).

    Raises:
        ValueError: if a length is not a positive integer or ``k_len < q_len``.
    """
    if k_len is None:
        k_len = q_len
    q_len, k_len = check_int("q_len", q_len), check_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(
            f"k_len ({k_len}) must be >= q_len ({q_len}): queries are the last q_len key positions"
        )
    return k_len


def relative_positions(
    q_len: int, k_len: Optional[int] = None, *, device: Optional[torch.device] = None
) -> torch.Tensor:
    """Signed offsets ``j - i`` between key position ``j`` and query position ``i``.

    Returns:
        ``(q_len, k_len)`` int64 tensor; entry ``[i, j]`` is ``j - (i + k_len - q_len)``,
        so keys in the past of a query are negative and the diagonal of the
        bottom-right square is zero.
    """
    k_len, device = check_lengths(q_len, k_len), _device(device)
    q_len = operator.index(q_len)  # an integer: checked above
    q_pos = torch.arange(k_len - q_len, k_len, device=device)  # (q_len,)
    k_pos = torch.arange(k_len, device=device)  # (k_len,)
    return k_pos[None, :] - q_pos[:, None]  # (q_len, k_len)


def causal_mask(
    q_len: int, k_len: Optional[int] = None, *, device: Optional[torch.device] = None
) -> torch.Tensor:
    """Boolean causal mask: query ``i`` may attend to keys at positions ``<= i``.

    Returns:
        ``(q_len, k_len)`` bool tensor, True = may attend (bottom-right aligned).

    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return relative_positions(q_len, k_len, device=device) <= 0


def sliding_window_mask(
    q_len: int,
    k_len: Optional[int] = None,
    *,
    window: int,
    causal: bool = True,
    sinks: int = 0,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Local attention: each query sees only the ``window`` nearest keys (and the first ``sinks``).

    Causal (default): query ``i`` attends to keys ``i - window + 1 ... i`` (itself
    included), so every query sees at most ``window`` keys: the "super baseline"
    of length extrapolation when ``window`` equals the training length.
    Bidirectional (``causal=False``): keys with ``|i - j| < window``.

    ``sinks``: keys ``0 .. sinks-1`` stay visible to every query (in the past
    of it, when causal) as well: StreamingLLM's attention sinks (Xiao et al.,
    2024), the first tokens that a model trained with full attention dumps
    attention on.

    Returns:
        ``(q_len, k_len)`` bool tensor, True = may attend.

    >>> sliding_window_mask(4, window=2).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    window = check_int("window", window)
    sinks = check_int("sinks", sinks, low=0)
    causal = check_bool("causal", causal)
    rel = relative_positions(q_len, k_len, device=device)
    near = rel.abs() < window
    if sinks:
        near = near | (torch.arange(rel.shape[1], device=rel.device) < sinks)
    return near & (rel <= 0) if causal else near


# Shared by the bias schemes (KERPLE, Sandwich, T5): their bias read along one row, by distance.


def _by_distance(bias: torch.Tensor) -> torch.Tensor:
    """``(heads, 1, n)`` bias of the last of ``n`` queries -> ``(heads, n)`` by distance ``0 .. n-1``."""
    return bias[:, 0].flip(-1)
