"""KERPLE: ALiBi's linear penalty generalised to two learned parameters per head (Chi et al., NeurIPS 2022).

"KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation"
replaces ALiBi's ``-m|i - j|`` by a conditionally positive definite kernel
with two positive parameters per head, learned with the model:

.. math::
    b_{\\text{power}}(m, n) = -r_1 |m - n|^{r_2} \\quad (r_1 > 0,\\ 0 < r_2 \\le 2),
    \\qquad
    b_{\\log}(m, n) = -r_1 \\log(1 + r_2 |m - n|) \\quad (r_1, r_2 > 0).

Every function here returns an additive position bias of shape
``(heads, q_len, k_len)`` that goes into the attention logits after the
``1/sqrt(d)`` scale (``pe.attention(q, k, v, bias=...)``). Offsets come from
:func:`posenc.masks.relative_positions`, so when ``k_len > q_len`` the queries
are the last ``q_len`` key positions (bottom-right alignment, as for ALiBi).
The bias is symmetric in ``|m - n|``: combine it with a causal mask
(``pe.attention(..., causal=True)``) for a language model.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from ._validate import at_least_float32, check_int, check_number
from ._validate import check_device as _device
from ._validate import check_float_dtype as _float_dtype
from .masks import _as_tensor, _by_distance, _finite, relative_positions
from .scheme import PositionScheme, register_scheme

__all__ = ["kerple_power_bias", "kerple_log_bias", "KerpleBias", "Kerple"]

ParamLike = Union[float, torch.Tensor]


def _as_head_params(r1: ParamLike, r2: ParamLike) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two per-head parameter vectors of one length, float, on one device."""
    out = []
    # a number or a list next to a floating tensor takes that tensor's dtype directly (not rounded through float32)
    like = next((v.dtype for v in (r1, r2) if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
    for name, value in (("r1", r1), ("r2", r2)):
        plain = not isinstance(value, (torch.Tensor, np.ndarray, np.generic))
        t = _as_tensor(name, value, dtype=like if plain else None)  # numbers, NumPy, integer tensors; bool refused
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1 or t.numel() == 0:
            raise ValueError(f"{name} must be a scalar or a non-empty (heads,) tensor, got shape {tuple(t.shape)}")
        out.append(t)
    a, b = out
    if a.device != b.device:
        raise ValueError(f"r1 and r2 must be on one device, got {a.device} and {b.device}")
    if a.numel() != b.numel():
        if a.numel() == 1:
            a = a.expand(b.numel())
        elif b.numel() == 1:
            b = b.expand(a.numel())
        else:
            raise ValueError(f"r1 and r2 must have the same number of heads, got {a.numel()} and {b.numel()}")
    dtype = torch.promote_types(a.dtype, b.dtype)
    return a.to(dtype), b.to(dtype)


def _check_values(r1: torch.Tensor, r2: torch.Tensor, r2_max: Optional[float], kernel: str) -> None:
    # Ranges only for plain tensors: a learned parameter is kept in range by KerpleBias
    # (clamping), and checking it here would force a device sync every step. NaN: on the CPU.
    if r1.requires_grad or r2.requires_grad or r1.device.type == "meta":
        for name, t in (("r1", r1), ("r2", r2)):
            _finite(name, t)
        return
    if not bool(torch.isfinite(r1).all()) or not bool((r1 > 0).all()):
        raise ValueError(f"KERPLE {kernel} kernel needs r1 > 0 for every head, got {r1.tolist()}")
    r2_ok = torch.isfinite(r2) & (r2 > 0)
    if r2_max is not None:
        r2_ok &= r2 <= r2_max
    if not bool(r2_ok.all()):
        bound = f"0 < r2 <= {r2_max:g}" if r2_max is not None else "r2 > 0"
        raise ValueError(f"KERPLE {kernel} kernel needs {bound} for every head, got {r2.tolist()}")


def _distances(q_len: int, k_len: Optional[int], like: torch.Tensor) -> torch.Tensor:
    """``(q, k)`` distances ``|m - n|``, in ``like``'s dtype, or float32 for half precision (float16 holds no
    distance above 65504, bfloat16 rounds those above 256): the kernel is then computed in float32."""
    return relative_positions(q_len, k_len, device=like.device).abs().to(at_least_float32(like.dtype))


def kerple_power_bias(r1: ParamLike, r2: ParamLike, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
    """KERPLE power kernel ``-r1 * |m - n| ** r2`` for every head (Chi et al., 2022, Eq. 8).

    With ``r2 = 1`` it is ALiBi with slope ``r1``; ``r2 < 1`` flattens the
    penalty at long range, ``r2 > 1`` steepens it. ``-|m - n|^p`` is a
    conditionally positive definite kernel only for ``0 < p <= 2``, hence the bound.

    Args:
        r1: ``(heads,)`` tensor (or a number for one head), ``r1 > 0``.
        r2: ``(heads,)`` tensor (or a number), ``0 < r2 <= 2``. A length-1
            ``r1`` or ``r2`` is broadcast to the other's number of heads.
        q_len, k_len: query and key lengths (``k_len >= q_len``, default ``q_len``).

    Returns:
        ``(heads, q_len, k_len)`` tensor in the dtype and on the device of the
        parameters, 0 at distance 0 and negative elsewhere. Autograd flows to
        ``r1`` and ``r2`` (the gradient with respect to ``r2`` is 0 at distance 0).

    Raises:
        ValueError: on bad shapes or lengths; on out-of-range values when
            neither ``r1`` nor ``r2`` requires grad (values of learned
            parameters are not checked: :class:`KerpleBias` clamps them).
    """
    r1, r2 = _as_head_params(r1, r2)
    _check_values(r1, r2, 2.0, "power")
    dist = _distances(q_len, k_len, r1)  # (q, k)
    bias = -r1[:, None, None] * dist.pow(r2[:, None, None])  # (heads, q, k)
    return (bias + 0.0).to(r1.dtype)  # -0.0 -> +0.0 on the diagonal


def kerple_log_bias(r1: ParamLike, r2: ParamLike, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
    """KERPLE logarithmic kernel ``-r1 * log(1 + r2 * |m - n|)`` (Chi et al., 2022, Eq. 9).

    For short distances ``log(1 + x) ~ x``, so it starts like ALiBi with slope
    ``r1 * r2``; at long range the penalty grows only logarithmically.

    Args:
        r1, r2: ``(heads,)`` tensors (or numbers), both ``> 0``.
        q_len, k_len: query and key lengths (``k_len >= q_len``, default ``q_len``).

    Returns:
        ``(heads, q_len, k_len)`` tensor, 0 at distance 0, negative elsewhere,
        differentiable in ``r1`` and ``r2``.

    Raises:
        ValueError: as :func:`kerple_power_bias` (values checked only when
            neither parameter requires grad).
    """
    r1, r2 = _as_head_params(r1, r2)
    _check_values(r1, r2, None, "log")
    dist = _distances(q_len, k_len, r1)  # (q, k)
    bias = -r1[:, None, None] * torch.log1p(r2[:, None, None] * dist)  # (heads, q, k)
    return (bias + 0.0).to(r1.dtype)


class KerpleBias(nn.Module):
    """Learnable KERPLE bias with per-head parameters ``r1``, ``r2``.

    Initialisation follows the authors' code: every head draws its parameters
    uniformly,

    * ``kind="power"`` (``-r1 |m-n|^r2``): ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``;
    * ``kind="log"`` (``-r1 log(1 + r2 |m-n|)``): ``r1 ~ U(0, 2)``, ``r2 ~ U(0, 1)``,

    unless ``r1`` / ``r2`` give explicit starting values. Positivity is kept by
    clamping: at every forward pass (and in :meth:`clamp_parameters`) the stored
    values are projected in place to ``>= eps`` (0.01, as in the authors' code),
    and the power kind's ``r2`` to ``<= 2``. The projection acts on the
    parameters themselves, like a projected-gradient step, so gradients keep
    flowing (a functional ``clamp`` inside the graph would zero them once a
    parameter left the range).

    Args:
        n_heads: number of heads.
        kind: ``"power"`` or ``"log"``.
        r1, r2: optional initial values, numbers or ``(n_heads,)`` tensors (finite).
        eps: lower bound of both parameters.
        generator: optional :class:`torch.Generator` for the random initialisation.
        dtype, device: of the parameters (a floating-point dtype).

    Shapes:
        ``forward(q_len, k_len=None)`` -> ``(n_heads, q_len, k_len)``.
    """

    def __init__(self, n_heads: int, kind: str = "power", *, r1: Optional[ParamLike] = None,
                 r2: Optional[ParamLike] = None, eps: float = 0.01, generator: Optional[torch.Generator] = None,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        super().__init__()
        n_heads = check_int("n_heads", n_heads)
        if kind not in ("power", "log"):
            raise ValueError(f"kind must be 'power' or 'log', got {kind!r}")
        if not 0 < check_number("eps", eps) < 2:
            raise ValueError(f"eps must be in (0, 2), got {eps!r}")
        _float_dtype(dtype)
        device = _device(device)
        self.n_heads, self.kind, self.eps = n_heads, kind, float(eps)
        scale_r1, scale_r2 = (1.0, 2.0) if kind == "power" else (2.0, 1.0)
        self.r1 = nn.Parameter(self._init(r1, scale_r1, "r1", generator, dtype, device))
        self.r2 = nn.Parameter(self._init(r2, scale_r2, "r2", generator, dtype, device))
        self.clamp_parameters()

    def _init(self, value, scale, name, generator, dtype, device) -> torch.Tensor:
        if value is None:
            return (torch.rand(self.n_heads, generator=generator, dtype=dtype) * scale).to(device)
        t = _as_tensor(name, value, dtype=dtype).to(device)
        if t.ndim == 0:
            t = t.expand(self.n_heads)
        if tuple(t.shape) != (self.n_heads,):
            raise ValueError(f"{name} must be a number or a ({self.n_heads},) tensor, got shape {tuple(t.shape)}")
        _finite(name, t, sync=True)
        return t.clone()

    @torch.no_grad()
    def clamp_parameters(self) -> None:
        """Project ``r1``, ``r2`` into their ranges in place (no autograd record)."""
        self.r1.data.clamp_(min=self.eps)
        self.r2.data.clamp_(min=self.eps, max=2.0 if self.kind == "power" else None)

    def forward(self, q_len: int, k_len: Optional[int] = None) -> torch.Tensor:
        self.clamp_parameters()
        fn = kerple_power_bias if self.kind == "power" else kerple_log_bias
        return fn(self.r1, self.r2, q_len, k_len)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, kind={self.kind!r}, eps={self.eps:g}"


class Kerple(PositionScheme):
    """KERPLE as a position scheme: learned ``r1, r2`` per head *and per layer*, as in the authors' code.

    Args:
        kind: ``"power"`` (``-r1 |m-n|^r2``) or ``"log"`` (``-r1 log(1 + r2 |m-n|)``).

    Shapes: ``distance_bias(n)``: ``(n_layers, heads, n)``.
    """

    name = "kerple"

    def __init__(self, kind: str = "log") -> None:
        super().__init__()
        if kind not in ("power", "log"):
            raise ValueError(f"kind must be 'power' or 'log', got {kind!r}")
        self.kind = kind
        self.name = f"kerple_{kind}"
        self.layers: Optional[nn.ModuleList] = None

    def config(self):
        return dict(scheme=f"kerple_{self.kind}")

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        if self.layers is None:
            self.layers = nn.ModuleList(KerpleBias(n_heads, kind=self.kind) for _ in range(n_layers))

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Every layer draws ``r1``, ``r2`` uniformly as in the authors' code (see :class:`KerpleBias`)."""
        s1, s2 = (1.0, 2.0) if self.kind == "power" else (2.0, 1.0)
        for layer in self.layers:
            layer.r1.copy_(torch.rand(self.n_heads, generator=generator) * s1)
            layer.r2.copy_(torch.rand(self.n_heads, generator=generator) * s2)
            layer.clamp_parameters()

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self._require_bound()
        return torch.stack([_by_distance(layer(1, length)) for layer in self.layers]).to(_float_dtype(dtype))


register_scheme("kerple_power", lambda: Kerple("power"))
register_scheme("kerple_log", lambda: Kerple("log"))
