"""Attention layers that a model composes: softmax, linear (1 + elu), NormAttention, DiagAttention, decayed.

Every layer here maps ``x`` ``(batch, seq, d_model)`` to ``(batch, seq,
d_model)``: one projection to queries, keys and values, the heads' mixing,
and an output projection. The layers differ only in the mixing:

=============  =====================================================================
``"softmax"``  causal softmax attention through :func:`posenc.relative_attention`
``"linear"``   kernel linear attention with ``1 + elu`` features and its denominator
               (Katharopoulos et al., 2020; :func:`posenc.linear_attention`)
``"norm"``     TransNormer's NormAttention: no denominator, an RMSNorm instead
               (Qin et al., 2022; :func:`posenc.norm_attention`)
``"diag"``     TransNormer's DiagAttention: softmax inside non-overlapping blocks
               (:func:`posenc.diag_attention`)
``"decay"``    linear attention whose state decays by a fixed rate per head: RetNet's
               retention (Sun et al., 2023; :func:`posenc.decayed_linear_attention`)
``"gated"``    the same with a learned gate per head and step, ``sigmoid(w.x+b)^(1/tau)``
               (GLA's form, Yang et al., 2024; one per head, as Mamba-2)
=============  =====================================================================

and ``"forgetting"`` (FoX) and ``"stick_breaking"``, whose layers live in
:mod:`posenc.forgetting` and :mod:`posenc.stick_breaking` and register here.

Position enters through a :class:`Positions` record that the model fills from
its position scheme (:class:`posenc.PositionScheme`) at every forward pass: a
rotation of queries and keys, ALiBi slopes or a table of biases by distance,
a sliding window, a per-query scale. Softmax layers take all of them; the
other kinds take a rotation only (in linear attention the rotation acts on
the features of the numerator, whose denominator must stay positive; Su,
2021). Used alone, a layer built with ``rope=True`` rotates with
:func:`posenc.apply_rope`.

Tensors inside are ``(batch, heads, seq, head_dim)``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from ._validate import check_bool, check_int, check_number, one_of
from .attention import attention as _softmax_attention
from .attention import relative_attention
from .decay import _decay_value, decay_rates, decayed_attention_weights, decayed_linear_attention, gate_decay
from .linear import _check_eps, _check_method, feature_map, linear_attention, linear_attention_weights
from .masks import _check_tensors
from .rotary import apply_rope
from .sinks import sink_attention, sink_logit_attention
from .ssmax import ssmax_factors
from .transnormer import block_diagonal_mask, diag_attention, norm_attention

__all__ = [
    "ATTENTION_KINDS",
    "Positions",
    "SoftmaxAttention",
    "LinearAttention",
    "NormAttention",
    "DiagAttention",
    "DecayAttention",
    "GatedDecayAttention",
    "attention_layer",
]

#: The attention kinds of :func:`attention_layer` (and ``TinyLM(attention=...)``).
ATTENTION_KINDS = ("softmax", "linear", "norm", "diag", "decay", "gated", "forgetting", "stick_breaking")
#: The gates of ``"gated"`` layers: one per head (Mamba-2's granularity) or one per head and key channel (GLA).
GATE_KINDS = ("head", "channel")


# ---------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------


@dataclass
class Positions:
    """What one attention layer needs to know about positions at the current length ``seq``.

    Attributes:
        rotate: queries and keys stacked ``(2, batch, heads, seq, head_dim)`` -> the same, or None.
        slopes: ``(heads,)`` ALiBi slopes, or None.
        table: ``(heads, seq)`` bias by distance ``0 .. seq-1``, or None.
        window: causal sliding window, or None.
        q_scale: ``(seq, 1)`` factors multiplying the queries (log-n scaling), or None.
        sinks: with a window, the first ``sinks`` keys stay visible to every query
            (:func:`posenc.sink_attention`); 0 for none.
        attend: replaces rotation and softmax: ``attend(q, k, v, window=, sinks=,
            return_weights=)`` on unrotated ``q``, ``k`` (ReRoPE, Self-Extend:
            :meth:`posenc.RoPE.attend`), or None.
        bias: ``(batch or 1, heads, seq, seq)`` logits added by the distances of
            explicit position ids (``-inf`` above the diagonal), instead of
            ``slopes`` / ``table``; or None.
    """

    rotate: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    slopes: Optional[torch.Tensor] = None
    table: Optional[torch.Tensor] = None
    window: Optional[int] = None
    q_scale: Optional[torch.Tensor] = None
    sinks: int = 0
    attend: Optional[Callable[..., Any]] = None
    bias: Optional[torch.Tensor] = None

    @property
    def softmax_only(self) -> bool:
        """True if anything but a rotation is set (only softmax layers can apply it)."""
        return any(x is not None for x in (self.slopes, self.table, self.window, self.q_scale, self.attend,
                                           self.bias)) or self.sinks > 0


def _rotate_pair(pos: Positions, q: torch.Tensor, k: torch.Tensor):
    if pos.rotate is None:
        return q, k
    q, k = pos.rotate(torch.stack((q, k)))
    return q, k


class _MultiHead(nn.Module):
    """Shared projections: ``x (batch, seq, d_model)`` -> heads -> mix -> ``(batch, seq, d_model)``."""

    kind = ""

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, rope: bool = False,
                 rope_base: float = 10000.0, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model)
        n_heads = check_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        causal, rope, bias = check_bool("causal", causal), check_bool("rope", rope), check_bool("bias", bias)
        if rope and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_dim}")
        if not check_number("rope_base", rope_base) > 1 or not 0 <= check_number("dropout", dropout) <= 1:
            raise ValueError(f"need rope_base > 1 and 0 <= dropout <= 1, got {rope_base!r} and {dropout!r}")
        self.causal, self.rope, self.rope_base = causal, rope, float(rope_base)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.drop = nn.Dropout(dropout)

    def _own_positions(self) -> Positions:
        if not self.rope:
            return Positions()
        return Positions(rotate=lambda qk: apply_rope(qk, None, self.rope_base))

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        _check_tensors(x=x)
        w = self.qkv.weight
        if (x.dtype, x.device) != (w.dtype, w.device):
            raise ValueError(f"x is {x.dtype} on {x.device} but the layer's weights are {w.dtype} on {w.device}: "
                             "move one of them (x.to(...) or layer.to(...))")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, seq, {self.d_model}), got {tuple(x.shape)}")
        b, t, _ = x.shape
        return self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, b, h, t, hd)

    def _check_positions(self, pos: Positions) -> Positions:
        if pos.softmax_only and self.kind != "softmax":
            raise ValueError(f"a {self.kind!r} attention layer takes a rotation only; ALiBi slopes, distance "
                             "biases, windows and log-n scaling need softmax attention")
        return pos

    def mix(self, qkv: torch.Tensor, pos: Positions) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def weights(self, qkv: torch.Tensor, pos: Positions) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, x: torch.Tensor, positions: Optional[Positions] = None,
                weights: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """``x`` ``(batch, seq, d_model)`` -> ``(batch, seq, d_model)``.

        ``positions`` default: this layer's own (RoPE if built with ``rope=True``).
        ``weights``: a list to which the layer appends its ``(batch, heads, seq, seq)`` weights.
        """
        pos = self._check_positions(self._own_positions() if positions is None else positions)
        qkv = self._qkv(x)
        y = self.mix(qkv, pos)  # (batch, heads, seq, head_dim)
        if weights is not None:
            weights.append(self.weights(qkv, pos))
        b, t, _ = x.shape
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, self.d_model)))

    def attention_weights(self, x: torch.Tensor, positions: Optional[Positions] = None) -> torch.Tensor:
        """The ``(batch, heads, seq, seq)`` matrix this layer applies to the values for input ``x``."""
        pos = self._check_positions(self._own_positions() if positions is None else positions)
        return self.weights(self._qkv(x), pos)


class SoftmaxAttention(_MultiHead):
    """Multi-head causal softmax attention through :func:`posenc.relative_attention`: the baseline.

    Takes every kind of position: a rotation, ALiBi slopes, a bias by
    distance, a window and log-n scaling (see :class:`Positions`).
    ``sink_logit=True`` adds a learned logit per head (``sink_logits``, zeros
    at first) to every row's normaliser: :func:`posenc.sink_logit_attention`.
    ``ssmax=True`` multiplies ``q_i`` by ``s_h log n_i``, ``s_h`` learned
    (``ssmax_scale``, ones at first): Scalable-Softmax, :mod:`posenc.ssmax`.

    Args:
        d_model, n_heads: model width and number of heads.
        causal: causal mask (non-causal: rotations only).
        rope: used alone, rotate ``q`` and ``k`` with :func:`posenc.apply_rope`.
        bias: biases in the projections.
        dropout: on the output.
    """

    kind = "softmax"

    def __init__(self, d_model: int, n_heads: int, *, sink_logit: bool = False, ssmax: bool = False,
                 **options: Any) -> None:
        super().__init__(d_model, n_heads, **options)
        self.sink_logits: Optional[nn.Parameter] = None
        self.ssmax_scale: Optional[nn.Parameter] = None  # SSMax's s per head (posenc.ssmax), starting at 1
        if (check_bool("sink_logit", sink_logit) or check_bool("ssmax", ssmax)) and not self.causal:
            raise ValueError("sink_logit and ssmax are implemented for causal attention: build it with causal=True")
        if sink_logit:
            self.sink_logits = nn.Parameter(torch.zeros(self.n_heads))
        if ssmax:
            self.ssmax_scale = nn.Parameter(torch.ones(self.n_heads))

    def _inputs(self, qkv: torch.Tensor, pos: Positions):
        if not self.causal and pos.softmax_only:
            raise ValueError("biases, windows and log-n scaling are causal here: build the layer with causal=True")
        # split and unbind, not indexing: their backward assembles qkv's gradient in one tensor,
        # where each index or slice would add a zeroed (3, b, h, t, hd) tensor of its own
        qk, v = qkv.split((2, 1))
        if pos.rotate is not None and pos.attend is None:  # rotate (and scale) q and k in one pass
            q, k = pos.rotate(qk)
        else:
            q, k = qk.unbind(0)
        if pos.q_scale is not None:
            if not isinstance(pos.q_scale, torch.Tensor) or tuple(pos.q_scale.shape) != (q.shape[2], 1):
                raise ValueError(f"Positions.q_scale must be a ({q.shape[2]}, 1) tensor (one factor per query), got "
                                 f"{getattr(pos.q_scale, 'shape', type(pos.q_scale).__name__)}")
            q = q * pos.q_scale.to(q.dtype)
        if self.ssmax_scale is not None:  # Scalable-Softmax: q_i times s_h log n_i
            q = q * ssmax_factors(q.shape[2], self.ssmax_scale, window=pos.window).to(q.dtype)
        return q, k, v.squeeze(0)

    def _attend(self, qkv, pos, return_weights: bool):
        """Softmax attention with the model's positions: the output, or (output, weights)."""
        q, k, v = self._inputs(qkv, pos)
        if not self.causal:
            return _softmax_attention(q, k, v, causal=False, return_weights=return_weights)
        if pos.bias is not None:  # distances of explicit position ids: the bias as one (b, h, t, t) tensor
            if pos.attend is not None or pos.sinks or self.sink_logits is not None:
                raise ValueError("explicit position ids with a distance bias do not combine with ReRoPE / "
                                 "Self-Extend, StreamingLLM's kept first tokens or learned sink logits here")
            mask = None
            if pos.window is not None:  # the window counts tokens
                d = torch.arange(q.shape[2], device=q.device)
                mask = (d[:, None] - d[None, :]) < pos.window
            return _softmax_attention(q, k, v, bias=pos.bias, mask=mask, causal=True, return_weights=return_weights)
        if self.sink_logits is not None:
            if pos.attend is not None or pos.sinks:
                raise ValueError("learned sink logits do not combine with ReRoPE / Self-Extend or with "
                                 "StreamingLLM's kept first tokens here (model.sinks, model.rope_scaling)")
            return sink_logit_attention(q, k, v, self.sink_logits, slopes=pos.slopes, distance_bias=pos.table,
                                        window=pos.window, return_weights=return_weights)
        if pos.attend is not None:  # ReRoPE, Self-Extend: q and k unrotated
            return pos.attend(q, k, v, window=pos.window, sinks=pos.sinks, return_weights=return_weights)
        if pos.sinks and pos.window is not None:
            return sink_attention(q, k, v, window=pos.window, sinks=pos.sinks, slopes=pos.slopes,
                                  distance_bias=pos.table, return_weights=return_weights)
        # a bias per distance (never stored as (heads, t, t)) and the window: the fused kernel,
        # ALiBi folded into q and k, or query chunks
        return relative_attention(q, k, v, slopes=pos.slopes, distance_bias=pos.table, window=pos.window,
                                  return_weights=return_weights)

    def mix(self, qkv, pos):
        return self._attend(qkv, pos, return_weights=False)

    def weights(self, qkv, pos):
        return self._attend(qkv, pos, return_weights=True)[1]


