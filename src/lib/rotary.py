"""RoPE's rotation (Su et al., 2021, "RoFormer", Eqs. 13-16): frequencies, angles, the rotation itself.

The pure functions and the :class:`RotaryEmbedding` module that the RoPE
position scheme (:class:`posenc.rope.RoPE`), the scaling rules of
:mod:`posenc.extend` (the frequencies of a stretched model), ReRoPE and xPos
build on; :mod:`posenc.rope` re-exports them all.

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

Inputs: ``x``, ``q``, ``k`` are floating-point tensors (NumPy arrays are
converted). Positions are integers or finite floats: ``(seq,)``, ``(batch,
seq)`` for a 4-D ``(batch, heads, seq, dim)`` or stacked ``(2, batch, heads,
seq, dim)`` tensor (every head alike), or right-aligned with ``x`` without
enlarging it (``(batch, heads, seq)``: per head). Anything else raises ``ValueError``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ._validate import check_device as _device
from ._validate import check_float_dtype as _float_dtype
from ._validate import _align_positions, _float_tensor, _real_tensor, _tensor
from ._validate import check_bool, check_even_dim, check_int, check_layout, check_number
from ._rotation import _rotate

__all__ = [
    "rope_frequencies",
    "p_rope_frequencies",
    "rope_angles",
    "rope_cos_sin",
    "apply_rope",
    "rope_rotation_matrix",
    "interleaved_to_half_split",
    "half_split_to_interleaved",
    "rope_decay_bound",
    "RotaryEmbedding",
]


def _check_rope_dim(dim: int) -> int:
    return check_even_dim(dim, "RoPE rotates channel pairs: head_dim")


def _check_base(base: float) -> float:
    return check_number("RoPE base", base, 1)


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation speeds ``theta_i = base ** (-2i / dim)``, ``i = 0 .. dim/2 - 1``.

    Returns:
        ``(dim // 2,)`` float64 tensor (``theta_0 = 1`` radian per position).

    >>> rope_frequencies(4, base=100.0).tolist()
    [1.0, 0.1]
    """
    dim = _check_rope_dim(dim)
    base = _check_base(base)
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return torch.as_tensor(base, dtype=torch.float64) ** -exponent


