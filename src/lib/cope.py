"""CoPE: contextual position encoding (Golovneva, Wang, Weston & Sukhbaatar, 2024).

"Contextual Position Encoding: Learning to Count What's Important" lets the
content decide what a position counts. Query ``i`` opens a gate on every
earlier key,

.. math:: g_{ij} = \\sigma(z_{ij}), \\qquad z_{ij} = \\text{scale}\\; q_i^\\top k_j \\quad (j \\le i),

and the position of key ``j`` seen from query ``i`` is the number of open
gates between them, itself and the query included:

.. math:: p_{ij} = \\sum_{k=j}^{i} g_{ik},

a fractional number (a sum of sigmoids), capped at ``n_positions - 1``. Its
embedding is interpolated between learned integer ones,
``e[p] = (1 - w) e[floor p] + w e[ceil p]`` with ``w = p - floor p``, and the
logit gains ``q_i . e[p_ij]`` (added after the ``scale`` of
``q . k``, as in the paper's code, which also computes the gates from the
scaled logits). Counting gates instead of tokens, a head may count words,
sentences, or only the tokens it cares about.

**The efficient form** (the paper's): ``q_i . e[p]`` is linear in
``e``, so ``q_i . e[p_ij] = (1 - w) (q_i . e[floor p]) + w (q_i . e[ceil p])``:
the ``n_positions`` products ``q_i . e[t]`` are computed once per query
(``(batch, heads, seq, n_positions)``) and read at ``floor p`` and ``ceil p``
(:func:`cope_position_logits`), never an ``(n, n, head_dim)`` tensor of
interpolated embeddings.

As a position scheme, ``TinyLM(position="cope", n_positions=...)``
(:class:`CoPE`): it computes the attention of softmax layers itself, through
the scheme hook ``attend`` (the one ReRoPE uses), with one table of
embeddings per layer, shared by the heads (as the paper's code), zeros at first.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn

from ._validate import _float_tensor, _real_tensor, check_bool, check_int
from ._per_sequence import per_sequence, split_by_sequence
from .attention import _check_qkv, _scaled
from .masks import _finite
from .scheme import PositionScheme, register_scheme

__all__ = ["cope_positions", "cope_position_logits", "cope_attention", "CoPE"]


def _allowed(n: int, window: Optional[int], device: torch.device) -> torch.Tensor:
    """``(n, n)`` bool: causal, and within ``window`` keys of the query if given."""
    distance = torch.arange(n, device=device)[:, None] - torch.arange(n, device=device)
    return (distance >= 0) & ((distance < check_int("window", window)) if window is not None else True)


def cope_positions(gates: torch.Tensor, n_positions: Optional[int] = None) -> torch.Tensor:
    """CoPE's positions ``p_ij = sum_{k=j..i} g_ik`` (the paper's count), capped at ``n_positions - 1``.

    Args:
        gates: ``(..., n, n)`` gates in ``[0, 1]``, query ``i`` by key ``j``, 0
            where a query may not attend (above the diagonal).
        n_positions: the number of position embeddings (cap ``n_positions - 1``);
            ``None``: no cap.

    Returns:
        ``(..., n, n)`` non-negative positions, a reverse cumulative sum along the keys.

    >>> cope_positions(torch.tensor([[1.0, 0.0], [0.5, 1.0]]))   # open gates: 1 + 0.5
    tensor([[1.0000, 0.0000],
            [1.5000, 1.0000]])
    """
    if not isinstance(gates, torch.Tensor) or not gates.is_floating_point() or gates.ndim < 2 \
            or gates.shape[-1] != gates.shape[-2]:
        raise ValueError(f"gates must be a floating tensor (..., n, n), got {getattr(gates, 'shape', type(gates))}")
    if not gates.is_meta and gates.numel() and not bool(((gates >= 0) & (gates <= 1)).all()):
        raise ValueError("gates must lie in [0, 1] (sigmoids; no NaN): a count of them is a position >= 0")
    return _count(gates, n_positions)


def _count(gates: torch.Tensor, n_positions: Optional[int]) -> torch.Tensor:
    """:func:`cope_positions` without its checks: for gates that :func:`cope_attention` computed."""
    positions = gates.flip(-1).cumsum(-1).flip(-1)
    if n_positions is not None:
        positions = positions.clamp(max=check_int("n_positions", n_positions, low=2) - 1)
    return positions


def _check_embeddings(embeddings: torch.Tensor, q: torch.Tensor, least: int) -> None:
    """``ValueError`` unless ``embeddings`` is a real ``(n_positions >= least, head_dim)`` tensor on ``q``'s
    device, finite (checked on the CPU: a table learned on a GPU is not synchronised for it)."""
    if not isinstance(embeddings, torch.Tensor) or embeddings.ndim != 2 or embeddings.shape[0] < least:
        raise ValueError(f"embeddings must be (n_positions >= {least}, head_dim), got "
                         f"{tuple(getattr(embeddings, 'shape', ())) or type(embeddings).__name__}")
    if embeddings.shape[-1] != q.shape[-1]:
        raise ValueError(f"embeddings must be (n_positions, head_dim={q.shape[-1]}), got {tuple(embeddings.shape)}")
    if embeddings.dtype == torch.bool or embeddings.is_complex():
        raise ValueError(f"embeddings must hold real numbers, got dtype {embeddings.dtype}")
    if embeddings.device != q.device:
        raise ValueError(f"embeddings are on {embeddings.device} but q on {q.device}")
    _finite("embeddings", embeddings)


def cope_position_logits(q: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``q_i . e[p_ij]`` with ``e[p]`` interpolated linearly between integer positions, in the efficient form.

    Args:
        q: ``(batch, heads, q_len, head_dim)`` floating point.
        embeddings: ``(n_positions, head_dim)`` learned ``e[0] .. e[n_positions - 1]``.
        positions: ``(batch, heads, q_len, k_len)`` in ``[0, n_positions - 1]``
            (integers or floats).

    Returns:
        ``(batch, heads, q_len, k_len)``: ``(1 - w) q_i . e[floor p] + w q_i . e[ceil p]``.

    Raises:
        TypeError: for a ``q`` that is not a tensor (or a NumPy array).
        ValueError: for an integer ``q``; embeddings of another shape, dtype
            (boolean, complex) or device, NaN or infinite; positions that are
            boolean, complex, NaN or infinite, of another shape or device, or
            outside ``[0, n_positions - 1]``.
    """
    q = _float_tensor(q, "q")
    if q.ndim < 2:
        raise ValueError(f"q must be (batch, heads, q_len, head_dim), got {tuple(q.shape)}")
    _check_embeddings(embeddings, q, least=1)
    positions = _real_tensor(positions, "positions")
    if positions.device != q.device:
        raise ValueError(f"positions are on {positions.device} but q on {q.device}")
    if positions.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"positions must be (batch, heads, q_len, k_len) for q {tuple(q.shape)}, got "
                         f"{tuple(positions.shape)}")
    if not positions.is_meta and bool(((positions < 0) | (positions > embeddings.shape[0] - 1)).any()):
        raise ValueError(f"positions must lie in [0, n_positions - 1] = [0, {embeddings.shape[0] - 1}] (cap them)")
    return _position_logits(q, embeddings, positions)


