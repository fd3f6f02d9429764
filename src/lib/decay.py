"""Decayed and gated linear attention: a linear-attention state that forgets (RetNet, GLA, Mamba-2).

Causal linear attention keeps a running state ``S_t = S_{t-1} + k_t v_t^T``
and reads it with the query, ``out_t = q_t^T S_t`` (:mod:`posenc.linear`). A
token's contribution never fades, however far back it lies. Multiplying the
state by a factor ``gamma_t`` in ``(0, 1]`` at every step makes it fade::

    S_t = gamma_t S_{t-1} + k_t v_t^T,        out_t = q_t^T S_t,

so that, unrolled,

.. math:: \\text{out}_i = \\sum_{j \\le i} \\Big(\\prod_{s=j+1}^{i} \\gamma_s\\Big)\\,
          (\\phi(q_i) \\cdot \\phi(k_j))\\, v_j .

* **Fixed decay** (one rate per head, ``gamma`` of shape ``(heads,)``): the
  factor is ``gamma^(i - j)``, a function of the distance alone. This is
  RetNet's retention (Sun et al., 2023, "Retentive Network", Eqs. 1-8), whose
  heads use ``gamma_h = 1 - 2^(-5-h)`` (:func:`decay_rates` ``"retnet"``).
  It is also ALiBi carried over to linear attention: ALiBi's bias
  ``-m (i - j)`` multiplies the softmax weight ``exp(q.k)`` by
  ``exp(-m (i - j)) = gamma^(i - j)`` with ``gamma = exp(-m)``
  (:func:`decay_rates` ``"alibi"``; Press et al., 2022).
* **Gates** (one factor per head and step, ``gamma`` of shape ``(batch,
  heads, seq)``): computed from the token, ``gamma_t = sigmoid(w . x_t +
  b)^(1/tau)`` (:func:`gate_decay`): the parametrisation of Gated Linear
  Attention's gates (Yang et al., 2024, "Gated Linear Attention Transformers
  with Hardware-Efficient Training", Sec. 4.1, with ``tau = 16``; GLA itself
  gates each key channel) at the granularity of Mamba-2, one scalar per head
  and step (Dao & Gu, 2024, "Transformers are SSMs", a scalar times identity
  state transition, whose gate is ``exp(-softplus(.) a)``).
* **Gates per key channel** (``gamma`` of shape ``(batch, heads, seq, dim)``):
  ``S_t = diag(gamma_t) S_{t-1} + phi(k_t) v_t^T``, each key channel forgetting
  at its own rate, as GLA itself (``TinyLM(attention="gated", gate="channel")``).

Three forms compute the same output:

* :func:`decayed_linear_attention`: the chunkwise parallel form for training
  (RetNet's chunkwise recurrent representation, Sun et al., 2023, Eq. 7;
  GLA's chunk form; Mamba-2's SSD). Within a chunk of ``c`` tokens an
  explicit ``c x c`` masked decay matrix; across chunks a carried state.
  Products of gates are sums of log gates, and every exponential taken has a
  non-positive argument (a decay, never its inverse), so the form stays finite
  at any length and for gates close to 0 or 1;
* :func:`decayed_linear_attention_recurrent`: the recurrence above, one step
  per token (generation), with a state you can pass in and get back;
* :func:`decayed_attention_weights`: the ``n x n`` matrix of decayed scores,
  ``O(n^2)``, for inspection and as a reference.

**Normalisation.** Linear attention's denominator ``phi(q_i) . z_i`` does not
suit a decayed state (RetNet, GLA and Mamba-2 all drop it). As they do, the
output of each head is normalised instead: by default an RMSNorm over the
head's channels without gain (``normalize=True``), the mean-free form of
RetNet's GroupNorm, one group per head (Sun et al., 2023, Eq. 8), and GLA's per-head
RMSNorm; the layer's output projection follows. The norm makes each output
row scale-invariant, so RetNet's extra rescalings of ``Q K^T`` and of the decay
matrix (its Sec. 2.2, "retention score normalization") change nothing beyond
the norm's ``eps`` and are not applied. ``normalize=False`` returns the raw sum.

Tensors are ``(batch, heads, seq, head_dim)``; by default there is no feature
map (``phi`` = identity, as in RetNet and GLA) and no ``1/sqrt(d)``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ._validate import check_bool, check_float_dtype, check_int, check_number, one_of
from .alibi import alibi_slopes
from .linear import FeatureMap, _check_eps, _check_qkv, feature_map
from .transnormer import rms_norm
from .masks import _as_tensor, _LAYOUT

__all__ = [
    "DECAY_RATES",
    "decay_rates",
    "gate_decay",
    "decayed_linear_attention",
    "decayed_linear_attention_recurrent",
    "decayed_attention_weights",
]

#: The named per-head decays of :func:`decay_rates` (and ``TinyLM(attention="decay", decay=...)``).
DECAY_RATES = ("retnet", "alibi")

Decay = Union[str, torch.Tensor, List[float], Tuple[float, ...]]

#: The longest chunk of :func:`decayed_linear_attention` with gates per key channel: its decays are
#: ``(c, c, dim)`` per chunk, so the time per token grows with ``c``.
CHANNEL_CHUNK = 16


# ---------------------------------------------------------------------------
# Rates and gates
# ---------------------------------------------------------------------------


def _decay_value(decay: Any, n_heads: int) -> Union[str, List[float]]:
    """``decay`` as a Python value: a name of :data:`DECAY_RATES` (lower case) or a list of floats."""
    if isinstance(decay, str):
        return one_of("decay", decay, DECAY_RATES, also=f" or ({n_heads},) rates in (0, 1]")
    try:
        rates = _as_tensor("decay", decay, values=True, dtype=torch.float64)
    except (TypeError, ValueError):
        rates = None
    if rates is None or rates.shape != (n_heads,):
        shape = tuple(rates.shape) if rates is not None else type(decay).__name__
        raise ValueError(f"decay must be one of {DECAY_RATES} or a ({n_heads},) tensor of rates in (0, 1] "
                         f"(one per head), got {shape}")
    values = rates.detach().cpu().tolist()
    if not all(0.0 < g <= 1.0 for g in values):  # NaN fails too
        raise ValueError(f"decay rates must lie in (0, 1] (1: no decay), got {values}")
    return [float(g) for g in values]


def decay_rates(
    kind: Decay, n_heads: int, *, log: bool = False, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Per-head decay rates ``gamma_h`` in ``(0, 1]``.

    * ``"retnet"``: ``gamma_h = 1 - 2^(-5-h)``, ``h = 0 .. n_heads-1`` (Sun et
      al., 2023, Sec. 3.1: ``gamma = 1 - 2^(-5 - arange(0, h))``), from
      ``31/32`` (a memory of about 32 tokens) up towards 1;
    * ``"alibi"``: ``gamma_h = exp(-m_h)`` with ``m_h`` = :func:`posenc.alibi_slopes`
      ``(n_heads)``: the decay whose weights ``gamma^(i-j)`` are ALiBi's
      factors ``exp(-m (i - j))``;
    * ``(n_heads,)`` rates of your own (a tensor, NumPy array or sequence) in ``(0, 1]``.

    Args:
        kind: a name in :data:`DECAY_RATES` (any case) or the rates.
        n_heads: number of heads.
        log: return ``log gamma_h`` (``<= 0``), computed without rounding
            ``gamma`` first (``log1p`` for RetNet, ``-m_h`` for ALiBi).
        dtype: a floating-point dtype of the result (computed in float64).

    Returns:
        ``(n_heads,)`` tensor on the CPU.

    Raises:
        ValueError: for an unknown name, rates of another shape, or rates
            outside ``(0, 1]`` (NaN included).

    >>> decay_rates("retnet", 3, dtype=torch.float64).tolist()
    [0.96875, 0.984375, 0.9921875]
    >>> decay_rates("alibi", 2, log=True).tolist()
    [-0.0625, -0.00390625]
    """
    n_heads, dtype = check_int("n_heads", n_heads), check_float_dtype(dtype)
    value, log = _decay_value(kind, n_heads), check_bool("log", log)
    if value == "retnet":
        small = 2.0 ** (-5.0 - torch.arange(n_heads, dtype=torch.float64))
        out = torch.log1p(-small) if log else 1.0 - small
    elif value == "alibi":
        slopes = alibi_slopes(n_heads, dtype=torch.float64)
        out = -slopes if log else torch.exp(-slopes)
    else:
        rates = torch.tensor(value, dtype=torch.float64)
        out = rates.log() if log else rates
    return out.to(dtype)