def p_rope_frequencies(dim: int, base: float = 10000.0, p: float = 0.75) -> torch.Tensor:
    """p-RoPE's speeds (Barbero et al., 2025): RoPE's ``base ** (-2i / dim)`` for the fastest pairs, 0 for the rest.

    The first ``int(p * dim // 2)`` pairs (the highest frequencies) keep
    :func:`rope_frequencies`; the others, the lowest frequencies, get speed 0:
    their channels are not rotated (angle 0 at every position) and carry no
    position. ``p = 1`` is RoPE, ``p = 0`` no rotation at all (NoPE).

    This is not GPT-NeoX's partial rotary (``RoPE(partial=...)``), which
    rotates the first channels at the frequencies of a smaller RoPE,
    ``base ** (-2i / (p * dim))``, from 1 down to about ``1 / base``: p-RoPE
    removes the slow end of the spectrum, partial rotary squeezes the whole
    spectrum into fewer channels.

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``, usable as ``apply_rope(x, inv_freq=...)``.

    >>> p_rope_frequencies(8, base=100.0, p=0.5).tolist()
    [1.0, 0.31622776601683794, 0.0, 0.0]
    """
    freqs = rope_frequencies(dim, base)
    p = check_number("p (the kept fraction of RoPE's frequencies)", p, what=" in [0, 1]")
    if not 0 <= p <= 1:
        raise ValueError(f"p (the kept fraction of RoPE's frequencies) must be in [0, 1], got {p!r}")
    kept = int(p * dim // 2)
    freqs[kept:] = 0.0
    return freqs


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
    return _angles(_real_tensor(positions, "positions"), _freqs(dim, base, inv_freq))


def _freqs(dim: int, base: float, inv_freq: Optional[torch.Tensor]) -> torch.Tensor:
    """``inv_freq`` checked (real, finite, ``(dim // 2,)``), or :func:`rope_frequencies` ``(dim, base)``."""
    if inv_freq is None:
        return rope_frequencies(dim, base)
    dim = _check_rope_dim(dim)
    _check_base(base)
    if not isinstance(inv_freq, (torch.Tensor, np.ndarray)):  # a list of numbers: read in float64, not float32
        try:
            if any(isinstance(v, (bool, np.bool_)) for v in np.asarray(inv_freq, dtype=object).ravel()):
                raise ValueError(f"inv_freq must hold frequencies, got booleans: {inv_freq!r}")
            inv_freq = torch.as_tensor(inv_freq, dtype=torch.float64)
        except ValueError as err:
            if "booleans" in str(err):
                raise
        except (TypeError, ValueError, RuntimeError):
            pass  # _real_tensor says what is expected
    inv_freq = _real_tensor(inv_freq, "inv_freq")
    if inv_freq.shape != (dim // 2,):
        raise ValueError(f"inv_freq must have shape ({dim // 2},) for head_dim {dim}, got {tuple(inv_freq.shape)}")
    return inv_freq


def _angles(pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    device = _angle_device(pos.device)
    return pos.to(device=device, dtype=torch.float64)[..., None] * inv_freq.to(device=device, dtype=torch.float64)


def _cos_sin_tables(pos, inv_freq, interleaved, dtype, device) -> Tuple[torch.Tensor, torch.Tensor]:
    angles = _angles(pos, inv_freq)  # (..., d/2) float64
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


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
        ``(cos, sin)``, each ``(..., dim)`` in ``dtype`` (floating point) on ``device``.
    """
    pos = _real_tensor(positions, "positions")
    return _cos_sin_tables(pos, _freqs(dim, base, inv_freq), check_bool("interleaved", interleaved),
                           _float_dtype(dtype), _device(device, pos.device))


def apply_rope(
    x: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    base: float = 10000.0,
    interleaved: bool = False,
    *,
    inv_freq: Optional[torch.Tensor] = None,
    layout: str = "bhsd",
) -> torch.Tensor:
    """Rotate the last dimension of ``x`` by its positions (RoFormer Eq. 34).

    ``out = x * cos(m theta) + rotate(x) * sin(m theta)``, the element-wise form
    of multiplying each channel pair by a 2x2 rotation matrix.

    Args:
        x: ``(..., seq, dim)`` floating-point queries or keys (``dim`` even),
            e.g. ``(batch, heads, seq, head_dim)``, or both stacked as
            ``(2, batch, heads, seq, head_dim)`` (a scheme's ``rotate`` hook).
        positions: ``(seq,)``, ``(batch, seq)`` (4-D or stacked 5-D ``x``:
            every head alike) or broadcastable to ``x.shape[:-1]`` without
            enlarging ``x`` (the module docstring has the rule); default
            ``0 .. seq-1``. Fractional positions are allowed (position interpolation).
        base: RoPE base (10000 in RoFormer; Llama 3 uses 500000).
        interleaved: pair channels ``(2i, 2i+1)`` (RoFormer) instead of
            ``(i, i + dim/2)`` (GPT-NeoX / Llama).
        inv_freq: custom frequencies, overriding ``base``.
        layout: ``"bhsd"`` (``x`` ends in ``(seq, dim)``) or ``"bshd"`` (``x`` is
            ``(..., seq, heads, dim)``). It cannot be read off the shape: a ``(batch,
            seq, heads, dim)`` tensor passed as ``"bhsd"`` is rotated wrongly, silently.

    Returns:
        tensor of the same shape and dtype as ``x``.

    A scheme of your own rotates with explicit ids the same way: see
    :meth:`posenc.PositionScheme.rotate`.
    """
    x = _float_tensor(x, "x")
    if check_layout(layout) == "bshd":  # rotated as (..., heads, seq, dim), and back
        if x.ndim < 3:
            raise ValueError(f"layout='bshd' expects x of shape (..., seq, heads, dim), got {tuple(x.shape)}")
        return apply_rope(x.transpose(-3, -2), positions, base, interleaved, inv_freq=inv_freq).transpose(-3, -2)
    if x.ndim < 2:
        raise ValueError(f"apply_rope expects x of shape (..., seq, dim), got {tuple(x.shape)}")
    seq, dim = x.shape[-2], x.shape[-1]
    _check_rope_dim(dim)
    inv_freq = _freqs(dim, base, inv_freq)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    else:
        positions = _align_positions(_real_tensor(positions, "positions"), x.shape[:-2], seq).to(x.device)
    interleaved = check_bool("interleaved", interleaved)
    cos, sin = _cos_sin_tables(positions, inv_freq, interleaved, x.dtype, x.device)  # (..., seq, dim)
    return _rotate(x, cos, sin, interleaved)


def rope_rotation_matrix(
    position: float, dim: int, base: float = 10000.0, interleaved: bool = False
) -> torch.Tensor:
    """The block-diagonal rotation matrix ``R_m`` of RoFormer Eq. 15, explicitly.

    ``apply_rope(x, m) == x @ R_m.T`` for a row vector ``x``; this O(d^2) form is
    for teaching and testing, :func:`apply_rope` is the O(d) one.

    Returns:
        ``(dim, dim)`` float64 orthogonal matrix.
    """
    angles = rope_angles(torch.tensor(check_number("position", position), dtype=torch.float64), dim, base)  # (d/2,)
    interleaved = check_bool("interleaved", interleaved)
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

    The last dimension holds the channels of one head. To convert a checkpoint
    trained with interleaved RoPE, apply it per head to the output channels of
    the query and key projection weights: view a weight of shape
    ``(H * d_head, d_in)`` as ``(H, d_head, d_in)`` and permute the ``d_head``
    axis (permuting all ``H * d_head`` rows at once would mix the heads). The
    converted weights produce the same attention scores under half-split RoPE.

    >>> W = torch.arange(8.0)[:, None]           # (H * d_head, d_in): 2 heads of 4 channels, d_in = 1
    >>> per_head = interleaved_to_half_split(W.view(2, 4, 1).transpose(1, 2))
    >>> per_head.transpose(1, 2).reshape(8, 1).flatten().tolist()
    [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
    """
    x = _channels(x)
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def half_split_to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleaved_to_half_split`: ``[a0, a1, ..., b0, b1, ...]`` to ``[a0, b0, a1, b1, ...]``.

    Like it, it permutes the channels of one head: convert a checkpoint's query
    and key weights per head, on each weight viewed as ``(H, d_head, d_in)``.
    """
    first, second = _channels(x).chunk(2, dim=-1)
    return torch.stack((first, second), dim=-1).flatten(-2)


def _channels(x: torch.Tensor) -> torch.Tensor:
    x = _tensor(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have a last dimension of channels (..., dim), got a single number")
    _check_rope_dim(x.shape[-1])
    return x


def rope_decay_bound(
    distances: torch.Tensor,
    dim: int,
    base: float = 10000.0,
    *,
    inv_freq: Optional[torch.Tensor] = None,
    normalize: bool = False,
) -> torch.Tensor:
    """The long-range decay curve of RoPE from Abel summation (Su, 2021).

    With ``h_i = q_[2i:2i+2] k_[2i:2i+2]^*`` and
    ``S_j = sum_{k<j} exp(i r theta_k)`` (``r`` the relative distance),

    .. math:: \\Big|\\sum_i h_i e^{i r \\theta_i}\\Big|
              \\le \\max_i |h_{i+1} - h_i| \\sum_{j=1}^{d/2} |S_j|,

    so ``(1 / (d/2)) * sum_{j=1}^{d/2} |S_j|`` measures how large a score can
    be at distance ``r``. At ``r = 0`` it equals ``(d/2 + 1) / 2``.

    Args:
        distances: ``(...,)`` relative distances.
        dim: head dimension (even).
        base: RoPE base (ignored when ``inv_freq`` is given).
        inv_freq: custom ``(dim // 2,)`` frequencies.
        normalize: divide by the value at distance 0, so the curve starts at 1.

    Returns:
        ``(...,)`` float64 tensor.
    """
    distances = _real_tensor(distances, "distances").detach().cpu().to(torch.float64)
    normalize = check_bool("normalize", normalize)
    angles = _angles(distances, _freqs(dim, base, inv_freq))  # (..., d/2)
    partial_sums = torch.polar(torch.ones_like(angles), angles).cumsum(dim=-1)  # S_1 .. S_{d/2}
    bound = partial_sums.abs().mean(dim=-1)
    if normalize:
        bound = bound / ((dim // 2 + 1) / 2)
    return bound


class RotaryEmbedding(nn.Module):
    """RoPE as a module: caches cos/sin and rotates ``q`` and ``k`` together.

    ``forward(q, k)`` equals ``(apply_rope(q, ...), apply_rope(k, ...))`` with
    the same frequencies and layout. The cos/sin tables are computed in
    float64, cast to the input's dtype and cached per ``(device, dtype)``;
    a table is rebuilt only when a longer sequence arrives (shorter ones use
    its first rows, which are the same numbers).

    Args:
        dim: head dimension (even).
        base: RoPE base (ignored when ``inv_freq`` is given).
        interleaved: pair channels ``(2i, 2i+1)`` instead of ``(i, i + dim/2)``.
        inv_freq: custom ``(dim // 2,)`` frequencies, e.g. from
            :func:`posenc.rope_frequencies_yarn`.
        attention_factor: multiplies cos and sin (hence the logits by its
            square); :func:`posenc.yarn_attention_factor` for YaRN, 1 otherwise.

    Shapes:
        ``q``: ``(..., q_len, dim)``, ``k``: ``(..., k_len, dim)`` (floating
        point) with ``q_len <= k_len``; queries sit at the last ``q_len`` key
        positions (decoding with a cache). ``positions``: key positions
        ``(k_len,)``, ``(batch, k_len)`` (4-D ``q``/``k``: every head alike) or
        broadcastable as in :func:`apply_rope`; default ``0 .. k_len - 1``.

    Arguments are checked here, at construction. Tables cached under
    ``torch.inference_mode()`` are ordinary tensors, so they serve training later.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        *,
        interleaved: bool = False,
        inv_freq: Optional[torch.Tensor] = None,
        attention_factor: float = 1.0,
    ) -> None:
        super().__init__()
        dim = _check_rope_dim(dim)
        self.dim, self.base, self.interleaved = dim, _check_base(base), check_bool("interleaved", interleaved)
        self.attention_factor = check_number("attention_factor", attention_factor, 0)
        with torch.inference_mode(False):  # built under inference_mode, it must still serve autograd
            # A plain attribute, not a buffer: module.half() / .to(dtype) must not round it.
            self.inv_freq = _freqs(dim, base, inv_freq).detach().to("cpu", torch.float64).clone()
        self._cache: Dict[Tuple[torch.device, torch.dtype], Tuple[torch.Tensor, torch.Tensor]] = {}

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, base={self.base:g}, interleaved={self.interleaved}, "
                f"attention_factor={self.attention_factor:g}")

    def _table(self, positions: torch.Tensor, device: torch.device, dtype: torch.dtype):
        # angles in float64, cast once to the input's dtype
        cos, sin = _cos_sin_tables(positions, self.inv_freq, self.interleaved, dtype, device)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def cos_sin(
        self, seq_len: int, device: Optional[torch.device] = None, dtype: torch.dtype = torch.float32
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` for positions ``0 .. seq_len - 1``, each ``(seq_len, dim)``.

        Copies of the cached tables: writing into them leaves later rotations alone.
        """
        seq_len = check_int("seq_len", seq_len, low=0)
        cos, sin = self._cos_sin(seq_len, _device(device, torch.device("cpu")), _float_dtype(dtype))
        return cos.clone(), sin.clone()

    def _cos_sin(self, seq_len: int, device: torch.device, dtype: torch.dtype):
        """The cached tables themselves (views, no copy): for this module's own rotations only."""
        key = (device, dtype)
        cached = self._cache.get(key)
        if cached is None or cached[0].shape[0] < seq_len:
            with torch.inference_mode(False):  # a cache filled under inference_mode must serve autograd later
                cached = self._table(torch.arange(seq_len, dtype=torch.float64), device, dtype)
            self._cache[key] = cached
        return cached[0][:seq_len], cached[1][:seq_len]

    def rotate_stacked(self, qk: torch.Tensor) -> torch.Tensor:
        """Rotate queries and keys stacked as ``(2, ..., seq, dim)`` (self-attention: equal lengths).

        The same as ``torch.stack(self(qk[0], qk[1]))`` in one pass over both,
        which saves half of the small element-wise operations of a tiny model.
        """
        qk = _float_tensor(qk, "qk")
        if qk.ndim < 3 or qk.shape[0] != 2 or qk.shape[-1] != self.dim:
            raise ValueError(f"qk must be (2, ..., seq, {self.dim}), got {tuple(qk.shape)}")
        cos, sin = self._cos_sin(qk.shape[-2], qk.device, qk.dtype)
        return _rotate(qk, cos, sin, self.interleaved)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rotated ``(q, k)``, same shapes and dtypes."""
        q, k = _float_tensor(q, "q"), _float_tensor(k, "k")
        if q.ndim < 2 or k.ndim < 2 or q.shape[-1] != self.dim or k.shape[-1] != self.dim:
            raise ValueError(
                f"q and k must be (..., seq, {self.dim}); got {tuple(q.shape)} and {tuple(k.shape)}"
            )
        q_len, k_len = q.shape[-2], k.shape[-2]
        if q_len > k_len:
            raise ValueError(f"q_len ({q_len}) must be <= k_len ({k_len}): queries are the last key positions")
        if positions is None:
            k_cos, k_sin = self._cos_sin(k_len, k.device, k.dtype)
            q_cos, q_sin = self._cos_sin(k_len, q.device, q.dtype)
            q_cos, q_sin = q_cos[k_len - q_len:], q_sin[k_len - q_len:]
        else:
            positions = _real_tensor(positions, "positions")
            k_pos = _align_positions(positions, k.shape[:-2], k_len, "key length", "k")
            q_pos = _align_positions(positions, q.shape[:-2], k_len, "key length", "q")[..., k_len - q_len:]
            k_cos, k_sin = self._table(k_pos, k.device, k.dtype)
            q_cos, q_sin = self._table(q_pos, q.device, q.dtype)
        return _rotate(q, q_cos, q_sin, self.interleaved), _rotate(k, k_cos, k_sin, self.interleaved)
