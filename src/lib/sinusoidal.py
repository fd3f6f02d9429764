"""Sinusoidal position encoding (Vaswani et al., 2017, Sec. 3.5).

.. math::
    p_{m, 2i} = \\sin(m\\,\\theta_i), \\qquad p_{m, 2i+1} = \\cos(m\\,\\theta_i),
    \\qquad \\theta_i = \\text{base}^{-2i/d}.

Because :math:`\\sin a \\sin b + \\cos a \\cos b = \\cos(a - b)`, the dot product
:math:`p_m \\cdot p_n = \\sum_i \\cos((m - n)\\theta_i)` depends on :math:`m - n` only
(:func:`sinusoidal_similarity`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from ._validate import _align_positions, _float_tensor, _real_tensor
from ._validate import check_bool, check_even_dim, check_id_shape, check_int, check_number
from ._validate import check_float_dtype as _float_dtype
from .scheme import PositionScheme, _kept, register_scheme

__all__ = [
    "sinusoidal_frequencies",
    "sinusoidal_embedding",
    "sinusoidal_similarity",
    "sinusoidal_wavelengths",
    "sinusoidal_shift_matrix",
    "sinusoidal_period_coverage",
    "sinusoidal_nearest_distance",
    "SinusoidalPositionalEmbedding",
    "LearnedPositions",
    "SinusoidalPositions",
]

Positions = Union[int, torch.Tensor]


_check_dim = check_even_dim


def _check_base(base: float) -> float:
    return check_number("base", base, 1)


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequencies ``theta_i = base ** (-2i / dim)`` for ``i = 0 .. dim/2 - 1``.

    Returns:
        ``(dim // 2,)`` float64 tensor, from 1 (fastest) down to ``base ** (-(dim-2)/dim)``.
    """
    _check_dim(dim, "sinusoidal_frequencies")
    base = _check_base(base)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i/d
    return torch.as_tensor(base, dtype=torch.float64) ** -exponent


def _is_count(positions: Any) -> bool:
    """An integer count ``n`` (Python, NumPy, or a 0-d integer tensor or array, as ``check_int`` reads them)
    rather than a tensor of positions; a 0-d floating tensor is one position."""
    if isinstance(positions, torch.Tensor):
        return positions.ndim == 0 and not (positions.dtype == torch.bool or positions.is_floating_point()
                                            or positions.is_complex())
    if isinstance(positions, np.ndarray):
        return positions.ndim == 0 and positions.dtype.kind in "iu"
    return isinstance(positions, numbers.Integral) and not isinstance(positions, (bool, np.bool_))


def _as_positions(positions: Positions, name: str = "n_positions") -> torch.Tensor:
    if _is_count(positions):
        count = int(positions)
        if count < 1:
            raise ValueError(f"{name} must be >= 1, got {positions}")
        return torch.arange(count, dtype=torch.float64)
    if positions is None or isinstance(positions, (str, bool, np.bool_, numbers.Number)):
        raise ValueError(f"{name} must be an integer count n (for 0 .. n-1) or a tensor of values, got {positions!r}")
    return _real_tensor(positions, "positions" if name == "n_positions" else name).to(torch.float64)


