"""RoPE as a position scheme (Su et al., 2021, "RoFormer"): queries and keys rotated in every layer.

``TinyLM(position="rope")`` builds :class:`RoPE`, ``TinyLM(position="p_rope", p=0.75)``
:class:`PRoPE` (p-RoPE: the slowest frequencies left unrotated); RoPE's evaluation-time scaling
rules (PI, NTK-aware, YaRN, Llama 3, dynamic NTK, ReRoPE, Self-Extend) are in
:mod:`posenc.extend`. The rotation itself, functions and the
:class:`RotaryEmbedding` module, is in :mod:`posenc.rotary`, and every name of
it can be imported from here too (``posenc.rope.apply_rope``).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from ._validate import check_bool, check_int, check_number, check_stacked_qk
from .extend import RopeScaling, rope_scaling
from .rerope import rerope_attention, self_extend_attention, streaming_attention
from . import rotary as _rotary
from .rotary import *  # noqa: F401,F403  (the rotation, re-exported: posenc.rope.apply_rope)
from .rotary import RotaryEmbedding, _check_base, p_rope_frequencies
from .scheme import PositionScheme, _kept, register_scheme

__all__ = [*_rotary.__all__, "RoPE", "PRoPE"]


@register_scheme("rope")
class RoPE(PositionScheme):
    """RoPE as a position scheme (Su et al., 2021): rotates queries and keys in every layer.

    Args:
        base: the base of the frequencies ``base^(-2i/d)``.
        interleaved: pair channels ``(2i, 2i+1)`` instead of ``(i, i + d/2)``.
        partial: the fraction of each head's channels that is rotated, in
            ``(0, 1]`` (GPT-NeoX's ``rotary_pct``): the first
            ``int(partial * head_dim)`` channels (an even number >= 2) carry
            position, the rest none. Part of the architecture (the cache key).
        original_max_position: the training length used by scaling rules that
            need it; ``None``: the model's ``train_len``. Not part of the cache key.

    Evaluation-time scaling: :attr:`scaling` (``model.rope_scaling``), a
    :class:`RopeScaling` or ``None``. Frequency rules replace the rotation's
    frequencies (and, for YaRN, multiply cos and sin by its temperature); ReRoPE
    and Self-Extend replace the attention itself (:meth:`attend`).

    Shapes: ``rotate(qk)``: ``(2, batch, heads, seq, head_dim)``, ``head_dim`` even.
    """

    name = "rope"
    retunable = ("base",)  # the frequencies only, no weights: ABF changes it on a trained model

    def __init__(self, base: float = 10000.0, *, interleaved: bool = False, partial: float = 1.0,
                 original_max_position: Optional[int] = None) -> None:
        super().__init__()
        self.base, self.interleaved = _check_base(base), check_bool("interleaved", interleaved)
        partial = check_number("partial (the rotated fraction of each head)", partial, 0, what=" and <= 1")
        if partial > 1:
            raise ValueError(f"partial (the rotated fraction of each head) must be in (0, 1], got {partial!r}")
        if original_max_position is not None:
            original_max_position = check_int("original_max_position", original_max_position, low=2)
        self._partial, self._original = partial, original_max_position
        self._rotary: Optional[RotaryEmbedding] = None
        self._scaling: Optional[RopeScaling] = None
        self._scaled: Dict[Any, RotaryEmbedding] = {}
        self.rotary_dim: Optional[int] = None

    @property
    def partial(self) -> float:
        """The rotated fraction of each head's channels."""
        return self._partial

    @property
    def original_max_position(self) -> Optional[int]:
        """The training length given at construction (``None``: the model's ``train_len``)."""
        return self._original

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self._require_even_head_dim()
        rotary_dim = int(self.head_dim * self._partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"partial={self._partial:g} rotates int({self._partial:g} * head_dim {self.head_dim}) = "
                             f"{rotary_dim} channels; it must be an even number >= 2")
        self.rotary_dim = rotary_dim
        self._rotary = RotaryEmbedding(rotary_dim, self.base, interleaved=self.interleaved)

    def config(self) -> Dict[str, Any]:
        out = super().config()
        out.pop("rotary_dim", None)  # follows from partial and the model's sizes
        if self._partial != 1:
            out["partial"] = self._partial
        return out

    @property
    def scaling(self) -> Optional[RopeScaling]:
        """The evaluation-time scaling (a :class:`RopeScaling`), or ``None`` for plain RoPE."""
        return self._scaling

    @scaling.setter
    def scaling(self, value: Any) -> None:
        self.set_scaling(value)

    def set_scaling(self, value: Any, *, train_len: Optional[int] = None) -> None:
        """Set :attr:`scaling` from anything :func:`rope_scaling` accepts.

        A rule that needs the training length takes it from the value itself,
        else from ``original_max_position``, else from ``train_len``; none of
        them: ``ValueError``.
        """
        scaling = rope_scaling(value)
        if scaling is not None and scaling.needs_original and scaling.original_max_position is None:
            original = self._original if self._original is not None else train_len
            if original is None:
                raise ValueError(f"rope scaling {scaling.method!r} needs the training length: set model.train_len "
                                 "(pe.train does), pass original_max_position to the scheme, or put it in the "
                                 "scaling")
            scaling = scaling.with_original(original)
        self._scaling, self._scaled = scaling, {}

    @property
    def attends(self) -> bool:
        """True when the scaling replaces the attention itself (ReRoPE, Self-Extend): see :meth:`attend`."""
        return self._scaling is not None and self._scaling.two_pass

    def _rotary_at(self, seq_len: int) -> RotaryEmbedding:
        s = self._scaling
        if s is None or s.two_pass or (s.depends_on_length and seq_len <= s._original()):
            return self._rotary
        return _kept(self._scaled, seq_len if s.depends_on_length else None,
                     lambda: RotaryEmbedding(self.rotary_dim, self.base, interleaved=self.interleaved,
                                             inv_freq=s.inv_freq(self.rotary_dim, self.base, seq_len),
                                             attention_factor=s.attention_scale()))

    def rotate(self, qk: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        self._require_bound(self._rotary)
        check_stacked_qk(self, qk, positions)
        if positions is not None:  # (batch, seq) ids; a rule that depends on the length sees max id + 1
            rotary = self._rotary_at(int(positions.max()) + 1 if positions.numel() else 0)
            head = qk[..., :self.rotary_dim]
            rotated = torch.stack(rotary(head[0], head[1], positions))
            if self.rotary_dim == qk.shape[-1]:
                return rotated
            rest = qk[..., self.rotary_dim:]
            if rotary.attention_factor != 1:
                rest = rest * rotary.attention_factor
            return torch.cat((rotated, rest), dim=-1)
        rotary = self._rotary_at(qk.shape[-2])
        if self.rotary_dim == qk.shape[-1]:
            return rotary.rotate_stacked(qk)
        rest = qk[..., self.rotary_dim:]
        if rotary.attention_factor != 1:  # YaRN's temperature: every channel, so the logits get its square
            rest = rest * rotary.attention_factor
        return torch.cat((rotary.rotate_stacked(qk[..., :self.rotary_dim]), rest), dim=-1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: Optional[int] = None,
               sinks: int = 0, return_weights: bool = False, cache_positions: bool = False):
        """ReRoPE or Self-Extend attention of unrotated ``q``, ``k`` (``(batch, heads, seq, head_dim)``).

        ``window`` / ``sinks``: the model's sliding window and attention sinks, applied as a mask.
        ``cache_positions``: instead, StreamingLLM's sinks with positions in the rolling
        cache (:func:`posenc.streaming_attention`), with this scheme's frequencies (and
        scaling rule, if a frequency rule is set).
        """
        self._require_bound(self._rotary)
        s = self._scaling
        if check_bool("cache_positions", cache_positions):
            if s is not None and s.two_pass:
                raise ValueError(f"sinks at cache positions re-index positions themselves; they do not combine "
                                 f"with rope scaling {s.method!r}")
            if window is None:
                raise ValueError("sinks at cache positions need a window")
            rotary = self._rotary_at(q.shape[-2])
            t = rotary.attention_factor
            return streaming_attention(q * t, k * t, v, window, sinks, base=self.base, interleaved=self.interleaved,
                                       inv_freq=rotary.inv_freq, rotary_dim=self.rotary_dim,
                                       return_weights=return_weights)
        if s is None or not s.two_pass:
            raise ValueError("attend() serves the two-pass scalings ('rerope', 'self_extend'); use rotate()")
        kw = dict(base=self.base, interleaved=self.interleaved, rotary_dim=self.rotary_dim, mask_window=window,
                  sinks=sinks, return_weights=return_weights)
        if s.method == "rerope":
            return rerope_attention(q, k, v, s.window, **kw)
        return self_extend_attention(q, k, v, s.group, s.window, **kw)


@register_scheme("p_rope")
class PRoPE(RoPE):
    """p-RoPE (Barbero et al., 2025, "Round and Round We Go!"): RoPE that keeps its fastest frequencies only.

    The first ``int(p * head_dim // 2)`` channel pairs rotate at RoPE's own
    frequencies ``base^(-2i/d)``; the remaining pairs, the lowest frequencies,
    are not rotated (:func:`p_rope_frequencies`). Barbero et al. find that a
    trained Gemma uses the high frequencies for positional patterns and the
    low ones as (position-fragile) semantic channels, and that removing the
    lowest quarter (``p = 0.75``) keeps or improves perplexity. ``p = 1`` is
    :class:`RoPE`, ``p = 0`` is no position at all (NoPE). ``TinyLM(position="p_rope", p=0.25)``
    (``"p-rope"`` is accepted too).

    Not to be confused with ``RoPE(partial=...)`` (GPT-NeoX's ``rotary_pct``),
    which rotates the first channels with a smaller RoPE's frequencies
    ``base^(-2i/(p d))``: the whole spectrum in fewer channels.

    Evaluation-time scaling rules (``model.rope_scaling``) are RoPE's and are
    not defined for p-RoPE here: setting one raises ``ValueError``.

    Args:
        p: the kept fraction of the frequencies, in ``[0, 1]``.
        base, interleaved: as :class:`RoPE`.
    """

    name = "p_rope"

    def __init__(self, p: float = 0.75, base: float = 10000.0, *, interleaved: bool = False) -> None:
        super().__init__(base, interleaved=interleaved)
        p_rope_frequencies(2, self.base, p)  # checks p
        self.p = float(p)
        self.rotated_pairs: Optional[int] = None

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.rotated_pairs = int(self.p * self.head_dim // 2)
        self._rotary = RotaryEmbedding(self.head_dim, self.base, interleaved=self.interleaved,
                                       inv_freq=p_rope_frequencies(self.head_dim, self.base, self.p))

    def config(self) -> Dict[str, Any]:
        out = super().config()
        out.pop("rotated_pairs", None)  # follows from p and the model's sizes
        return out

    def set_scaling(self, value: Any, *, train_len: Optional[int] = None) -> None:
        if rope_scaling(value) is not None:
            raise ValueError("rope scaling rules are defined for full RoPE; p-RoPE (position='p_rope') takes none")
        super().set_scaling(None)