def _position_logits(q: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`cope_position_logits` without its checks: for positions that :func:`cope_positions` capped."""
    at_integers = q @ embeddings.to(q.dtype).T  # (batch, heads, q_len, n_positions): q_i . e[t]
    floor = positions.detach().floor()
    w = positions - floor  # the gradient reaches the gates through w
    low = at_integers.gather(-1, floor.long())
    high = at_integers.gather(-1, positions.detach().ceil().long())
    return (1 - w) * low + w * high


def cope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    embeddings: torch.Tensor,
    *,
    scale: Optional[float] = None,
    window: Optional[int] = None,
    return_weights: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Causal softmax attention with CoPE: ``softmax(scale q_i . k_j + q_i . e[p_ij])``.

    Gates ``sigmoid(scale q_i . k_j)`` on the keys a query may see, positions
    :func:`cope_positions` capped at ``n_positions - 1``, position logits
    :func:`cope_position_logits`. Explicit ``O(n^2)`` scores: the gates need them.

    Args:
        q, k: ``(batch, heads, seq, head_dim)``; v: ``(batch, heads, seq, v_dim)``.
        embeddings: ``(n_positions, head_dim)``, ``n_positions >= 2``.
        scale: multiplier of ``q . k``; default ``1 / sqrt(head_dim)``.
        window: each query sees its ``window`` most recent keys (itself included).
        return_weights: also return the ``(batch, heads, seq, seq)`` probabilities.

    Returns:
        ``(batch, heads, seq, v_dim)``, or ``(output, weights)``. Half
        precision is computed in float32 and cast back.

    Raises:
        TypeError: for a ``q``, ``k`` or ``v`` that is not a tensor.
        ValueError: for ``q``, ``k``, ``v`` of other ranks, lengths, dtypes or
            devices, NaN or infinite ``q`` or ``k`` (they would count NaN
            positions), embeddings of another shape than ``(n_positions >= 2,
            head_dim)``, of another device, boolean, complex, NaN or infinite
            (the finiteness of ``q``, ``k`` and the embeddings is checked on the
            CPU only), or a flag other than True or False.
    """
    _check_qkv(q, k, v)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"CoPE counts keys back from the query: q and k need one length, got {q.shape[2]} and "
                         f"{k.shape[2]}")
    _check_embeddings(embeddings, q, least=2)
    _finite("q", q)
    _finite("k", k)
    return_weights = check_bool("return_weights", return_weights)
    if q.dtype in (torch.float16, torch.bfloat16):  # the counted positions need float32 (bfloat16: 0.25 at 64)
        out = cope_attention(q.float(), k.float(), v.float(), embeddings.float(), scale=scale, window=window,
                             return_weights=return_weights)
        return tuple(t.to(q.dtype) for t in out) if isinstance(out, tuple) else out.to(q.dtype)
    if split_by_sequence(q, k, (q, k, v, embeddings)):
        return per_sequence(lambda b: cope_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], embeddings, scale=scale,
                                                     window=window, return_weights=return_weights), q.shape[0])
    scaled, scale = _scaled(q, scale)
    allowed = _allowed(q.shape[2], window, q.device)
    scores = scaled @ k.transpose(-2, -1) * scale
    gates = torch.sigmoid(scores).masked_fill(~allowed, 0.0)
    positions = _count(gates, embeddings.shape[0])  # in [0, n_positions - 1]: sums of gates, capped
    logits = (scores + _position_logits(q, embeddings, positions)).masked_fill(~allowed, float("-inf"))
    weights = logits.softmax(-1)  # every row allows its diagonal (a window holds at least the query itself)
    out = weights @ v
    return (out, weights) if return_weights else out