def gate_decay(logits: torch.Tensor, temperature: float = 16.0, *, log: bool = False) -> torch.Tensor:
    """Gates ``gamma = sigmoid(logits)^(1/tau)`` in ``(0, 1)`` (GLA's parametrisation, one gate per head).

    ``logits`` are ``w . x_t + b`` per head and step; ``tau = temperature``
    (Yang et al., 2024, use 16) pushes the gates towards 1, a slow decay,
    whatever the logits. ``log=True`` returns ``log gamma = logsigmoid(logits)
    / tau`` (finite for every finite logit, where the gate itself can round to 0).

    Args:
        logits: floating tensor, e.g. ``(batch, heads, seq)``.
        temperature: ``tau > 0``.

    Returns:
        a tensor of the shape of ``logits``.

    >>> gate_decay(torch.tensor([0.0]), temperature=1.0).tolist()
    [0.5]
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {getattr(logits, 'dtype', type(logits))}")
    temperature = check_number("temperature", temperature, 0.0)
    out = F.logsigmoid(logits) / temperature
    return out if check_bool("log", log) else out.exp()


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def _log_gates(gamma: Any, q: torch.Tensor, log_space: bool) -> torch.Tensor:
    """``log gamma`` as ``(1 or batch, heads, seq)`` in ``q``'s dtype and device, after checking ``gamma``."""
    b, h, n, d = q.shape
    plain = not isinstance(gamma, (torch.Tensor, np.ndarray, np.generic))  # numbers: float64 for float64 queries
    try:                                                 # (float32 would round 1 - 1e-9 to 1), float32 for the rest
        g = _as_tensor("gamma", gamma, dtype=torch.float64 if plain and q.dtype == torch.float64 else None)
    except TypeError:
        raise ValueError(f"gamma must be a tensor of decays, got {type(gamma).__name__}") from None
    if tuple(g.shape) not in ((h,), (b, h, n), (b, h, n, d)):
        hint = f" ({_LAYOUT})" if g.ndim in (3, 4) and g.shape[1] == n != h else ""
        raise ValueError(f"gamma must be ({h},) (a decay per head), ({b}, {h}, {n}) (a gate per head and step) or "
                         f"({b}, {h}, {n}, {d}) (a gate per key channel, as GLA) for q {tuple(q.shape)}; "
                         f"got {tuple(g.shape)}{hint}")
    if not g.is_meta and (g.is_cpu or g.numel() <= h):  # values at hand (a GPU tensor of gates is not synced)
        with torch.no_grad():
            if log_space:
                bad, what = ~(g <= 0) | torch.isinf(g), "log decays <= 0 (finite, no NaN)"
            else:
                bad, what = ~((g > 0) & (g <= 1)), "decays in (0, 1] (no NaN)"
            if bool(bad.any()):
                raise ValueError(f"gamma must hold {what}, got {g[bad][:4].tolist()}")
    g = g.to(q.device)
    lg = g if log_space else g.log()
    lg = lg.to(q.dtype)
    return lg[None, :, None].expand(1, h, n) if lg.ndim == 1 else lg