def sinusoidal_embedding(
    n_positions: Positions,
    dim: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Vaswani's sinusoidal table: sin on even channels, cos on odd channels.

    Args:
        n_positions: number of positions ``n`` (rows ``0 .. n-1``): a Python or
            NumPy integer, or a 0-d integer tensor (``torch.tensor(5)`` is ``5``);
            or a tensor of (possibly fractional or negative) positions of any
            shape ``(...)`` (a 0-d floating tensor is one position).
        dim: model dimension ``d`` (even).
        base: the wavelength scale (10000 in the paper).
        dtype: floating-point dtype of the result; angles are computed in float64.

    Returns:
        ``(n_positions, dim)`` tensor, or ``(..., dim)`` for a tensor of positions.

    >>> p = sinusoidal_embedding(2, 4)
    >>> p[0].tolist()  # position 0: sin 0 = 0, cos 0 = 1
    [0.0, 1.0, 0.0, 1.0]
    """
    _check_dim(dim, "sinusoidal_embedding")
    dtype = _float_dtype(dtype)
    pos = _as_positions(n_positions)
    angles = pos[..., None] * sinusoidal_frequencies(dim, base)  # (..., d/2)
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (..., d/2, 2)
    return table.flatten(-2).to(dtype)  # (..., d): [sin, cos, sin, cos, ...]


def sinusoidal_similarity(
    distances: Positions, dim: int, base: float = 10000.0, *, normalized: bool = False
) -> torch.Tensor:
    """Dot product ``p_m . p_n`` as a function of the offset ``m - n`` alone.

    ``p_m . p_n = sum_i cos((m - n) theta_i)``; it equals ``dim / 2`` at offset 0,
    is even in ``m - n``, and oscillates while decaying on average.

    Args:
        distances: an int ``n`` (offsets ``0 .. n-1``; a 0-d integer tensor too) or a tensor of offsets.
        normalized: divide by ``dim / 2`` so that offset 0 gives 1.

    Returns:
        float64 tensor with the shape of the offsets.
    """
    _check_dim(dim, "sinusoidal_similarity")
    rel = _as_positions(distances, "distances")
    normalized = check_bool("normalized", normalized)
    sim = torch.cos(rel[..., None] * sinusoidal_frequencies(dim, base)).sum(-1)
    return sim / (dim // 2) if normalized else sim


# ---------------------------------------------------------------------------
# Helpers for chapter 2: wavelengths, the shift matrix, what training covers,
# and an ``nn.Module`` that adds the table to token embeddings.
# ---------------------------------------------------------------------------


def sinusoidal_wavelengths(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelength (in positions) of each sin/cos channel pair: ``2 pi / theta_i``.

    Vaswani et al. (2017, Sec. 3.5): a geometric progression from ``2 pi`` (pair 0)
    up to ``2 pi * base ** ((dim - 2) / dim)`` (the last pair), just short of
    ``2 pi * base``.

    Returns:
        ``(dim // 2,)`` float64 tensor, increasing.

    >>> [round(w, 4) for w in sinusoidal_wavelengths(4, base=100.0).tolist()]  # 2 pi, 2 pi * 10
    [6.2832, 62.8319]
    """
    return 2 * math.pi / sinusoidal_frequencies(dim, base)


def sinusoidal_shift_matrix(shift: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The matrix ``R_k`` with ``p_{m+k} = R_k p_m`` for every position ``m``.

    From ``sin((m+k)t) = sin(mt)cos(kt) + cos(mt)sin(kt)`` and
    ``cos((m+k)t) = cos(mt)cos(kt) - sin(mt)sin(kt)``, each (sin, cos) channel
    pair ``(2i, 2i+1)`` is mapped by the 2x2 block
    ``[[cos k theta_i, sin k theta_i], [-sin k theta_i, cos k theta_i]]``:
    a rotation that depends on the offset ``k`` but not on ``m`` (the property
    Vaswani et al. gave as the reason for choosing sinusoids).

    Args:
        shift: the offset ``k`` (any real number; negative shifts move left).
        dim: even model dimension ``d``.

    Returns:
        ``(dim, dim)`` float64 block-diagonal orthogonal matrix; for row vectors,
        ``sinusoidal_embedding(m + k) == sinusoidal_embedding(m) @ R_k.T``.
    """
    _check_dim(dim, "sinusoidal_shift_matrix")
    k = check_number("shift", shift)
    angles = k * sinusoidal_frequencies(dim, base)  # (d/2,)
    c, s = angles.cos(), angles.sin()
    sin_ch = torch.arange(0, dim, 2)
    cos_ch = sin_ch + 1
    rot = torch.zeros(dim, dim, dtype=torch.float64)
    rot[sin_ch, sin_ch] = c
    rot[sin_ch, cos_ch] = s
    rot[cos_ch, sin_ch] = -s
    rot[cos_ch, cos_ch] = c
    return rot


def sinusoidal_period_coverage(train_length: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Fraction of each channel pair's period that positions ``0 .. L-1`` sweep.

    Pair ``i`` turns by ``theta_i`` per position, so training positions
    ``0 .. L-1`` cover the angles ``[0, (L-1) theta_i]``: the fraction
    ``min(1, (L-1) theta_i / (2 pi))`` of a full turn. Pairs below 1 take values
    beyond position ``L`` that training never produced (the smoothness argument
    of Su, 2023, "Transformer upgrade road 7").

    Returns:
        ``(dim // 2,)`` float64 tensor in ``[0, 1]``.
    """
    train_length = check_int("train_length", train_length)
    turned = (train_length - 1) * sinusoidal_frequencies(dim, base)
    return (turned / (2 * math.pi)).clamp(max=1.0)


def sinusoidal_nearest_distance(
    positions: Positions,
    train_length: int,
    dim: int,
    base: float = 10000.0,
    *,
    return_index: bool = False,
    chunk: int = 4096,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Distance from ``p_n`` to the nearest training encoding ``p_0 .. p_{L-1}``.

    ``min_{0 <= m < L} ||p_n - p_m||``. Because ``||p_n - p_m||^2 = d - 2 p_n . p_m``
    and ``p_n . p_m`` depends on ``n - m`` only, this is zero for ``0 <= n < L``
    and positive for any other integer ``n`` (``theta_0 = 1`` makes ``p_n != p_m``
    for ``n != m``).

    Args:
        positions: an int ``N`` (positions ``0 .. N-1``; a 0-d integer tensor too) or a tensor of positions ``(...)``.
        train_length: ``L``, the number of training positions (an integer, a 0-d integer tensor too).
        dim: even model dimension ``d``.
        return_index: also return the index ``m`` of the nearest training encoding.
        chunk: positions processed at once (bounds memory to ``chunk * L`` floats).

    Returns:
        float64 distances with the shape of the positions, and optionally the
        ``int64`` indices of the nearest training positions.
    """
    _check_dim(dim, "sinusoidal_nearest_distance")
    train_length = check_int("train_length", train_length)
    chunk, return_index = check_int("chunk", chunk), check_bool("return_index", return_index)
    pos = _as_positions(positions, "positions")
    flat = pos.reshape(-1)
    train = sinusoidal_embedding(train_length, dim, base, dtype=torch.float64)  # (L, d)
    dists, idxs = [], []
    for start in range(0, flat.numel(), chunk):
        p = sinusoidal_embedding(flat[start:start + chunk], dim, base, dtype=torch.float64)
        # exact differences (the matmul shortcut loses ~1e-8 near zero distance)
        dist, idx = torch.cdist(p, train, compute_mode="donot_use_mm_for_euclid_dist").min(dim=-1)
        dists.append(dist)
        idxs.append(idx)
    dist = torch.cat(dists).reshape(pos.shape) if dists else flat.new_zeros(pos.shape)
    if not return_index:
        return dist
    idx = torch.cat(idxs).reshape(pos.shape) if idxs else torch.zeros(pos.shape, dtype=torch.long)
    return dist, idx


class SinusoidalPositionalEmbedding(nn.Module):
    """Adds Vaswani's sinusoidal encodings to token embeddings (no parameters).

    ``forward(x)`` returns ``x + scale * p_{positions}``; the table is computed on
    the fly in float64 and cast to ``x.dtype``, so any position has an encoding
    (unlike a learned table with a fixed number of rows).

    Args:
        dim: model dimension ``d`` (even); the last dimension of ``x``.
        base: the wavelength scale (10000 in the paper).
        scale: multiplier on the encodings (1 in the paper; some code uses
            ``1 / sqrt(d)`` on the encodings or ``sqrt(d)`` on the tokens instead).
    """

    def __init__(self, dim: int, base: float = 10000.0, *, scale: float = 1.0) -> None:
        super().__init__()
        self.dim = _check_dim(dim, "SinusoidalPositionalEmbedding")
        self.base = _check_base(base)
        self.scale = check_number("scale", scale)
        self._tables: dict = {}  # (seq, device, dtype, dim, base, scale) -> the default positions' table

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, scale={self.scale:g}"

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: floating-point ``(..., seq, dim)``; ``positions``: ``(seq,)``, ``(batch, seq)``
        (for a 4-D ``x``: the same for every head) or broadcastable to ``x.shape[:-1]``
        without enlarging it (default ``0 .. seq-1``; see :func:`posenc.apply_rope`).
        Returns the shape and dtype of ``x``."""
        x = _float_tensor(x, "x")
        if x.ndim < 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"expected x of shape (..., seq, {self.dim}), got {tuple(x.shape)}"
            )
        seq = x.shape[-2]
        if positions is None:  # the default positions: the table is kept per length, device and dtype
            return x + _kept(self._tables, (seq, x.device, x.dtype, self.dim, self.base, self.scale),
                             lambda: self._table(torch.arange(seq), x))
        positions = _align_positions(_real_tensor(positions, "positions"), x.shape[:-2], seq)
        return x + self._table(positions, x)

    def _table(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        table = sinusoidal_embedding(positions.detach().cpu(), self.dim, self.base,
                                     dtype=torch.float64)  # (..., seq, d)
        return (self.scale * table).to(dtype=x.dtype, device=x.device)


# ---------------------------------------------------------------------------
# As position schemes of a model (posenc.PositionScheme)
# ---------------------------------------------------------------------------


def _check_embed_input(x: torch.Tensor, d_model: int) -> torch.Tensor:
    x = _float_tensor(x, "x")
    if x.ndim < 2 or x.shape[-1] != d_model:
        raise ValueError(f"expected token embeddings x of shape (batch, seq, {d_model}), got {tuple(x.shape)}")
    return x


def _check_embed_ids(positions: Any, x: torch.Tensor) -> torch.Tensor:
    """``positions`` for ``embed(x, positions)``: integer ids ``>= 0`` of shape ``(batch, seq)`` or ``(seq,)``
    (an index below 0 would read a row from the end of the table)."""
    check_id_shape(positions, x.shape[0] if x.ndim == 3 else None, x.shape[-2], f"x of shape {tuple(x.shape)}")
    if positions.numel() and not positions.is_meta and bool((positions < 0).any()):
        raise ValueError(f"positions must be ids >= 0, got {int(positions.min())}")
    return positions


@register_scheme("learned")
class LearnedPositions(PositionScheme):
    """A learned table of absolute position vectors added to the tokens (GPT-2).

    It has ``max_len`` rows, drawn ``N(0, 1)`` like the token embeddings; a
    longer sequence raises ``ValueError`` (learned absolute positions cannot
    extrapolate: there is no row for an unseen position).

    Shapes: ``embed(x)``: ``(batch, seq, d_model)`` with ``seq <= max_len``.
    """

    name = "learned"

    def __init__(self, max_len: Optional[int] = None) -> None:
        super().__init__()
        max_len = check_int("max_len (the size of the learned table)", max_len)
        self.max_len = max_len
        self.table: Optional[nn.Parameter] = None

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        if self.table is None:
            self.table = nn.Parameter(torch.zeros(self.max_len, d_model))

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.table.copy_(torch.randn(self.table.shape, generator=generator))

    def embed(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._require_bound(self.table)
        _check_embed_input(x, self.d_model)
        if positions is not None:  # (batch, seq) ids
            top = int(_check_embed_ids(positions, x).max()) if positions.numel() else -1
            if top >= self.max_len:
                raise ValueError(f"position='learned' has a table of max_len={self.max_len} positions and cannot "
                                 f"embed position id {top}; build the model with a larger max_len")
            return x + self.table[positions]  # (batch, seq, d_model)
        t = x.shape[-2]
        if t > self.max_len:
            raise ValueError(
                f"position='learned' has a table of max_len={self.max_len} positions and cannot "
                f"run a sequence of {t} tokens (that is the point: learned absolute positions do "
                "not extrapolate); build the model with a larger max_len"
            )
        return x + self.table[:t]  # (seq, d_model) broadcast over the batch


@register_scheme("sinusoidal")
class SinusoidalPositions(PositionScheme):
    """Vaswani et al. (2017)'s fixed sinusoidal table added to the tokens (no parameters).

    Shapes: ``embed(x)``: ``(batch, seq, d_model)``, ``d_model`` even.
    """

    name = "sinusoidal"

    def __init__(self, base: float = 10000.0) -> None:
        super().__init__()
        self.base = _check_base(base)
        self._tables: dict = {}  # (seq, device, dtype, d_model, base) -> the table, cast, on the device

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        if d_model % 2:
            raise ValueError(f"sinusoidal needs an even d_model, got {d_model}")
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)

    def embed(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._require_bound(self.d_model)
        t = _check_embed_input(x, self.d_model).shape[-2]
        if positions is not None:  # (batch, seq) ids: the table's rows at those positions
            top = int(_check_embed_ids(positions, x).max()) if positions.numel() else -1
            rows = sinusoidal_embedding(top + 1, self.d_model, self.base) if top >= 0 else x.new_zeros(0, self.d_model)
            return x + rows.to(device=x.device, dtype=x.dtype)[positions]
        def table() -> torch.Tensor:  # (seq, d_model), once per length, device and dtype
            rows = sinusoidal_embedding(t, self.d_model, self.base) if t else x.new_zeros(0, self.d_model)
            return rows.to(device=x.device, dtype=x.dtype)
        return x + _kept(self._tables, (t, x.device, x.dtype, self.d_model, self.base), table)
