"""What each attention layer of :class:`posenc.TinyLM` needs to know about position (the model's helper).

:func:`scheme_positions` calls a scheme's hooks (slopes, distance table,
rotation, ReRoPE's attention) for one length, or for explicit position ids,
and packs the answers as one :class:`posenc.layers.Positions` per layer,
checking what a scheme of yours returns. :func:`position_ids` checks the ids
of ``model(idx, positions=...)``.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, List, Optional

import torch

from ._validate import check_id_shape
from .layers import Positions
from .scheme import PositionScheme


def builtin(scheme: PositionScheme) -> bool:
    """A scheme of posenc's own (its hooks are tested; a scheme of yours is checked at every call)."""
    return type(scheme).__module__.startswith("posenc.")


def check_same(out: Any, x: torch.Tensor, what: str, shape: str) -> None:
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
        got = (f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__)
        raise ValueError(f"{what} must return a tensor of the shape and dtype it was given, {shape} = "
                         f"{tuple(x.shape)} {x.dtype}; got {got}")


def checked_rotate(scheme: PositionScheme, qk: torch.Tensor, **positions: Any) -> torch.Tensor:
    """``scheme.rotate(qk)``, refused unless it keeps the shape and dtype of ``qk``."""
    try:
        out = scheme.rotate(qk, **positions)
    except IndexError as err:  # a table of a scheme of yours shorter than the sequence
        raise ValueError(f"{type(scheme).__name__}.rotate() raised IndexError ({err}) on a sequence of {qk.shape[-2]} "
                         f"tokens: a table it reads is shorter than the positions; build it with a larger one") from None
    check_same(out, qk, f"{type(scheme).__name__}.rotate(qk)", "(2, batch, heads, seq, head_dim)")
    return out


def takes_positions(scheme: PositionScheme, hook: str) -> None:
    """Raise ``ValueError`` unless ``scheme``'s ``hook`` accepts explicit position ids (``positions=``)."""
    try:
        params = inspect.signature(getattr(scheme, hook)).parameters
    except (TypeError, ValueError):
        params = {}
    if "positions" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"{type(scheme).__name__}.{hook}() takes no positions argument, so it serves contiguous "
                         f"positions only; give it `positions=None` ((batch, seq) int64 ids) to run with "
                         "model(idx, positions=...)")


def position_ids(positions: Any, idx: torch.Tensor) -> torch.Tensor:
    """``positions`` checked: ``(seq,)`` or ``(batch, seq)`` integer ids >= 0, strictly increasing per row."""
    b, t = idx.shape
    ids = check_id_shape(positions, b, t, f"idx of shape {(b, t)}")
    ids = ids.to(device=idx.device, dtype=torch.int64).expand(b, t)
    if bool((ids < 0).any()) or (t > 1 and not bool((ids[:, 1:] > ids[:, :-1]).all())):
        raise ValueError("positions must be ids >= 0, strictly increasing along each sequence (token i comes "
                         f"before token i + 1); got rows from {int(ids.min())} to {int(ids.max())}")
    return ids


def scheme_positions(scheme: PositionScheme, t: int, device: torch.device, ids: Optional[torch.Tensor] = None, *,
                     n_layers: int, sink_positions: str = "original") -> List[Positions]:
    """What every attention layer needs to know about ``scheme``'s positions at length ``t`` (no window).

    One :class:`~posenc.layers.Positions` per layer. A scheme of yours is
    checked here (the shapes of its slopes and tables, what its rotation
    returns). With ids ``(batch, t)``: rotations at the ids, and a bias by the
    ids' distances as one ``(batch, heads, t, t)`` tensor.
    """
    h = scheme.n_heads
    diff = None
    if ids is not None:
        if getattr(scheme, "attends", False) and getattr(scheme, "reads_ids", True) or sink_positions == "cache":
            raise ValueError("explicit position ids do not combine with ReRoPE / Self-Extend or with sinks at "
                             "cache positions (they set the positions themselves)")
        diff = ids[:, :, None] - ids[:, None, :]  # (batch, t, t): p_i - p_j
        t = int(diff.max()) + 1  # the distances the bias table must cover
    slopes = scheme.slopes()
    table = None
    if slopes is not None:
        if not isinstance(slopes, torch.Tensor) or tuple(slopes.shape) != (h,):
            raise ValueError(f"{type(scheme).__name__}.slopes() must return a ({h},) tensor, "
                             f"got {getattr(slopes, 'shape', type(slopes).__name__)}")
    elif scheme.biases:
        try:
            table = scheme.distance_bias(t, device=device, dtype=torch.float32)
        except IndexError as err:  # a learned table of a scheme of yours with fewer than t distances
            raise ValueError(f"{type(scheme).__name__}.distance_bias({t}) raised IndexError ({err}): a table it reads "
                             f"covers fewer than the {t} distances of this sequence; build it with a larger one") from None
        shapes = ((h, t), (n_layers, h, t))
        if table is not None and (not isinstance(table, torch.Tensor) or tuple(table.shape) not in shapes
                                  or not table.is_floating_point()):
            raise ValueError(f"{type(scheme).__name__}.distance_bias({t}) must return a floating tensor of "
                             f"shape {shapes[0]} (every layer) or {shapes[1]} (one per layer), got "
                             f"{getattr(table, 'shape', type(table).__name__)}")
        if table is not None and not builtin(scheme) and not bool(
                (~(table.isnan() | (table == math.inf)) & table[..., :1].isfinite()).all()):
            raise ValueError(f"{type(scheme).__name__}.distance_bias({t}) holds NaN or +inf (or a non-finite "
                             "value at distance 0): a bias may be -inf to mask a distance, nothing else")
    attend = scheme.attend if getattr(scheme, "attends", False) else None
    rotate = None
    if scheme.rotates:
        rotate = scheme.rotate if builtin(scheme) else functools.partial(checked_rotate, scheme)
        if ids is not None:
            takes_positions(scheme, "rotate")
            rotate = functools.partial(rotate, positions=ids)
    if diff is not None and (slopes is not None or table is not None):
        if slopes is not None:
            bias = -slopes.to(device=device, dtype=torch.float32)[:, None, None, None] * diff.clamp(min=0)
        else:  # (heads, t') or (layers, heads, t') -> read at every pair's distance
            bias = table[..., diff.clamp(min=0)]
        bias = bias.movedim(-4, -3).masked_fill((diff < 0)[:, None], float("-inf"))  # (.., batch, heads, t, t)
        if bias.ndim == 5:  # a table per layer
            return [Positions(rotate=rotate, bias=bias[i]) for i in range(n_layers)]
        return [Positions(rotate=rotate, bias=bias)] * n_layers
    if attend is not None and "layer" in inspect.signature(attend).parameters:  # a table per layer (CoPE)
        return [Positions(rotate=rotate, slopes=slopes, table=table, attend=functools.partial(attend, layer=i))
                for i in range(n_layers)]
    common = dict(rotate=rotate, slopes=slopes, attend=attend)
    if table is not None and table.ndim == 3:  # a table per layer
        return [Positions(table=table[i], **common) for i in range(n_layers)]
    return [Positions(table=table, **common)] * n_layers
