"""xPos: RoPE with an exponential decay (Sun et al., ACL 2023, "A Length-Extrapolatable Transformer").

RoPE rotates a query at position ``m`` and a key at position ``n`` by ``R_m`` and
``R_n``. xPos additionally *scales* them, with a per-channel-pair factor ``zeta_i`` raised to the position over a scale base
``B``:

.. math::
    q_m \\to R_m q_m\\, \\zeta^{m/B}, \\qquad k_n \\to R_n k_n\\, \\zeta^{-n/B},

(``zeta_i < 1``: queries are scaled down and keys up as the position grows),
so that the score of pair ``i`` is the RoPE score times ``zeta_i^{(m-n)/B}``,
a function of the offset ``m - n`` alone. With ``zeta_i < 1`` it decays with
distance for ``m >= n`` and *grows* for ``m < n``: xPos is meant for causal
attention only.

* ``zeta_i = (2i/d + gamma) / (1 + gamma)``, ``gamma = 0.4``, ``B = 512``
  (the authors' ``torchscale`` code); fast-rotating pairs (small ``i``) decay
  fastest.
* The factors ``zeta^{-n/B}`` of the keys grow exponentially, so positions are
  *centred* (``n - c`` with ``c`` the middle position) before exponentiating:
  the shift cancels in every score and halves the largest exponent.
* At inference the authors add blockwise causal attention (BCA,
  :func:`blockwise_causal_mask`): each query sees its own block of keys and the
  previous one.

Scales and rotations are computed in float64 (float32 on Apple MPS, which has
no float64) and cast back to the input dtype at the end. Inputs follow
:mod:`posenc.rope` (floating-point ``q``/``k``; positions ``(k_len,)``,
``(batch, k_len)`` for 4-D tensors, or broadcastable without enlarging them).
When the sequence is too long for the dtype (no shift keeps every factor
within its normal range: float16 beyond about 7,900 positions at ``B = 512``),
:func:`apply_xpos` and :class:`XPos` raise ``ValueError`` instead of returning
inf/NaN scores.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

from ._validate import check_device as _device
from ._validate import _align_positions, _float_tensor, _real_tensor
from ._validate import check_bool, check_even_dim, check_int, check_number, check_stacked_qk
from .masks import check_lengths, relative_positions
from ._rotation import _rotate
from .rotary import _check_base, _cos_sin_tables, rope_frequencies
from .scheme import PositionScheme, register_scheme

__all__ = [
    "xpos_zeta",
    "xpos_scales",
    "apply_xpos",
    "XPos",
    "blockwise_causal_mask",
    "XPosRotation",
]


def _check_dim(dim: int) -> None:
    check_even_dim(dim, "xPos scales channel pairs: head_dim")


def _check_gamma(gamma: float) -> float:
    return check_number("xPos gamma", gamma, 0)


def _check_scale_base(scale_base: float) -> float:
    return check_number("xPos scale_base", scale_base, 0, inf_ok=True, what=" (math.inf switches the decay off)")


def _check_fits(span: float, gamma: float, scale_base: float, *dtypes: torch.dtype) -> None:
    """``ValueError`` unless the factors of positions spanning ``span``, centred (the best shift: the
    largest is ``zeta_0 ** (-span / 2B)``), lie within the normal range of every dtype."""
    log_factor = span / (2 * scale_base) * math.log((1 + gamma) / gamma)
    for dtype in dtypes:
        info = torch.finfo(dtype)
        limit = min(math.log(info.max), -math.log(info.tiny))
        if log_factor > limit:
            longest = math.floor(2 * scale_base * limit / math.log((1 + gamma) / gamma))
            raise ValueError(
                f"xPos factors for positions spanning {span:g} reach 1e{log_factor / math.log(10):.0f}, beyond "
                f"{dtype}'s range: the scores would be inf/NaN. At scale_base={scale_base:g}, {dtype} holds a "
                f"span of at most {longest:,}; use float32 or bfloat16, a larger scale_base or shorter sequences")


def _work(device: torch.device) -> Tuple[torch.device, torch.dtype]:
    """float64 wherever it exists; Apple MPS has none, float32 is used there."""
    if device.type == "mps":
        return device, torch.float32
    return device, torch.float64


def xpos_zeta(dim: int, gamma: float = 0.4) -> torch.Tensor:
    """Per-pair decay bases ``zeta_i = (2i/d + gamma) / (1 + gamma)``, ``i = 0 .. d/2 - 1``.

    Sun et al. (2023); the same numbers as the authors' ``torchscale`` code,
    ``(arange(0, d, 2) + gamma d) / ((1 + gamma) d)``. They increase from
    ``gamma / (1 + gamma)`` (0.2857 for ``gamma = 0.4``) towards 1.

    Returns:
        ``(dim // 2,)`` float64 tensor, every entry in ``(0, 1)``.

    >>> xpos_zeta(4, gamma=1.0).tolist()
    [0.5, 0.75]
    """
    _check_dim(dim)
    gamma = _check_gamma(gamma)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)
    return (two_i / dim + gamma) / (1.0 + gamma)


def _center(positions: torch.Tensor) -> torch.Tensor:
    """Midpoint of the positions along the last dimension, kept for broadcasting."""
    return (positions.amax(dim=-1, keepdim=True) + positions.amin(dim=-1, keepdim=True)) / 2


def xpos_scales(
    positions: torch.Tensor,
    dim: int,
    gamma: float = 0.4,
    scale_base: float = 512,
    centered: bool = True,
    *,
    interleaved: bool = False,
    center: Optional[float] = None,
) -> torch.Tensor:
    """Per-position, per-channel xPos factors ``zeta_i ** ((pos - c) / scale_base)``.

    Queries are multiplied by these factors and keys divided by them
    (:func:`apply_xpos`). The shift ``c`` cancels in every query-key score, so
    it only matters numerically: with ``centered=True`` it is the midpoint of
    ``positions`` (``(min + max) / 2`` along the last dimension), which halves
    the largest exponent compared with ``c = 0`` (``centered=False``).

    Args:
        positions: ``(..., seq)`` positions (any real values).
        dim: head dimension (even).
        gamma: ``gamma`` of :func:`xpos_zeta` (0.4 in the paper).
        scale_base: ``B`` (512 in the paper); ``math.inf`` gives factors of 1 (plain RoPE).
        centered: subtract the midpoint of ``positions`` before exponentiating.
        interleaved: lay the ``dim/2`` factors out as ``[z0, z0, z1, z1, ...]``
            (pairs ``(2i, 2i+1)``) instead of ``[z0, z1, ..., z0, z1, ...]``
            (half-split pairs ``(i, i + dim/2)``), matching
            :func:`posenc.apply_rope`.
        center: an explicit shift ``c``, overriding ``centered``.

    Returns:
        ``(..., seq, dim)`` float64 tensor (float32 on MPS), on the device of
        ``positions``.
    """
    zeta = xpos_zeta(dim, gamma)
    scale_base = _check_scale_base(scale_base)
    positions = _real_tensor(positions, "positions")
    if positions.ndim == 0:
        raise ValueError("positions must have at least one dimension (..., seq), got a single number")
    center = None if center is None else check_number("center", center)
    centered, interleaved = check_bool("centered", centered), check_bool("interleaved", interleaved)
    scale = _scales(positions, zeta, scale_base, centered, center, interleaved)
    if scale.device.type != "meta" and not bool(((scale > 0) & (scale < math.inf)).all()):
        raise ValueError(f"xPos factors overflow {scale.dtype}'s range (0 or inf): positions too far from the "
                         "centre for this gamma and scale_base")
    return scale


def _scales(positions, zeta, scale_base, centered, center, interleaved) -> torch.Tensor:
    device, work = _work(positions.device)
    pos = positions.to(device=device, dtype=work)
    if center is not None:
        pos = pos - center
    elif centered and pos.shape[-1]:
        pos = pos - _center(pos)
    exponent = pos[..., None] / scale_base  # (..., seq, 1)
    scale = zeta.to(device=device, dtype=work) ** exponent  # (..., seq, dim/2)
    if interleaved:
        return scale.repeat_interleave(2, dim=-1)
    return torch.cat((scale, scale), dim=-1)


def _xpos_tables(
    positions: torch.Tensor,
    dim: int,
    base: float,
    gamma: float,
    scale_base: float,
    interleaved: bool,
    centered: bool,
    device: torch.device,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos, sin and scale, each ``(..., k_len, dim)`` in the working dtype on ``device``."""
    device, work = _work(device)
    positions = positions.to(device)
    cos, sin = _cos_sin_tables(positions, rope_frequencies(dim, base), interleaved, work, device)
    scale = _scales(positions, xpos_zeta(dim, gamma), scale_base, centered, None, interleaved)
    return cos, sin, scale.to(device=device, dtype=work)


def _apply_tables(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: torch.Tensor,
    interleaved: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    first = cos.shape[-2] - q.shape[-2]  # queries are the last q_len key positions
    work = cos.dtype
    qw, kw = q.to(work), k.to(work)
    q_out = _rotate(qw, cos[..., first:, :], sin[..., first:, :], interleaved) * scale[..., first:, :]
    k_out = _rotate(kw, cos, sin, interleaved) / scale
    return q_out.to(q.dtype), k_out.to(k.dtype)


def _span(positions: torch.Tensor) -> float:
    """The largest ``max - min`` of a row of positions (0 on the meta device, which holds no values)."""
    if positions.device.type == "meta" or not positions.numel():
        return 0.0
    return float((positions.amax(dim=-1) - positions.amin(dim=-1)).max())


def _check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.ndim < 2 or k.ndim < 2:
        raise ValueError(
            f"q and k must be (..., seq, head_dim); got shapes {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim; got {q.shape[-1]} and {k.shape[-1]}")
    _check_dim(q.shape[-1])
    if q.shape[-2] > k.shape[-2]:
        raise ValueError(
            f"q_len ({q.shape[-2]}) must be <= k_len ({k.shape[-2]}): "
            "queries are the last q_len key positions"
        )


def apply_xpos(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    *,
    base: float = 10000.0,
    gamma: float = 0.4,
    scale_base: float = 512,
    interleaved: bool = False,
    centered: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by RoPE, then scale them by ``zeta^(+-position / B)`` (xPos).

    ``q'_m = R_m q_m * zeta^((m - c)/B)`` and ``k'_n = R_n k_n / zeta^((n - c)/B)``
    channel-pair-wise, so that

    .. math:: q'_m \\cdot k'_n = \\sum_i \\zeta_i^{(m-n)/B}\\,
              \\big[(R_m q_m) \\cdot (R_n k_n)\\big]_{\\text{pair } i},

    every RoPE pair score damped by ``zeta_i^{(m-n)/B}`` (Sun et al., 2023).
    Only causal attention (``m >= n``) should use these scores: for
    ``m < n`` the factors exceed 1 and grow exponentially.

    Args:
        q: ``(..., q_len, head_dim)`` floating-point queries, e.g. ``(batch, heads, q_len, head_dim)``.
        k: ``(..., k_len, head_dim)`` keys, ``k_len >= q_len``; queries sit at
            the last ``q_len`` key positions (decoding with a cache).
        positions: key positions ``(k_len,)``, ``(batch, k_len)`` (4-D: every
            head alike) or broadcastable as in :func:`posenc.apply_rope`;
            default ``0 .. k_len-1``.
        base: RoPE base.
        gamma, scale_base: see :func:`xpos_zeta` and :func:`xpos_scales`;
            ``scale_base=math.inf`` gives plain RoPE.
        interleaved: RoPE pair layout (see :func:`posenc.apply_rope`).
        centered: shift positions by their midpoint before exponentiating
            (exact in the scores, and it keeps 64k positions finite in float32).

    Returns:
        ``(q', k')`` with the shapes and dtypes of ``q`` and ``k``. The work is
        done in float64 and cast back. ``ValueError`` when even centred factors
        leave the dtype's range (float16 beyond about 7,900 positions at
        ``B = 512``); with ``centered=False`` entries that do not fit become
        ``inf`` (uncentred float16 keys beyond about 4,500 positions, for
        example), as do scores of far *future* keys, whose exact values are huge.
    """
    q, k = _float_tensor(q, "q"), _float_tensor(k, "k")
    _check_qk(q, k)
    base, gamma, scale_base = _check_base(base), _check_gamma(gamma), _check_scale_base(scale_base)
    centered, interleaved = check_bool("centered", centered), check_bool("interleaved", interleaved)
    k_len, dim = k.shape[-2], k.shape[-1]
    if positions is None:
        positions, span = torch.arange(k_len, device=k.device), max(k_len - 1, 0)
    else:
        positions = _align_positions(_real_tensor(positions, "positions"), k.shape[:-2], k_len, "key length", "k")
        _align_positions(positions, q.shape[:-2], k_len, "key length", "q")  # the query rows must fit too
        span = _span(positions)
        positions = positions.to(k.device)
    _check_fits(span, gamma, scale_base, q.dtype, k.dtype, _work(k.device)[1])
    cos, sin, scale = _xpos_tables(
        positions, dim, base, gamma, scale_base, interleaved, centered, k.device
    )
    return _apply_tables(q, k, cos, sin, scale, interleaved)


class XPos(nn.Module):
    """xPos as a module: :func:`apply_xpos` with the tables of the default positions cached.

    Args:
        head_dim: even head dimension.
        base, gamma, scale_base, interleaved, centered: as in :func:`apply_xpos`.

    ``forward(q, k, positions=None)`` returns ``(q', k')``. Tables for
    positions ``0 .. k_len-1`` are kept per ``(k_len, device)``; the shift
    ``c`` depends on ``k_len``, so apply the module to the whole key sequence
    (cached *un-rotated* keys included) at every step. Arguments are checked
    here, at construction; tables cached under ``torch.inference_mode()`` are
    ordinary tensors, so they serve training later.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        gamma: float = 0.4,
        scale_base: float = 512,
        interleaved: bool = False,
        centered: bool = True,
    ) -> None:
        super().__init__()
        _check_dim(head_dim)
        _check_scale_base(scale_base)
        self.head_dim, self.base, self.gamma = head_dim, _check_base(base), _check_gamma(gamma)
        self.scale_base = scale_base
        self.interleaved, self.centered = check_bool("interleaved", interleaved), check_bool("centered", centered)
        self._cache: Dict[Tuple[Any, ...], Tuple[torch.Tensor, ...]] = {}

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base:g}, gamma={self.gamma:g}, "
            f"scale_base={self.scale_base}, interleaved={self.interleaved}, "
            f"centered={self.centered}"
        )

    def tables(self, k_len: int, device: Optional[torch.device] = None):
        """``(cos, sin, scale)`` for positions ``0 .. k_len-1``, each ``(k_len, head_dim)`` in float64.

        Copies of the cached tables: writing into them leaves later rotations alone.
        """
        k_len = check_int("k_len", k_len, low=0)
        return tuple(t.clone() for t in self._tables(k_len, _device(device, torch.device("cpu"))))

    def _tables(self, k_len: int, device: torch.device):
        """The cached tables themselves (no copy): for this module's own rotations only."""
        key = (k_len, str(device))
        if key not in self._cache:
            if len(self._cache) >= 8:
                self._cache.clear()
            with torch.inference_mode(False):  # a cache filled under inference_mode must serve autograd later
                self._cache[key] = _xpos_tables(
                    torch.arange(k_len, device=device), self.head_dim, self.base, self.gamma,
                    self.scale_base, self.interleaved, self.centered, device,
                )
        return self._cache[key]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(q', k')`` as :func:`apply_xpos` gives them, same shapes and dtypes."""
        q, k = _float_tensor(q, "q"), _float_tensor(k, "k")
        _check_qk(q, k)
        if k.shape[-1] != self.head_dim:
            raise ValueError(f"expected head_dim {self.head_dim}, got {k.shape[-1]}")
        if positions is not None:
            return apply_xpos(
                q, k, positions, base=self.base, gamma=self.gamma, scale_base=self.scale_base,
                interleaved=self.interleaved, centered=self.centered,
            )
        k_len = k.shape[-2]
        _check_fits(max(k_len - 1, 0), self.gamma, self.scale_base, q.dtype, k.dtype, _work(k.device)[1])
        cos, sin, scale = self._tables(k_len, k.device)
        fused = self._fused_tables(cos, sin, scale, q.dtype) if q.dtype == k.dtype else None
        if fused is None:  # scales too extreme for q's dtype: work in the tables' float64
            return _apply_tables(q, k, cos, sin, scale, self.interleaved)
        q_cos, q_sin, k_cos, k_sin = fused  # (k_len, head_dim) each
        first = k_len - q.shape[-2]
        return _rotate(q, q_cos[first:], q_sin[first:], self.interleaved), _rotate(k, k_cos, k_sin, self.interleaved)

    def rotate_stacked(self, qk: torch.Tensor) -> torch.Tensor:
        """Queries and keys stacked as ``(2, ..., seq, head_dim)`` (equal lengths), in one pass.

        The same as ``torch.stack(self(qk[0], qk[1]))``.
        """
        qk = _float_tensor(qk, "qk")
        if qk.ndim < 3 or qk.shape[0] != 2 or qk.shape[-1] != self.head_dim:
            raise ValueError(f"qk must be (2, ..., seq, {self.head_dim}), got {tuple(qk.shape)}")
        _check_fits(max(qk.shape[-2] - 1, 0), self.gamma, self.scale_base, qk.dtype, _work(qk.device)[1])
        cos, sin, scale = self._tables(qk.shape[-2], qk.device)
        fused = self._fused_tables(cos, sin, scale, qk.dtype)
        if fused is None:
            return torch.stack(self(qk[0], qk[1]))
        q_cos, q_sin, k_cos, k_sin = fused
        shape = (2,) + (1,) * (qk.ndim - 3) + tuple(q_cos.shape)  # (2, 1.., seq, head_dim)
        both_cos = torch.stack((q_cos, k_cos)).view(shape)
        both_sin = torch.stack((q_sin, k_sin)).view(shape)
        return _rotate(qk, both_cos, both_sin, self.interleaved)

    def _fused_tables(self, cos, sin, scale, dtype):
        """``cos * s, sin * s, cos / s, sin / s`` in ``dtype``, cached, when every factor is safe there.

        Folding the scale into the rotation tables makes xPos cost what RoPE
        costs: two multiplications and an addition per element, in the input's
        dtype. Safe means within ``[sqrt(tiny), sqrt(max)]`` of ``dtype`` (no
        overflow or subnormal in either factor of a logit); at long lengths the
        float64 path is used instead (and on the meta device, which holds no values).
        """
        key = ("fused", cos.shape[0], str(cos.device), dtype)
        if key not in self._cache:
            if cos.device.type == "meta":
                return None
            info = torch.finfo(dtype)
            low, high = math.sqrt(info.tiny), math.sqrt(info.max)
            if scale.numel() and not (scale.min() >= low and scale.max() <= high and (1 / scale).min() >= low
                                      and (1 / scale).max() <= high):
                return None
            if len(self._cache) >= 16:
                self._cache.clear()
            with torch.inference_mode(False):  # a cache filled under inference_mode must serve autograd later
                self._cache[key] = tuple(t.to(dtype) for t in (cos * scale, sin * scale, cos / scale, sin / scale))
        return self._cache[key]


def blockwise_causal_mask(
    q_len: int,
    k_len: Optional[int] = None,
    *,
    block: int,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Blockwise causal attention (BCA), the inference-time mask of Sun et al. (2023).

    Key positions are cut into blocks of ``block`` tokens (block ``b`` holds
    positions ``b*block .. (b+1)*block - 1``). A query in block ``b`` may attend
    to keys of blocks ``b - 1`` and ``b`` that are not after it, so it sees
    between ``block + 1`` and ``2 * block`` keys (fewer in the first block). The paper
    uses ``block`` = half the training length at inference.

    Query ``i`` sits at key position ``i + k_len - q_len`` (bottom-right alignment).

    Returns:
        ``(q_len, k_len)`` bool tensor, True = may attend.

    >>> blockwise_causal_mask(6, block=2).int()
    tensor([[1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1, 1]], dtype=torch.int32)
    """
    block = check_int("block", block)
    k_len = check_lengths(q_len, k_len)
    device = _device(device, None)
    rel = relative_positions(q_len, k_len, device=device)  # j - i_pos
    q_block = torch.arange(k_len - q_len, k_len, device=device) // block  # (q_len,)
    k_block = torch.arange(k_len, device=device) // block  # (k_len,)
    near = k_block[None, :] >= q_block[:, None] - 1
    return near & (rel <= 0)


@register_scheme("xpos")
class XPosRotation(PositionScheme):
    """xPos as a position scheme (Sun et al., 2023): RoPE times ``zeta^((i - j) / scale_base)``.

    Args:
        base, gamma, scale_base: as in :func:`apply_xpos` (``scale_base`` 512 in the paper).

    Shapes: ``rotate(qk)``: ``(2, batch, heads, seq, head_dim)``, ``head_dim`` even.
    """

    name = "xpos"

    def __init__(self, base: float = 10000.0, *, scale_base: float = 512.0, gamma: float = 0.4) -> None:
        super().__init__()
        self.base, self.gamma = _check_base(base), _check_gamma(gamma)
        self.scale_base = _check_scale_base(scale_base)
        self._xpos: Optional[XPos] = None

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self._require_even_head_dim()
        self._xpos = XPos(self.head_dim, self.base, gamma=self.gamma, scale_base=self.scale_base)

    def rotate(self, qk: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._require_bound(self._xpos)
        check_stacked_qk(self, qk, positions)
        if positions is not None:  # (batch, seq) ids
            return torch.stack(self._xpos(qk[0], qk[1], positions))
        return self._xpos.rotate_stacked(qk)