def _denominator(fq: torch.Tensor, fk: torch.Tensor, causal: bool) -> torch.Tensor:
    """``phi(q_i) . sum_{j (<= i)} phi(k_j)``, ``(batch, heads, seq)``."""
    if causal:
        return (fq * fk.cumsum(2)).sum(-1)
    return (fq @ fk.sum(-2)[..., None]).squeeze(-1)


class LinearAttention(_MultiHead):
    """Multi-head kernel linear attention with the denominator (the "1 + elu" baseline).

    A rotation acts on the features of the numerator only (Su, 2021): the
    denominator keeps the unrotated features and stays positive
    (:func:`posenc.rope_linear_attention`).

    Args:
        d_model, n_heads, causal, rope, bias, dropout: as in :class:`SoftmaxAttention`.
        feature: feature map name (default ``"elu+1"``).
        eps, method, chunk_size: see :func:`posenc.linear_attention`.
    """

    kind = "linear"

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, feature: str = "elu+1",
                 rope: bool = False, eps: float = 1e-6, method: str = "chunked", chunk_size: int = 64,
                 bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        feature_map(feature)
        method = _check_method(method)
        self.feature, self.eps = feature, _check_eps(eps)
        self.method, self.chunk_size = method, check_int("chunk_size", chunk_size)

    def mix(self, qkv, pos):
        q, k, v = qkv
        kw = dict(causal=self.causal, eps=self.eps, method=self.method, chunk_size=self.chunk_size)
        if pos.rotate is None:
            return linear_attention(q, k, v, feature=self.feature, **kw)
        phi = feature_map(self.feature)
        fq, fk = phi(q), phi(k)
        rq, rk = _rotate_pair(pos, fq, fk)
        num = linear_attention(rq, rk, v, feature=None, normalize=False, **kw)
        return num / (_denominator(fq, fk, self.causal)[..., None] + self.eps)

    def denominator(self, x: torch.Tensor) -> torch.Tensor:
        """The denominators ``phi(q_i) . z_i`` (``z_i = sum_{j<=i} phi(k_j)`` when causal) for input ``x``.

        Returns:
            ``(batch, heads, seq)``, without the ``eps``. Prop. 3.1 of Qin et al.
            (2022) is about these getting close to 0.
        """
        q, k, _ = self._qkv(x)
        phi = feature_map(self.feature)
        return _denominator(phi(q), phi(k), self.causal)

    def weights(self, qkv, pos):
        q, k, _ = qkv
        if pos.rotate is None:
            return linear_attention_weights(q, k, causal=self.causal, feature=self.feature, eps=self.eps)
        phi = feature_map(self.feature)
        fq, fk = phi(q), phi(k)
        rq, rk = _rotate_pair(pos, fq, fk)
        num, den = rq @ rk.transpose(-2, -1), fq @ fk.transpose(-2, -1)
        if self.causal:
            num, den = num.tril(), den.tril()
        return num / (den.sum(-1, keepdim=True) + self.eps)