def _check_state(state: Optional[torch.Tensor], q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    b, h, _, d = q.shape
    e = v.shape[-1]
    if state is None:
        return q.new_zeros(b, h, d, e)
    if not isinstance(state, torch.Tensor) or state.shape != (b, h, d, e) or state.dtype != q.dtype \
            or state.device != q.device:
        got = f"{tuple(state.shape)} {state.dtype} on {state.device}" if isinstance(state, torch.Tensor) \
            else type(state).__name__
        raise ValueError(f"state must be a ({b}, {h}, {d}, {e}) tensor (batch, heads, dim, v_dim) of q's dtype "
                         f"and device, {q.dtype} on {q.device}; got {got}")
    return state


def _prepare(q, k, v, gamma, feature, eps, log_space, state):
    _check_qkv(q, k, v)
    eps, log_space = _check_eps(eps), check_bool("log_space", log_space)
    lg = _log_gates(gamma, q, log_space)
    state = _check_state(state, q, v)
    phi = feature_map(feature)
    return phi(q), phi(k), lg, state, eps


def _finish(out, state, normalize, eps, return_state):
    if check_bool("normalize", normalize):
        out = rms_norm(out, eps)
    return (out, state) if check_bool("return_state", return_state) else out


# ---------------------------------------------------------------------------
# The three forms
# ---------------------------------------------------------------------------


def _segment_sums(a: torch.Tensor) -> torch.Tensor:
    """``(..., c)`` log gates -> ``(..., c, c)`` with ``[i, j] = a_{j+1} + ... + a_i`` for ``j <= i``, -inf above.

    Summed directly (a masked cumulative sum down each column, as Mamba-2's
    ``segsum``), not as a difference of prefix sums, which loses the small
    sums next to the diagonal once the prefix sums are large.
    """
    c = a.shape[-1]
    below = torch.ones(c, c, dtype=torch.bool, device=a.device).tril(-1)
    sums = a[..., :, None].expand(*a.shape, c).masked_fill(~below, 0.0).cumsum(-2)
    return sums.masked_fill(~below.logical_or(torch.eye(c, dtype=torch.bool, device=a.device)), float("-inf"))


def decayed_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: Union[torch.Tensor, List[float]],
    *,
    chunk: int = 64,
    feature: Union[str, FeatureMap, None] = None,
    normalize: bool = True,
    eps: float = 1e-6,
    log_space: bool = False,
    state: Optional[torch.Tensor] = None,
    return_state: bool = False,
):
    """Causal decayed linear attention, chunkwise parallel (for training).

    ``out_i = sum_{j<=i} (prod_{s=j+1}^{i} gamma_s) (phi(q_i) . phi(k_j)) v_j``,
    then an RMSNorm per head (``normalize``; see the module's notes). With a
    fixed ``(heads,)`` decay the factor is ``gamma^(i-j)``.

    The sequence is cut into chunks of ``c`` tokens (RetNet's chunkwise form,
    Sun et al., 2023, Eq. 7). With ``A_t`` the sum of the log gates from the
    chunk's first token to ``t``, and ``S`` the state carried in from earlier
    chunks::

        out_t = exp(A_t) phi(q_t)^T S                                   (inter-chunk)
              + sum_{j<=t in chunk} exp(A_t - A_j) (phi(q_t) . phi(k_j)) v_j    (intra-chunk)
        S <- exp(A_last) S + sum_j exp(A_last - A_j) phi(k_j) v_j^T

    ``A_t - A_j`` is summed directly over the steps ``j+1 .. t`` (no
    difference of large prefix sums), and every exponential has an argument
    ``<= 0``. Time ``O(n c d + n d e)``; memory ``O(n c + (n / c) d e)``.

    Args:
        q, k: ``(batch, heads, seq, dim)``; v: ``(batch, heads, seq, v_dim)``.
        gamma: ``(heads,)`` decays (any dtype and device; moved to ``q``'s),
            ``(batch, heads, seq)`` gates, or ``(batch, heads, seq, dim)``
            gates per key channel (GLA: ``S_t = diag(gamma_t) S_{t-1} +
            phi(k_t) v_t^T``), in ``(0, 1]``; the gate of the first token
            multiplies the incoming ``state`` only.
        chunk: ``c >= 1``; the length need not be a multiple of it. With
            gates per key channel at most :data:`CHANNEL_CHUNK`.
        feature: feature map (a name of :data:`posenc.FEATURE_MAPS`, a callable,
            or None: identity).
        normalize: RMSNorm (no gain) of every head's output over ``v_dim``;
            ``False``: the raw sum.
        eps: of the RMSNorm.
        log_space: ``gamma`` holds ``log gamma`` (``<= 0``, finite), e.g. from
            :func:`gate_decay` ``(..., log=True)``.
        state: ``(batch, heads, dim, v_dim)`` state of the tokens before ``q``
            (default zeros), as returned with ``return_state``.
        return_state: also return the state after the last token.

    Returns:
        ``(batch, heads, seq, v_dim)``, or ``(output, state)``.

    Raises:
        ValueError: for wrong shapes, decays outside ``(0, 1]`` or NaN (checked
            where their values are at hand: on the CPU, or ``(heads,)`` decays),
            ``chunk < 1``, a bad ``eps`` or ``state``.
    """
    fq, fk, lg, s, eps = _prepare(q, k, v, gamma, feature, eps, log_space, state)
    c = check_int("chunk", chunk)
    b, h, n, d = fq.shape
    e = v.shape[-1]
    if n == 0:
        return _finish(v.new_zeros(b, h, 0, e), s, normalize, eps, return_state)
    c = min(c, n, CHANNEL_CHUNK if lg.ndim == 4 else n)
    pad = (-n) % c
    if pad:  # zero keys and values, gates 1: padded steps change neither outputs nor the state
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
        lg = F.pad(lg, (0, 0, 0, pad)) if lg.ndim == 4 else F.pad(lg, (0, pad))
    chunks = (n + pad) // c
    qc, kc = fq.reshape(b, h, chunks, c, d), fk.reshape(b, h, chunks, c, d)
    vc = v.reshape(b, h, chunks, c, e)
    if lg.ndim == 4:  # a gate per key channel (GLA)
        return _finish(*_per_channel_chunks(qc, kc, vc, lg.reshape(b, h, chunks, c, d), s, n), normalize, eps,
                       return_state)
    a = lg.reshape(lg.shape[0], h, chunks, c)  # (1 or b, h, K, c)
    seg = _segment_sums(a)  # (., h, K, c, c): A_t - A_j
    inside = ((qc @ kc.transpose(-2, -1)) * seg.exp()) @ vc  # intra-chunk, (b, h, K, c, e)
    from_start = a.cumsum(-1)  # A_t, <= 0
    to_end = seg[..., -1, :]  # A_last - A_j (-inf never: j <= last)
    states = (kc * to_end.exp()[..., None]).transpose(-2, -1) @ vc  # (b, h, K, d, e)
    entering, s = _carry(s, from_start[..., -1].exp()[..., None, None], states)  # carry (., h, K, 1, 1)
    across = (qc * from_start.exp()[..., None]) @ entering  # inter-chunk
    out = (inside + across).reshape(b, h, chunks * c, e)[:, :, :n]
    return _finish(out, s, normalize, eps, return_state)


