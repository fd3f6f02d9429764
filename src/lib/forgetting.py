"""Forgetting attention: softmax attention with a forget gate per head and step (FoX; Lin et al., ICLR 2025).

The Forgetting Transformer ("Forgetting Transformer: Softmax Attention with a
Forget Gate", Lin, Nikishin, He & Courville, 2025) computes, for every head
``h``, a scalar forget gate from the token,

.. math:: f_t = \\sigma(w_h^\\top x_t + b_h) \\in (0, 1),

and adds the log of the gates passed between key ``j`` and query ``i`` to the
logit (the paper's definition of forgetting attention):

.. math:: s_{ij} = \\frac{q_i^\\top k_j}{\\sqrt{d}} + D_{ij}, \\qquad
          D_{ij} = \\sum_{l=j+1}^{i} \\log f_l \\quad (j \\le i),

then a causal softmax. ``D_ii = 0`` (an empty sum): a query never forgets
itself. The bias is data-dependent ALiBi: with every gate held at ``e^{-m_h}``,
``D_ij = -m_h (i - j)``, ALiBi's bias exactly. No position embedding is
needed; the gates carry the order.

With ``c_i = sum_{l <= i} log f_l`` (a cumulative sum along the sequence),
``D_ij = c_i - c_j``: :func:`forgetting_bias` builds it in ``O(n^2)`` numbers
from ``n`` gates. :func:`forgetting_attention` needs none of them: softmax
ignores ``c_i`` (one value per query), and ``-c_j`` is one extra channel of
the keys, so PyTorch's fused causal kernel runs it (``path="fold"``); the
bias as a float mask with ``-inf`` above the diagonal is ``path="bias"``.

:class:`ForgettingAttention` is the layer of ``TinyLM(attention="forgetting")``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_bool, check_number, one_of
from .attention import _check_qkv, _scaled, _softmax
from .layers import _LAYERS, Positions, _MultiHead, _rotate_pair

__all__ = ["FORGETTING_PATHS", "forgetting_bias", "forgetting_attention", "ForgettingAttention"]


def _check_log_forget(log_forget: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``log_forget`` checked against ``q`` ``(batch, heads, seq, dim)``: ``(batch, heads, seq)``, finite, ``<= 0``."""
    if not isinstance(log_forget, torch.Tensor) or not log_forget.is_floating_point():
        raise ValueError(f"log_forget must be a floating-point tensor (batch, heads, seq) of log gates, got "
                         f"{getattr(log_forget, 'dtype', type(log_forget).__name__)}")
    if tuple(log_forget.shape) != tuple(q.shape[:3]):
        raise ValueError(f"log_forget must be (batch, heads, seq) = {tuple(q.shape[:3])} to match q "
                         f"{tuple(q.shape)}, got {tuple(log_forget.shape)}")
    if log_forget.device != q.device:
        raise ValueError(f"log_forget is on {log_forget.device} but q on {q.device}")
    if not log_forget.is_meta and not bool(((log_forget <= 0) & (log_forget > -math.inf)).all()):
        if bool((log_forget == -math.inf).any()):
            raise ValueError("log_forget holds logs of gates in (0, 1]: got -inf, a gate of exactly 0 (the cumulative "
                             "sums would give -inf - (-inf) = NaN); pass F.logsigmoid(gate_logits), which stays "
                             "finite where log(sigmoid(x)) underflows")
        worst = log_forget.nan_to_num(math.inf).max().item()
        raise ValueError(f"log_forget holds logs of gates in (0, 1]: every entry must be <= 0 (and not NaN), got a "
                         f"largest entry of {worst:g}; pass F.logsigmoid(gate_logits)")
    return log_forget


