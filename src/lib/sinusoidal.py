"""Sinusoidal position encoding (Vaswani et al., 2017, Sec. 3.5).

.. math::
    p_{m, 2i} = \\sin(m\\,\\theta_i), \\qquad p_{m, 2i+1} = \\cos(m\\,\\theta_i),
    \\qquad \\theta_i = \\text{base}^{-2i/d}.

Because :math:`\\sin a \\sin b + \\cos a \\cos b = \\cos(a - b)`, the dot product
:math:`p_m \\cdot p_n = \\sum_i \\cos((m - n)\\theta_i)` depends on :math:`m - n` only
(:func:`sinusoidal_similarity`).
"""

from __future__ import annotations

from typing import Union

import torch

__all__ = ["sinusoidal_frequencies", "sinusoidal_embedding", "sinusoidal_similarity"]

Positions = Union[int, torch.Tensor]


def _check_dim(dim: int, what: str) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"{what} needs an even dimension >= 2, got dim={dim!r}")


def _check_base(base: float) -> None:
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequencies ``theta_i = base ** (-2i / dim)`` for ``i = 0 .. dim/2 - 1``.

    Returns:
        ``(dim // 2,)`` float64 tensor, from 1 (fastest) down to ``base ** (-(dim-2)/dim)``.
    """
    _check_dim(dim, "sinusoidal_frequencies")
    _check_base(base)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i/d
    return torch.as_tensor(base, dtype=torch.float64) ** -exponent


def _as_positions(positions: Positions) -> torch.Tensor:
    if isinstance(positions, bool):
        raise ValueError("positions must be an int count or a tensor of positions")
    if isinstance(positions, int):
        if positions < 1:
            raise ValueError(f"n_positions must be >= 1, got {positions}")
        return torch.arange(positions, dtype=torch.float64)
    return torch.as_tensor(positions).to(torch.float64)


def sinusoidal_embedding(
    n_positions: Positions,
    dim: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Vaswani's sinusoidal table: sin on even channels, cos on odd channels.

    Args:
        n_positions: number of positions ``n`` (rows ``0 .. n-1``) or a tensor of
            (possibly fractional or negative) positions of any shape ``(...)``.
        dim: model dimension ``d`` (even).
        base: the wavelength scale (10000 in the paper).
        dtype: dtype of the result; angles are computed in float64.

    Returns:
        ``(n_positions, dim)`` tensor, or ``(..., dim)`` for a tensor of positions.

    >>> p = sinusoidal_embedding(2, 4)
    >>> p[0].tolist()  # position 0: sin 0 = 0, cos 0 = 1
    [0.0, 1.0, 0.0, 1.0]
    """
    _check_dim(dim, "sinusoidal_embedding")
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
        distances: an int ``n`` (offsets ``0 .. n-1``) or a tensor of offsets.
        normalized: divide by ``dim / 2`` so that offset 0 gives 1.

    Returns:
        float64 tensor with the shape of the offsets.
    """
    _check_dim(dim, "sinusoidal_similarity")
    rel = _as_positions(distances)
    sim = torch.cos(rel[..., None] * sinusoidal_frequencies(dim, base)).sum(-1)
    return sim / (dim // 2) if normalized else sim