def _carry(s: torch.Tensor, carry: torch.Tensor, states: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The state entering each chunk, ``(b, h, K, d, e)``, and the state after the last.

    ``s`` the incoming ``(b, h, d, e)`` state; ``carry`` each chunk's total
    decay, ``(., h, K, 1, 1)`` (per head) or ``(b, h, K, d, 1)`` (per key
    channel); ``states`` what each chunk adds, ``(b, h, K, d, e)``.
    """
    entering = []
    for i in range(states.shape[2]):
        entering.append(s)
        s = carry[:, :, i] * s + states[:, :, i]
    return torch.stack(entering, dim=2), s


def _per_channel_chunks(qc, kc, vc, a, s, n):
    """The chunkwise form with a gate per key channel (GLA, Yang et al., 2024, Sec. 4.2): ``(out, state)``.

    ``qc, kc`` ``(b, h, K, c, d)``, ``vc`` ``(b, h, K, c, e)``, ``a`` the log
    gates ``(b, h, K, c, d)``, ``s`` the incoming ``(b, h, d, e)`` state. Within
    a chunk, ``out_t = sum_j sum_c q_tc k_jc exp(A_tc - A_jc) v_j`` with ``A``
    the running sum of the log gates from the chunk's start: the ``(c, c, d)``
    decays are formed explicitly, each an exponential of an argument ``<= 0``
    (clamped: a difference of two running sums can round above 0). The chunks
    are short (:func:`decayed_linear_attention` caps them at
    :data:`CHANNEL_CHUNK`), so the running sums stay small next to their
    differences. GLA's kernel rescales ``q`` and ``k`` by ``exp(+-A)`` inside
    a sub-chunk instead, which is faster on a GPU.
    """
    b, h, chunks, c, _ = qc.shape
    from_start = a.cumsum(-2)  # A_t per channel, <= 0
    causal = torch.ones(c, c, dtype=torch.bool, device=a.device).tril()
    decay = (from_start[..., :, None, :] - from_start[..., None, :, :]).clamp(max=0.0)  # (b, h, K, c, c, d)
    decay = decay.masked_fill(~causal[:, :, None], float("-inf")).exp()
    inside = ((qc[..., :, None, :] * kc[..., None, :, :]) * decay).sum(-1) @ vc  # intra-chunk, (b, h, K, c, e)
    to_end = (from_start[..., -1:, :] - from_start).clamp(max=0.0)  # (b, h, K, c, d): A_last - A_j
    states = (kc * to_end.exp()).transpose(-2, -1) @ vc  # (b, h, K, d, e)
    entering, s = _carry(s, from_start[..., -1, :].exp()[..., None], states)  # carry (b, h, K, d, 1)
    across = (qc * from_start.exp()) @ entering  # inter-chunk
    return (inside + across).reshape(b, h, chunks * c, -1)[:, :, :n], s


def decayed_linear_attention_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gamma: Union[torch.Tensor, List[float]],
    *,
    feature: Union[str, FeatureMap, None] = None,
    normalize: bool = True,
    eps: float = 1e-6,
    log_space: bool = False,
    state: Optional[torch.Tensor] = None,
    return_state: bool = False,
):
    """The recurrence ``S_t = gamma_t S_{t-1} + phi(k_t) v_t^T``, ``out_t = phi(q_t)^T S_t``, one step per token.

    What a model runs when it generates: a state of ``dim x v_dim`` per head,
    whatever the length. Equal to :func:`decayed_linear_attention` (same
    arguments) up to rounding; with ``state`` and ``return_state`` a long
    sequence can be fed in pieces.

    Returns:
        ``(batch, heads, seq, v_dim)``, or ``(output, state)`` with ``state``
        ``(batch, heads, dim, v_dim)``.
    """
    fq, fk, lg, s, eps = _prepare(q, k, v, gamma, feature, eps, log_space, state)
    b, h, n, _ = fq.shape
    gates = lg.exp()
    outs = []
    for t in range(n):
        gate = gates[:, :, t, :, None] if gates.ndim == 4 else gates[:, :, t, None, None]  # per channel or per head
        s = gate * s + fk[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((fq[:, :, t, None, :] @ s).squeeze(-2))
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(b, h, 0, v.shape[-1])
    return _finish(out, s, normalize, eps, return_state)


def decayed_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    gamma: Union[torch.Tensor, List[float]],
    *,
    feature: Union[str, FeatureMap, None] = None,
    log_space: bool = False,
) -> torch.Tensor:
    """The ``n x n`` decayed scores ``W_ij = (prod_{s=j+1}^{i} gamma_s) phi(q_i) . phi(k_j)``, 0 for ``j > i``.

    The weights that :func:`decayed_linear_attention` applies to the values
    before its norm (``normalize=False`` gives ``W @ v``); rows do not sum to 1.
    ``O(n^2)`` time and memory: for inspection and as a reference. With
    ``phi`` = identity and ``gamma = exp(-m)``, ``W_ij = exp(-m (i - j))
    q_i . k_j``: ALiBi's factor on the raw score.

    Args:
        q, k: ``(batch, heads, seq, dim)``.
        gamma, feature, log_space: as in :func:`decayed_linear_attention`.

    Returns:
        ``(batch, heads, seq, seq)``.
    """
    _check_qkv(q, k, k)
    lg = _log_gates(gamma, q, check_bool("log_space", log_space))
    phi = feature_map(feature)
    if lg.ndim == 4:  # a gate per key channel: sum_c q_ic k_jc exp(A_ic - A_jc), O(n^2 d)
        return torch.einsum("bhid,bhjd,bhdij->bhij", phi(q), phi(k), _segment_sums(lg.transpose(-2, -1)).exp())
    return (phi(q) @ phi(k).transpose(-2, -1)) * _segment_sums(lg).exp()