@register_scheme("cope")
class CoPE(PositionScheme):
    """CoPE as a position scheme: ``TinyLM(position="cope", n_positions=64)``.

    Softmax layers hand their queries, keys and values to :meth:`attend`
    (:func:`cope_attention` with the layer's table). The tables, one per
    layer shared by its heads, are ``embeddings`` ``(n_layers, n_positions,
    head_dim)``, zeros at first (the paper's code), so an untrained CoPE model
    starts as NoPE. No rotation, no added embedding, no distance table;
    positions beyond ``n_positions - 1`` read the last embedding. Explicit
    position ids (randomized positions, PoSE) change nothing: only the order
    of the tokens enters.

    Args:
        n_positions: number of learned position embeddings (``>= 2``): the
            cap on a counted position is ``n_positions - 1``.
    """

    name = "cope"
    #: Explicit position ids (``model(idx, positions=...)``) are ignored: CoPE counts positions from the content.
    reads_ids = False

    def __init__(self, n_positions: int = 64) -> None:
        super().__init__()
        self.n_positions = check_int("n_positions", n_positions, low=2)

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        if "embeddings" not in self._parameters:
            self.embeddings = nn.Parameter(torch.zeros(n_layers, self.n_positions, self.head_dim))

    @property
    def attends(self) -> bool:
        """True: softmax layers call :meth:`attend` instead of their own attention."""
        return True

    @property
    def biases(self) -> bool:
        """True: CoPE adds to the logits, so only softmax layers can take it."""
        return True

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: Optional[int] = None,
               sinks: int = 0, return_weights: bool = False, layer: int = 0, cache_positions: bool = False):
        """Layer ``layer``'s attention: :func:`cope_attention` with ``embeddings[layer]``."""
        self._require_bound()
        if sinks or check_bool("cache_positions", cache_positions):
            raise ValueError("CoPE counts positions from the content: it does not combine with StreamingLLM's "
                             "kept first tokens (model.sinks)")
        layer = check_int("layer", layer, low=0)
        if layer >= len(self.embeddings):
            raise ValueError(f"layer must be one of the model's {len(self.embeddings)} layers (0 .. "
                             f"{len(self.embeddings) - 1}), got {layer}")
        return cope_attention(q, k, v, self.embeddings[layer], window=window, return_weights=return_weights)