def forgetting_bias(log_forget: torch.Tensor) -> torch.Tensor:
    """The forget-gate bias ``D_ij = sum_{l=j+1..i} log f_l`` with ``-inf`` above the diagonal.

    Computed as ``c_i - c_j`` from the cumulative sum ``c`` of ``log_forget``
    along the sequence (in float64 for float64 input, else float32, then cast).

    Args:
        log_forget: ``(batch, heads, seq)`` logs of the forget gates, ``<= 0``.

    Returns:
        ``(batch, heads, seq, seq)``: 0 on the diagonal, ``<= 0`` below it
        (key ``j`` before query ``i``), ``-inf`` above it.

    >>> forgetting_bias(torch.full((1, 1, 3), -0.5))[0, 0]
    tensor([[ 0.0000,    -inf,    -inf],
            [-0.5000,  0.0000,    -inf],
            [-1.0000, -0.5000,  0.0000]])
    """
    if not isinstance(log_forget, torch.Tensor) or log_forget.ndim != 3:
        raise ValueError(f"log_forget must be a (batch, heads, seq) tensor, got "
                         f"{tuple(getattr(log_forget, 'shape', ())) or type(log_forget).__name__}")
    _check_log_forget(log_forget, log_forget[..., None])
    work = torch.float64 if log_forget.dtype == torch.float64 else torch.float32
    c = log_forget.to(work).cumsum(-1)  # c_i = sum_{l <= i} log f_l
    n = log_forget.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=log_forget.device).tril()
    bias = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf"))
    return bias.to(log_forget.dtype)


def _path_fold(q, k, v, log_forget, scale):
    """``D_ij = c_i - c_j`` as one extra channel: ``c_i`` is the same for every key of query ``i`` and drops out
    of the softmax, ``-c_j`` is a query feature (1) times a key feature (``-c_j / scale``); the fused causal kernel
    runs unchanged at ``head_dim + 1`` channels. ``c`` is not centred on the sequence: a centre read from later
    gates would let later tokens change the rounding of earlier outputs (exact causality, bit for bit)."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    c = log_forget.to(work).cumsum(-1)
    ones = q.new_ones(*q.shape[:3], 1, dtype=work)
    q1 = torch.cat([q.to(work), ones], dim=-1)
    k1 = torch.cat([k.to(work), (-c / scale)[..., None]], dim=-1)
    v1 = torch.cat([v.to(work), ones], dim=-1) if v.shape[-1] == q.shape[-1] else v.to(work)
    with torch.autocast(q.device.type, enabled=False):  # c_j in bfloat16 would be off by ~1 at |c| ~ 300
        out = F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=scale)
    return (out[..., :-1] if v1.shape[-1] != v.shape[-1] else out).to(q.dtype)


#: The implementations of :func:`forgetting_attention` (``path=``).
FORGETTING_PATHS = ("fold", "bias")


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_forget: torch.Tensor,
    *,
    scale: Optional[float] = None,
    path: str = "fold",
    return_weights: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Forgetting attention (FoX, Lin et al., 2025): causal softmax of ``scale q.k + D``.

    ``D_ij = sum_{l=j+1..i} log f_l = c_i - c_j`` (:func:`forgetting_bias`);
    the gates' logs are per head and step. Two exact paths (equal to the
    paper's double sum in float64, see the tests):

    * ``"fold"`` (default): softmax ignores ``c_i``, the same for every key of
      query ``i``; ``-c_j`` enters as one extra channel of ``q`` (a 1) and
      ``k`` (``-c_j / scale``), and the fused causal kernel of
      ``scaled_dot_product_attention`` runs with ``is_causal=True`` (no
      ``n x n`` tensor), as ALiBi's fold (:mod:`posenc._fused_alibi`). Half
      precision is computed in float32.
    * ``"bias"``: :func:`forgetting_bias` built in full and passed as a float
      mask, ``-inf`` above the diagonal.

    In float32 both round the logits to about ``max |c| 2^-24`` (``|c|`` grows
    with the length and the forgetting).

    Args:
        q, k: ``(batch, heads, seq, head_dim)``; v: ``(batch, heads, seq, v_dim)``
            (self-attention: one length).
        log_forget: ``(batch, heads, seq)`` logs of the forget gates, every
            entry ``<= 0`` (``F.logsigmoid`` of the gate logits); entry ``t``
            is ``log f_t`` of the token at position ``t``.
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        path: one of :data:`FORGETTING_PATHS`.
        return_weights: also return the ``(batch, heads, seq, seq)`` weights
            (explicit softmax).

    Returns:
        ``(batch, heads, seq, v_dim)``, or ``(output, weights)``.

    Raises:
        ValueError: for ``q``, ``k``, ``v`` of other ranks, lengths, dtypes or
            devices, a ``log_forget`` of another shape than ``(batch, heads,
            seq)``, a positive (or NaN) log gate, or an unknown path.

    With every gate ``e^{-m_h}`` this is ALiBi with slopes ``m``:

    >>> import posenc as pe
    >>> q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    >>> m = pe.alibi_slopes(4, dtype=torch.float64)
    >>> fox = forgetting_attention(q, k, v, -m[None, :, None].expand(1, 4, 6))
    >>> torch.allclose(fox, pe.relative_attention(q, k, v, slopes=m))
    True
    """
    _check_qkv(q, k, v)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"forgetting attention is self-attention here: q and k need one length, got "
                         f"{q.shape[2]} and {k.shape[2]}")
    _check_log_forget(log_forget, q)
    path = one_of("path", path, FORGETTING_PATHS)
    q, scale = _scaled(q, scale)
    if not check_bool("return_weights", return_weights) and path == "fold":
        return _path_fold(q, k, v, log_forget, scale)
    bias = forgetting_bias(log_forget).to(q.dtype)
    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    weights = _softmax(q @ k.transpose(-2, -1) * scale + bias)
    return weights @ v, weights


