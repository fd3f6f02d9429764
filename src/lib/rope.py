"""Rotary position embedding, RoPE (Su et al., 2021, "RoFormer", Eqs. 13-16).

Channel pairs of a query or key are rotated by an angle proportional to the
position: pair ``i`` at position ``m`` turns by ``m * theta_i`` with
``theta_i = base ** (-2i / d)``. Rotations compose, so

.. math:: \\langle R_m q, R_n k \\rangle = \\langle q, R_{n-m} k \\rangle,

a function of the offset ``n - m`` alone, while absolute positions enter only
through ``q`` and ``k`` separately.

Two layouts of the pairs are in use and give the same scores up to a fixed
permutation of channels:

* **interleaved** (RoFormer, GPT-J, Meta's Llama code): pairs ``(2i, 2i+1)``;
* **half-split** (GPT-NeoX, Hugging Face Llama): pairs ``(i, i + d/2)``,
  implemented with ``rotate_half``.

Angles are computed in float64 (on the CPU for Apple MPS, which lacks it), so
positions up to millions keep their precision; cos/sin are cast to ``x.dtype``
only at the end.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = [
    "rope_frequencies",
    "rope_angles",
    "rope_cos_sin",
    "apply_rope",
    "rope_rotation_matrix",
    "interleaved_to_half_split",
    "half_split_to_interleaved",
]


def _check_rope_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"RoPE rotates channel pairs: head_dim must be even and >= 2, got {dim!r}")


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation speeds ``theta_i = base ** (-2i / dim)``, ``i = 0 .. dim/2 - 1``.

    Returns:
        ``(dim // 2,)`` float64 tensor (``theta_0 = 1`` radian per position).

    >>> rope_frequencies(4, base=100.0).tolist()
    [1.0, 0.1]
    """
    _check_rope_dim(dim)
    if not base > 1:
        raise ValueError(f"RoPE base must be > 1, got {base!r}")
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return torch.as_tensor(base, dtype=torch.float64) ** -exponent


def _angle_device(device: torch.device) -> torch.device:
    # float64 is unavailable on MPS: compute there on the CPU and move the result.
    return torch.device("cpu") if device.type == "mps" else device


def rope_angles(
    positions: torch.Tensor,
    dim: int,
    base: float = 10000.0,
    *,
    inv_freq: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Angles ``m * theta_i`` for every position ``m`` and pair ``i``, in float64.

    Args:
        positions: ``(...,)`` positions (any real values).
        inv_freq: custom ``(dim // 2,)`` frequencies (context-extension methods
            rescale them); defaults to :func:`rope_frequencies`.

    Returns:
        ``(..., dim // 2)`` float64 tensor.
    """
    if inv_freq is None:
        inv_freq = rope_frequencies(dim, base)
    elif inv_freq.shape != (dim // 2,):
        raise ValueError(f"inv_freq must have shape ({dim // 2},), got {tuple(inv_freq.shape)}")
    device = _angle_device(torch.as_tensor(positions).device)
    pos = torch.as_tensor(positions).to(device=device, dtype=torch.float64)
    return pos[..., None] * inv_freq.to(device=device, dtype=torch.float64)


def rope_cos_sin(
    positions: torch.Tensor,
    dim: int,
    base: float = 10000.0,
    *,
    interleaved: bool = False,
    inv_freq: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables laid out to match the channels of ``x``.

    Half-split layout repeats the ``dim/2`` angles as ``[a, a]``; interleaved
    layout repeats each angle twice in place, ``[a0, a0, a1, a1, ...]``.

    Returns:
        ``(cos, sin)``, each ``(..., dim)`` in ``dtype`` on ``device``.
    """
    angles = rope_angles(positions, dim, base, inv_freq=inv_freq)  # (..., d/2) float64
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat((angles, angles), dim=-1)
    device = device if device is not None else torch.as_tensor(positions).device
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _rotate_pairs(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The "90-degree turn" of each pair: (a, b) -> (-b, a) in the given layout."""
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)  # rotate_half


def apply_rope(
    x: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    base: float = 10000.0,
    interleaved: bool = False,
    *,
    inv_freq: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Rotate the last dimension of ``x`` by its positions (RoFormer Eq. 34).

    ``out = x * cos(m theta) + rotate(x) * sin(m theta)``, the element-wise form
    of multiplying each channel pair by a 2x2 rotation matrix.

    Args:
        x: ``(..., seq, dim)`` queries or keys (``dim`` even), e.g.
            ``(batch, heads, seq, head_dim)``.
        positions: ``(seq,)`` or broadcastable ``(..., seq)`` positions;
            default ``0 .. seq-1``. Fractional positions are allowed
            (position interpolation).
        base: RoPE base (10000 in RoFormer; Llama 3 uses 500000).
        interleaved: pair channels ``(2i, 2i+1)`` (RoFormer) instead of
            ``(i, i + dim/2)`` (GPT-NeoX / Llama).
        inv_freq: custom frequencies, overriding ``base``.

    Returns:
        tensor of the same shape and dtype as ``x``.
    """
    if x.ndim < 2:
        raise ValueError(f"apply_rope expects x of shape (..., seq, dim), got {tuple(x.shape)}")
    seq, dim = x.shape[-2], x.shape[-1]
    _check_rope_dim(dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    positions = torch.as_tensor(positions, device=x.device)
    if positions.ndim == 0 or positions.shape[-1] != seq:
        raise ValueError(
            f"positions must end in the sequence length {seq}, got shape {tuple(positions.shape)}"
        )
    cos, sin = rope_cos_sin(
        positions, dim, base, interleaved=interleaved, inv_freq=inv_freq,
        dtype=x.dtype, device=x.device,
    )  # (..., seq, dim)
    return x * cos + _rotate_pairs(x, interleaved) * sin


def rope_rotation_matrix(
    position: float, dim: int, base: float = 10000.0, interleaved: bool = False
) -> torch.Tensor:
    """The block-diagonal rotation matrix ``R_m`` of RoFormer Eq. 15, explicitly.

    ``apply_rope(x, m) == x @ R_m.T`` for a row vector ``x``; this O(d^2) form is
    for teaching and testing, :func:`apply_rope` is the O(d) one.

    Returns:
        ``(dim, dim)`` float64 orthogonal matrix.
    """
    angles = rope_angles(torch.tensor(float(position)), dim, base)  # (d/2,)
    c, s = angles.cos(), angles.sin()
    half = dim // 2
    first = torch.arange(0, dim, 2) if interleaved else torch.arange(half)
    second = first + 1 if interleaved else first + half
    rot = torch.zeros(dim, dim, dtype=torch.float64)
    rot[first, first] = c
    rot[first, second] = -s
    rot[second, first] = s
    rot[second, second] = c
    return rot


def interleaved_to_half_split(x: torch.Tensor) -> torch.Tensor:
    """Permute channels ``[a0, b0, a1, b1, ...]`` to ``[a0, a1, ..., b0, b1, ...]``.

    Applied to the query/key projection weights (along the output channels) of
    a checkpoint trained with interleaved RoPE, it gives weights that produce
    the same attention scores under half-split RoPE.
    """
    _check_rope_dim(x.shape[-1])
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def half_split_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half_split`."""
    _check_rope_dim(x.shape[-1])
    first, second = x.chunk(2, dim=-1)
    return torch.stack((first, second), dim=-1).flatten(-2)
