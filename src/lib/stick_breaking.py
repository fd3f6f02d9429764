"""Stick-breaking attention (Tan, Yang, Courville, Panda & Shen, ICLR 2025).

"Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth
Study" replaces the softmax by a stick-breaking process. Every logit
``z_ij = scale q_i . k_j`` gives a break fraction ``beta_ij = sigmoid(z_ij)``;
the keys break the stick in turn, **from the nearest key outward**, and key
``j`` gets its fraction of what the nearer keys left (the paper's definition):

.. math:: A_{ij} = \\beta_{ij} \\prod_{j < k < i} (1 - \\beta_{ik}).

No softmax, no position encoding: a key's weight falls with the number of
keys between it and the query that claimed their share, so nearness comes
out of the content. A row sums to ``1 - prod_k (1 - beta_ik) <= 1``.

**Log space.** ``log A_ij = log beta_ij + sum_{j<k<i} log(1 - beta_ik)``,
with ``log beta = logsigmoid(z)`` and ``log(1 - beta) = logsigmoid(-z)``;
the sum over ``k`` is a reverse cumulative sum along the keys. Nothing is
exponentiated but the final ``log A <= 0``, so it stays finite at any length.

**Diagonal convention** (as the authors' reference code and kernels, whose
default is ``attend_current=False``): query ``i`` breaks the stick over the
keys ``j < i`` only, not over itself; the first token's row has no key and
all weights 0. What is left of the stick, ``1 - sum_j A_ij``, goes to the
query's own value (the authors' tests and models add ``rem * v``; the
dolomite-engine layer's ``sb_remainder``), so the output is a convex
combination and the first token's output is its own value. With
``attend_current=True`` the query is the nearest key, ``j <= i``, and the
remainder still goes to its value.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ._validate import check_bool
from ._per_sequence import per_sequence, split_by_sequence
from .attention import _check_qkv, _scaled
from .layers import _LAYERS, Positions, _MultiHead, _rotate_pair

__all__ = ["stick_breaking_weights", "stick_breaking_attention", "StickBreakingAttention"]


def stick_breaking_weights(logits: torch.Tensor, *, attend_current: bool = False) -> torch.Tensor:
    """Stick-breaking weights ``A_ij = beta_ij prod_{j<k<i} (1 - beta_ik)`` from logits, in log space.

    Args:
        logits: ``(..., n, n)``, query ``i`` by key ``j`` (self-attention: key
            ``j`` at position ``j``); entries not attended are ignored.
        attend_current: let query ``i`` attend to itself (keys ``j <= i``);
            default keys ``j < i`` (the authors' default).

    Returns:
        ``(..., n, n)`` weights in ``[0, 1]``, 0 above the diagonal (and on it
        unless ``attend_current``); each row sums to at most 1. Half
        precision is computed in float32 and cast back.

    >>> w = stick_breaking_weights(torch.zeros(3, 3))   # beta = 1/2 everywhere
    >>> w
    tensor([[0.0000, 0.0000, 0.0000],
            [0.5000, 0.0000, 0.0000],
            [0.2500, 0.5000, 0.0000]])
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor (..., n, n), got "
                         f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.ndim < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be (..., n, n): queries by keys of one sequence, got {tuple(logits.shape)}")
    n, dtype = logits.shape[-1], logits.dtype
    nearest = 0 if check_bool("attend_current", attend_current) else -1  # the diagonal of the nearest key
    allowed = torch.ones(n, n, dtype=torch.bool, device=logits.device).tril(nearest)
    if dtype in (torch.float16, torch.bfloat16):  # long sums of logs in float32, as the authors' reference
        logits = logits.float()
    log_beta = F.logsigmoid(logits).masked_fill(~allowed, float("-inf"))
    log_keep = F.logsigmoid(-logits).masked_fill(~allowed, 0.0)  # log(1 - beta), 0 where not attended
    # sum over the keys k > j still allowed: a reverse cumulative sum, shifted by one key (exclusive)
    after = log_keep.flip(-1).cumsum(-1).flip(-1)
    after = F.pad(after[..., 1:], (0, 1))
    return (log_beta + after).exp().to(dtype)


def stick_breaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    attend_current: bool = False,
    return_weights: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Stick-breaking attention: ``out_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i``.

    ``A`` from :func:`stick_breaking_weights` of ``z = scale q k^T``; the
    remainder of the stick goes to the query's own value (see the module's
    diagonal convention). ``O(n^2)`` time and memory.

    Args:
        q, k: ``(batch, heads, seq, head_dim)``; v: ``(batch, heads, seq, v_dim)``.
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        attend_current: keys ``j <= i`` instead of ``j < i``.
        return_weights: also return the ``(batch, heads, seq, seq)`` matrix
            applied to the values: ``A`` plus the remainder on the diagonal
            (rows sum to 1).

    Returns:
        ``(batch, heads, seq, v_dim)``, or ``(output, weights)``.

    Raises:
        ValueError: for ``q``, ``k``, ``v`` of other ranks, lengths, dtypes or devices.
    """
    _check_qkv(q, k, v)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"stick-breaking attention is self-attention here: q and k need one length, got "
                         f"{q.shape[2]} and {k.shape[2]}")
    if split_by_sequence(q, k, (q, k, v)):
        return per_sequence(lambda b: stick_breaking_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], scale=scale,
                                                               attend_current=attend_current,
                                                               return_weights=return_weights), q.shape[0])
    q, scale = _scaled(q, scale)
    weights = stick_breaking_weights(q @ k.transpose(-2, -1) * scale, attend_current=attend_current)
    remainder = 1.0 - weights.sum(-1, keepdim=True)  # (batch, heads, seq, 1), in [0, 1]
    out = weights @ v + remainder * v
    if not check_bool("return_weights", return_weights):
        return out
    return out, weights + torch.diag_embed(remainder.squeeze(-1))


class StickBreakingAttention(_MultiHead):
    """Multi-head stick-breaking attention (:func:`stick_breaking_attention`): ``TinyLM(attention="stick_breaking")``.

    The paper uses no position encoding (``position="none"``); a rotation
    (``position="rope"``) acts on ``q`` and ``k`` before the logits; a
    distance bias is refused by the model, as for every non-softmax kind.
    Causal only; keys ``j < i`` with the remainder on the query's own value.

    Args:
        d_model, n_heads, rope, bias, dropout: as in :class:`posenc.SoftmaxAttention`.
        attend_current: keys ``j <= i`` instead of ``j < i``.
    """

    kind = "stick_breaking"

    def __init__(self, d_model: int, n_heads: int, *, attend_current: bool = False, rope: bool = False,
                 causal: bool = True, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, causal=causal, rope=rope, bias=bias, dropout=dropout)
        if not self.causal:
            raise ValueError("stick-breaking attention is causal (the stick breaks from the query backwards): "
                             "build it with causal=True")
        self.attend_current = check_bool("attend_current", attend_current)

    def _attend(self, qkv, pos: Positions, return_weights: bool):
        q, k = _rotate_pair(pos, qkv[0], qkv[1])
        return stick_breaking_attention(q, k, qkv[2], attend_current=self.attend_current,
                                        return_weights=return_weights)

    def mix(self, qkv, pos):
        return self._attend(qkv, pos, False)

    def weights(self, qkv, pos):
        """The matrix applied to the values: stick-breaking weights plus the remainder on the diagonal."""
        return self._attend(qkv, pos, True)[1]


_LAYERS["stick_breaking"] = StickBreakingAttention