class ForgettingAttention(_MultiHead):
    """The Forgetting Transformer's attention layer: :func:`forgetting_attention` with a learned gate per head.

    The gate is a linear map ``forget_gate`` ``(d_model -> n_heads)`` with a
    bias: ``log f_t = logsigmoid(w_h . x_t + b_h)`` from the layer's input
    ``x_t`` (one ``w_h``, ``b_h`` per head), as the authors' ``fgate_proj``.

    Initialisation: the model draws ``w_h`` from ``N(0, 0.02^2)`` and sets
    ``b_h = forget_bias``, default 0, so the gates start near
    ``sigmoid(0) = 1/2``: what the authors' code does for the data-dependent
    gate (``fgate_type="full"``: ``nn.Linear`` weights ``N(0, 0.02^2)``, bias
    zeros) and what flash-linear-attention's FoX does. The paper's fixed
    initialisation of the bias (decay times ``T_min .. T_max`` spread over
    the heads, ``b = -log(expm1(1/T))``) is for its data-independent and
    fixed-gate ablations only. A larger ``forget_bias`` starts the gates
    nearer 1 (``forget_bias = 5``: ``f ~ 0.993``), i.e. nearer NoPE.

    Position: the paper's FoX uses no position embedding (``position="none"``).
    A rotation (``position="rope"``) is applied to ``q`` and ``k`` before the
    logits, as the authors' layer does with ``use_rope=True`` (off by
    default there); a distance bias (ALiBi, KERPLE, ...) is refused by the
    model, as for every non-softmax kind. Causal only.

    Args:
        d_model, n_heads, rope, bias, dropout: as in :class:`posenc.SoftmaxAttention`.
        forget_bias: the initial gate bias ``b_h`` (every head).
    """

    kind = "forgetting"

    def __init__(self, d_model: int, n_heads: int, *, forget_bias: float = 0.0, rope: bool = False,
                 causal: bool = True, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        if not self.causal:
            raise ValueError("forgetting attention is causal (its gates pass from each key to later queries): "
                             "build it with causal=True")
        self.forget_bias = check_number("forget_bias", forget_bias)
        self.forget_gate = nn.Linear(self.d_model, n_heads)
        with torch.no_grad():
            self.forget_gate.bias.fill_(self.forget_bias)

    def _qkv(self, x):
        """``(q, k, v)`` and the ``(batch, heads, seq)`` log forget gates of ``x``."""
        qkv = super()._qkv(x)
        return qkv, F.logsigmoid(self.forget_gate(x)).transpose(1, 2)

    def _attend(self, packed, pos: Positions, return_weights: bool):
        (q, k, v), log_forget = packed
        q, k = _rotate_pair(pos, q, k)
        return forgetting_attention(q, k, v, log_forget, return_weights=return_weights)

    def mix(self, qkv, pos):
        return self._attend(qkv, pos, False)

    def weights(self, qkv, pos):
        """Softmax probabilities with the forget-gate bias, ``(batch, heads, seq, seq)``."""
        return self._attend(qkv, pos, True)[1]


_LAYERS["forgetting"] = ForgettingAttention