class NormAttention(_MultiHead):
    """TransNormer's NormAttention layer: ``RMSNorm(phi(Q) phi(K)^T V)`` (Qin et al., 2022, Eq. 11).

    No denominator, no ``1/sqrt(d)``. The norm is over the concatenated heads
    and has no gain, as in the authors' code; ``per_head=True`` normalises
    each head separately and ``gain=True`` adds a learnable gain. A rotation
    acts on ``phi(q)``, ``phi(k)`` (there is no denominator to protect).

    Args:
        d_model, n_heads, causal, rope, bias, dropout: as in :class:`SoftmaxAttention`.
        feature: ``"elu+1"`` (T2) or ``"elu"`` (T1), or any name in :data:`posenc.FEATURE_MAPS`.
        per_head, gain, eps: the RMSNorm.
        method, chunk_size: see :func:`posenc.linear_attention`.
    """

    kind = "norm"

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, feature: str = "elu+1",
                 per_head: bool = False, gain: bool = False, eps: float = 1e-6, rope: bool = False,
                 method: str = "chunked", chunk_size: int = 64, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        feature_map(feature)
        method = _check_method(method)
        self.feature, self.per_head, self.eps = feature, check_bool("per_head", per_head), _check_eps(eps)
        self.method, self.chunk_size = method, check_int("chunk_size", chunk_size)
        size = self.head_dim if self.per_head else d_model
        self.gain = nn.Parameter(torch.ones(size)) if check_bool("gain", gain) else None

    def _features(self, qkv, pos):
        phi = feature_map(self.feature)
        return _rotate_pair(pos, phi(qkv[0]), phi(qkv[1]))

    def mix(self, qkv, pos):
        fq, fk = self._features(qkv, pos)
        return norm_attention(fq, fk, qkv[2], causal=self.causal, feature=None, eps=self.eps,
                              per_head=self.per_head, weight=self.gain, method=self.method,
                              chunk_size=self.chunk_size)

    def weights(self, qkv, pos):
        """Raw scores ``phi(q_i) . phi(k_j)`` (before the norm; rows do not sum to 1)."""
        fq, fk = self._features(qkv, pos)
        return linear_attention_weights(fq, fk, causal=self.causal, feature=None, normalize=False)


class DiagAttention(_MultiHead):
    """TransNormer's DiagAttention layer: attention within non-overlapping blocks (:func:`posenc.diag_attention`).

    Args:
        d_model, n_heads, causal, rope, bias, dropout: as in :class:`SoftmaxAttention`.
        block_size: block length ``w`` (64 in the paper).
        kind: ``"softmax"`` (T2) or ``"relu"`` (T1).
    """

    kind = "diag"

    def __init__(self, d_model: int, n_heads: int, *, causal: bool = True, block_size: int = 64,
                 kind: str = "softmax", rope: bool = False, eps: float = 1e-6, bias: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        if kind not in ("softmax", "relu"):
            raise ValueError(f"kind must be 'softmax' or 'relu', got {kind!r}")
        self.block_size, self.block_kind = check_int("block_size", block_size), kind
        self.eps = _check_eps(eps)

    def mix(self, qkv, pos):
        q, k = _rotate_pair(pos, qkv[0], qkv[1])
        return diag_attention(q, k, qkv[2], block_size=self.block_size, causal=self.causal,
                              kind=self.block_kind, eps=self.eps)

    def weights(self, qkv, pos):
        """Block-diagonal weights (softmax probabilities, or ReLU scores before the norm)."""
        q, k = _rotate_pair(pos, qkv[0], qkv[1])
        mask = block_diagonal_mask(q.shape[-2], self.block_size, causal=self.causal, device=q.device)
        if self.block_kind == "softmax":
            return _softmax_attention(q, k, k, mask=mask, causal=self.causal, return_weights=True)[1]
        scores = torch.relu(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
        return scores * mask


class DecayAttention(_MultiHead):
    """Linear attention whose state decays by a fixed rate per head (RetNet's retention; :mod:`posenc.decay`).

    ``out_i = RMSNorm(sum_{j<=i} gamma_h^(i-j) (phi(q_i) . phi(k_j)) v_j)``
    per head, computed chunkwise (:func:`posenc.decayed_linear_attention`).
    A rotation acts on the features ``phi(q)``, ``phi(k)`` as in the
    ``"linear"`` kind (with RoPE this is RetNet's ``Q K^T`` with ``e^{i n
    theta}`` rotations); the decay is the only distance bias. Causal only.

    Args:
        d_model, n_heads, rope, bias, dropout: as in :class:`SoftmaxAttention`.
        decay: ``"retnet"`` (default), ``"alibi"`` or ``(n_heads,)`` rates in
            ``(0, 1]`` (:func:`posenc.decay_rates`); a fixed buffer, not trained.
        feature: feature map (default ``"identity"``, as RetNet).
        chunk_size, eps: the chunk length and the RMSNorm's ``eps``.
    """

    kind = "decay"

    def __init__(self, d_model: int, n_heads: int, *, decay: Any = "retnet", feature: str = "identity",
                 chunk_size: int = 64, eps: float = 1e-6, rope: bool = False, causal: bool = True,
                 bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        if not self.causal:
            raise ValueError(f"{self.kind!r} attention is causal (its state decays along the sequence): "
                             "build it with causal=True")
        feature_map(feature)
        self.feature, self.eps, self.chunk_size = feature, _check_eps(eps), check_int("chunk_size", chunk_size)
        if self.kind == "decay":
            self.decay = _decay_value(decay, n_heads)  # a name or a list of floats
            self.register_buffer("log_decay", decay_rates(self.decay, n_heads, log=True, dtype=torch.float64),
                                 persistent=False)

    def _log_gates(self, packed):
        """``(q, k, v)`` and the log decays from what :meth:`_qkv` returned."""
        return packed, self.log_decay

    def _inputs(self, packed, pos: Positions):
        (q, k, v), log_gamma = self._log_gates(packed)
        phi = feature_map(self.feature)
        fq, fk = _rotate_pair(pos, phi(q), phi(k))
        return fq, fk, v, log_gamma.to(fq.dtype)

    def mix(self, qkv, pos):
        fq, fk, v, log_gamma = self._inputs(qkv, pos)
        return decayed_linear_attention(fq, fk, v, log_gamma, log_space=True, chunk=self.chunk_size, eps=self.eps)

    def weights(self, qkv, pos):
        """Decayed scores ``prod(gamma) phi(q_i) . phi(k_j)`` (before the norm; rows do not sum to 1)."""
        fq, fk, _, log_gamma = self._inputs(qkv, pos)
        return decayed_attention_weights(fq, fk, log_gamma, log_space=True)


class GatedDecayAttention(DecayAttention):
    """Decayed linear attention with a learned gate per step (GLA's parametrisation; :mod:`posenc.decay`).

    ``gamma_t = sigmoid(W x_t + b)^(1 / tau)`` from the layer's input
    (:func:`posenc.gate_decay`), a linear map ``gate`` with a bias; the state
    decays by ``gamma_t`` at step ``t``. With ``gate="head"`` one gate per head
    (``d_model -> n_heads``: the granularity of Mamba-2, a scalar times the
    identity); with ``gate="channel"`` one per head and key channel
    (``d_model -> n_heads * head_dim``), ``S_t = diag(gamma_t) S_{t-1} +
    k_t v_t^T``: Gated Linear Attention (Yang et al., 2024, Sec. 4), whose gate
    map is low-rank (rank 16), a saving that a model of ``d_model = 64`` does
    not need. Otherwise as :class:`DecayAttention`.

    Args:
        gate_temperature: ``tau > 0`` (16 in GLA, Yang et al., 2024).
        gate: ``"head"`` or ``"channel"``.
        d_model, n_heads, feature, chunk_size, eps, rope, bias, dropout: as in :class:`DecayAttention`.
    """

    kind = "gated"

    def __init__(self, d_model: int, n_heads: int, *, gate_temperature: float = 16.0, gate: str = "head",
                 feature: str = "identity", chunk_size: int = 64, eps: float = 1e-6, rope: bool = False,
                 causal: bool = True, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, feature=feature, chunk_size=chunk_size, eps=eps, rope=rope,
                         causal=causal, bias=bias, dropout=dropout)
        self.gate_temperature = check_number("gate_temperature", gate_temperature, 0.0)
        self.gate_kind = one_of("gate", gate, GATE_KINDS)
        self.gate = nn.Linear(self.d_model, n_heads * (self.head_dim if self.gate_kind == "channel" else 1))

    def _qkv(self, x):
        """``(q, k, v)`` and the log gates of ``x``: ``(batch, heads, seq)``, or ``(batch, heads, seq, head_dim)`` per channel."""
        qkv = super()._qkv(x)
        logits = self.gate(x)  # (batch, seq, heads) or (batch, seq, heads * head_dim)
        if self.gate_kind == "channel":
            logits = logits.view(*logits.shape[:2], self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        else:
            logits = logits.transpose(1, 2)
        return qkv, gate_decay(logits, self.gate_temperature, log=True)

    def _log_gates(self, packed):
        return packed


# the kinds of their own modules (posenc.forgetting, posenc.stick_breaking) add their layers on import
_LAYERS: Dict[str, type] = dict(softmax=SoftmaxAttention, linear=LinearAttention, norm=NormAttention,
                                diag=DiagAttention, decay=DecayAttention, gated=GatedDecayAttention)


def kind_options(*, feature: str, diag_block: int, decay: Any, gate_temperature: float, gate: str,
                 forget_bias: float) -> Dict[str, Dict[str, Any]]:
    """The options of each attention kind, from a :class:`~posenc.TinyLM`'s arguments of the same names.

    ``gate`` enters the gated layers' options only where it is not the default
    ``"head"``, so that a model with one gate per head keeps the configuration
    (and the run's cache key) it had before gates per channel existed.
    """
    return dict(linear=dict(feature=feature), norm=dict(feature=feature), diag=dict(block_size=diag_block),
                softmax={}, decay=dict(decay=decay),
                gated=dict(gate_temperature=gate_temperature, **(dict(gate=gate) if gate != "head" else {})),
                forgetting=dict(forget_bias=forget_bias), stick_breaking={})


def options_config(options: Dict[str, Dict[str, Any]], kinds: List[str]) -> Dict[str, Any]:
    """The model-config entries of the options of the ``kinds`` present: ``"<kind>_<option>"``, except the
    options named as the model's own argument (``decay``, ``gate_temperature``, ``gate``, ``forget_bias``)."""
    own = ("decay", "gate_temperature", "gate", "forget_bias")
    return {k if k in own else f"{kd}_{k}": v for kd in sorted(set(kinds)) for k, v in options[kd].items()}


def attention_layer(kind: str, d_model: int, n_heads: int, /, **options) -> _MultiHead:
    """The attention layer of ``kind`` (one of :data:`ATTENTION_KINDS`), built with ``options``.

    The first three arguments are positional, so that an option may be called
    ``kind`` too (:class:`DiagAttention`'s block kind).

    >>> attention_layer("diag", 32, 4, block_size=16, kind="relu").block_kind
    'relu'
    """
    layer = _LAYERS[one_of("attention kind", kind, ATTENTION_KINDS)]
    accepted = _options(layer)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"attention kind {kind!r} ({layer.__name__}) takes the options {sorted(accepted)}, "
                         f"got {unknown}")
    return layer(d_model, n_heads, **options)


def _options(layer: type) -> set:
    """The keyword options a layer class takes: its ``__init__``'s and, where it passes ``**options`` on, its bases'."""
    names: set = set()
    for klass in layer.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names
