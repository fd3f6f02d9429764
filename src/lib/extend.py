"""Stretching a trained RoPE model: scaling rules, ReRoPE, Self-Extend, and the smallest base for a length.

A RoPE model trained at length ``L`` meets, beyond ``L``, angles ``m theta_i``
that its slow channel pairs never turned through. The rules below change
the frequencies (or the positions) at evaluation time so that a longer
context looks more like the trained one:

=================  =====================================================  ==================================
method             what changes                                           paper
=================  =====================================================  ==================================
``"linear"``       every ``theta_i / s`` (position interpolation, PI)     Chen et al., 2023
``"ntk"``          base ``* s^(d/(d-2))`` (NTK-aware)                      bloc97, 2023
``"dynamic"``      NTK base recomputed from the current length ``n``;     Hugging Face (emozilla, 2023)
                   plain RoPE for ``n <= L``
``"yarn"``         per pair: extrapolate fast pairs, interpolate slow     Peng et al., 2024
                   ones, ramp between; temperature ``0.1 ln s + 1``
                   multiplies cos and sin (the logits by its square)
``"llama3"``       like YaRN's ramp, on wavelengths (Llama 3.1)           Meta, 2024
``"rerope"``       relative positions clipped at ``w``: ``min(i-j, w)``    Su, 2023
``"self_extend"``  positions beyond a neighbour window ``w`` grouped      Jin et al., 2024
                   by ``floor(. / G)``
=================  =====================================================  ==================================

The frequency rules are pure functions (:func:`rope_frequencies_interpolated`,
:func:`rope_frequencies_ntk`, :func:`rope_frequencies_yarn` and YaRN's
temperature :func:`yarn_attention_factor`, :func:`rope_frequencies_llama3`,
:func:`rope_frequencies_dynamic_ntk`). A
:class:`RopeScaling` object names a rule and its parameters; the
:class:`posenc.rope.RoPE` scheme (``TinyLM(position="rope")``) applies one at evaluation time:
``model.rope_scaling = ("yarn", 4)``, ``None`` restores plain RoPE.

ReRoPE and Self-Extend do not change frequencies: the relative position
``i - j`` that a logit sees is replaced by a function of it (ReRoPE) or of
both positions (Self-Extend) outside a window ``w`` where it stays exact.
Neither is a rotation of ``q`` and ``k`` alone, so they are computed in two
passes (Su's published form): in-window logits with ordinary RoPE, the
others with queries and keys rotated at the substitute positions, merged by
the mask before the softmax (:func:`rerope_attention`, :func:`self_extend_attention`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

import torch

from ._validate import check_bool, check_int, check_number, one_of
from .rotary import _check_base, _check_rope_dim, rope_frequencies

__all__ = [
    "rope_frequencies_interpolated",
    "rope_frequencies_ntk",
    "rope_frequencies_yarn",
    "yarn_attention_factor",
    "rope_frequencies_llama3",
    "rope_frequencies_dynamic_ntk",
    "rope_min_base",
    "ROPE_SCALING_METHODS",
    "RopeScaling",
    "rope_scaling",
]


# ---------------------------------------------------------------------------
# Frequency rules
# ---------------------------------------------------------------------------


def _check_scale(scale: float) -> float:
    s = check_number("scale factor", scale)
    if s < 1:
        raise ValueError("scale factor s = (new context length) / (trained context length) must be >= 1, "
                         f"got {scale!r}")
    return s


def rope_frequencies_interpolated(dim: int, base: float, scale: float) -> torch.Tensor:
    """Position interpolation (Chen et al., 2023): every frequency divided by ``s``.

    ``theta'_i = theta_i / s``, so position ``s * m`` gets exactly the angles that
    position ``m`` had in training: a context of ``s * L`` is squeezed into the
    trained range ``[0, L)``.

    Args:
        dim: head dimension (even).
        base: RoPE base of the trained model.
        scale: ``s >= 1``, the ratio of the new to the trained context length.

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``, usable as ``apply_rope(x, inv_freq=...)``.
    """
    s = _check_scale(scale)
    return rope_frequencies(dim, base) / s


def rope_frequencies_ntk(dim: int, base: float, scale: float) -> torch.Tensor:
    """NTK-aware scaling (bloc97, 2023): a larger base, ``base * s ** (d / (d - 2))``.

    ``theta'_i = (base * s^(d/(d-2))) ** (-2i/d)``: the fastest pair (``i = 0``,
    one radian per token) is unchanged, the slowest (``i = d/2 - 1``) is divided
    by exactly ``s``, and the pairs in between are divided by ``s ** (2i/(d-2))``,
    a geometric blend of extrapolation (high frequencies) and interpolation
    (low frequencies).

    Args:
        dim: head dimension (even, >= 4: with one pair there is nothing to blend).
        base: RoPE base of the trained model.
        scale: ``s >= 1``.

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``.
    """
    _check_rope_dim(dim)
    if dim < 4:
        raise ValueError(f"NTK-aware scaling needs head_dim >= 4 (at least two pairs), got {dim}")
    s = _check_scale(scale)
    return rope_frequencies(dim, _check_base(base) * s ** (dim / (dim - 2)))


def _yarn_correction_dim(num_rotations: float, dim: int, base: float, original_max_len: int) -> float:
    # The (fractional) pair index i whose wavelength 2*pi*base^(2i/d) fits
    # ``num_rotations`` times into the trained length: L * theta_i / (2 pi) = r.
    return dim * math.log(original_max_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies_yarn(
    dim: int,
    base: float,
    scale: float,
    original_max_len: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    *,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN's "NTK-by-parts" frequencies (Peng et al., 2024, Sec. 3.2 and Eq. 21).

    A pair that turns many times within the trained length ``L`` has seen every
    angle, so it is left alone (extrapolated); a pair that turns less than once
    is interpolated like PI (divided by ``s``); in between, a linear ramp::

        theta'_i = (1 - gamma_i) * theta_i / s + gamma_i * theta_i

    with ``gamma_i = 1`` for ``i <= low``, ``0`` for ``i >= high`` and linear
    in ``i`` between. ``low`` / ``high`` are the pair indices that complete
    ``beta_fast`` / ``beta_slow`` rotations within ``L`` (rounded down / up
    when ``truncate``), clamped as in the authors' reference code.

    Also multiply cos and sin (or ``q`` and ``k``) by :func:`yarn_attention_factor`,
    so that the logits get its square (``RotaryEmbedding(..., attention_factor=...)``;
    :class:`posenc.RopeScaling` does both).

    Args:
        dim: head dimension (even).
        base: RoPE base of the trained model.
        scale: ``s >= 1``.
        original_max_len: the trained context length ``L``.
        beta_fast: rotations above which a pair is not touched (32).
        beta_slow: rotations below which a pair is fully interpolated (1).
        truncate: round the ramp ends to whole pair indices (the reference
            code; some later models switch it off).

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``.
    """
    _check_rope_dim(dim)
    base, s = _check_base(base), _check_scale(scale)
    original_max_len = check_int("original_max_len", original_max_len)
    beta_fast, beta_slow = check_number("beta_fast", beta_fast, 0), check_number("beta_slow", beta_slow, 0)
    truncate = check_bool("truncate", truncate)
    if not beta_slow < beta_fast:
        raise ValueError(f"need 0 < beta_slow < beta_fast, got beta_slow={beta_slow!r}, beta_fast={beta_fast!r}")
    theta = rope_frequencies(dim, base)
    low = _yarn_correction_dim(beta_fast, dim, base, original_max_len)
    high = _yarn_correction_dim(beta_slow, dim, base, original_max_len)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if high == low:
        high += 1e-3  # a zero-width ramp would divide by zero
    index = torch.arange(dim // 2, dtype=torch.float64)
    interpolate = ((index - low) / (high - low)).clamp(0.0, 1.0)  # 1 - gamma
    return theta * (1 - interpolate) + theta / s * interpolate


def yarn_attention_factor(scale: float) -> float:
    """YaRN's attention temperature factor ``0.1 * ln(s) + 1`` (Peng et al., 2024, Eq. 22).

    The paper sets ``sqrt(1/t) = 0.1 ln s + 1``: multiply both cos and sin (or
    both ``q`` and ``k``) by this factor, so the logits are multiplied by its
    square. Returns 1 for ``0 < s <= 1`` (no extension).
    """
    scale = check_number("scale factor", scale, 0)
    return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0


def rope_frequencies_llama3(
    dim: int,
    base: float = 500000.0,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position: int = 8192,
) -> torch.Tensor:
    """Llama 3.1's frequency rule (Meta, 2024; ``apply_scaling`` in Meta's reference code).

    Per pair, with wavelength ``lambda_i = 2 pi / theta_i`` and ``L = original_max_position``:

    * ``lambda_i < L / high_freq_factor`` (fast pairs, many turns within ``L``): unchanged;
    * ``lambda_i > L / low_freq_factor`` (slow pairs): ``theta_i / factor`` (interpolated, as PI);
    * in between, with ``smooth = (L / lambda_i - low) / (high - low)``:
      ``theta'_i = (1 - smooth) theta_i / factor + smooth theta_i``.

    The same idea as YaRN's ramp, written on wavelengths instead of pair
    indices, and without a temperature.

    Args:
        dim: rotated head dimension (even).
        base: RoPE base of the trained model (500000 for Llama 3).
        factor: ``s >= 1``, the extension factor (8 for Llama 3.1).
        low_freq_factor, high_freq_factor: ``0 < low < high`` (1 and 4).
        original_max_position: the trained context ``L`` (8192).

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``, usable as ``apply_rope(x, inv_freq=...)``.

    >>> f = rope_frequencies_llama3(128)
    >>> bool(f[0] == rope_frequencies(128, 500000.0)[0]), bool(f[-1] == rope_frequencies(128, 500000.0)[-1] / 8)
    (True, True)
    """
    theta = rope_frequencies(dim, base)
    s = _check_scale(factor)
    low = check_number("low_freq_factor", low_freq_factor, 0)
    high = check_number("high_freq_factor", high_freq_factor, 0)
    if not low < high:
        raise ValueError(f"need 0 < low_freq_factor < high_freq_factor, got {low_freq_factor!r} and "
                         f"{high_freq_factor!r}")
    length = check_int("original_max_position", original_max_position)
    wavelength = 2 * math.pi / theta
    out = torch.where(wavelength > length / low, theta / s, theta)
    smooth = (length / wavelength - low) / (high - low)
    middle = (wavelength >= length / high) & (wavelength <= length / low)
    return torch.where(middle, (1 - smooth) * theta / s + smooth * theta, out)


def rope_frequencies_dynamic_ntk(
    dim: int, seq_len: int, original_max_position: int, base: float = 10000.0, factor: float = 1.0
) -> torch.Tensor:
    """Dynamic NTK scaling as Hugging Face computes it: a base that grows with the current length.

    For ``n = seq_len > L = original_max_position``::

        base' = base * (a n / L - (a - 1)) ** (d / (d - 2)),   a = factor,

    i.e. :func:`posenc.rope_frequencies_ntk` with the scale ``a n / L - (a - 1)``
    (``n / L`` for ``a = 1``); for ``n <= L`` plain RoPE, exactly. The model is
    untouched up to its training length and degrades gracefully beyond it.

    Args:
        dim: rotated head dimension (even, >= 4).
        seq_len: the current length ``n >= 1`` (the largest position + 1).
        original_max_position: the trained context ``L``.
        base: RoPE base of the trained model.
        factor: ``a >= 1``.

    Returns:
        ``(dim // 2,)`` float64 ``inv_freq``.

    >>> bool((rope_frequencies_dynamic_ntk(8, 100, 128) == rope_frequencies(8)).all())
    True
    """
    dim = _check_rope_dim(dim)
    if dim < 4:
        raise ValueError(f"dynamic NTK scaling needs head_dim >= 4 (at least two pairs), got {dim}")
    n = check_int("seq_len", seq_len)
    length = check_int("original_max_position", original_max_position)
    a = _check_scale(factor)
    base = _check_base(base)
    if n <= length:
        return rope_frequencies(dim, base)
    return rope_frequencies_ntk(dim, base, a * n / length - (a - 1))


# ---------------------------------------------------------------------------
# Scaling objects
# ---------------------------------------------------------------------------

#: The methods of :class:`RopeScaling` (``model.rope_scaling = (method, ...)``).
ROPE_SCALING_METHODS = ("linear", "ntk", "dynamic", "yarn", "llama3", "rerope", "self_extend")

_NEEDS_ORIGINAL = ("dynamic", "yarn", "llama3")
_TWO_PASS = ("rerope", "self_extend")
# the fields each rule reads besides its method; any other field must keep its default
_FIELDS_OF = {"linear": ("factor",), "ntk": ("factor",), "dynamic": ("factor", "original_max_position"),
              "yarn": ("factor", "original_max_position", "beta_fast", "beta_slow", "attention_factor"),
              "llama3": ("factor", "original_max_position", "low_freq_factor", "high_freq_factor"),
              "rerope": ("window",), "self_extend": ("group", "window")}
_HF_NAMES = {"original_max_position_embeddings": "original_max_position", "rope_type": "method",
             "type": "method", "group_size": "group"}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A context-extension rule for a trained RoPE model, applied at evaluation time.

    Attributes:
        method: one of :data:`ROPE_SCALING_METHODS`.
        factor: ``s >= 1``: the extension factor (``"linear"``, ``"ntk"``,
            ``"yarn"``, ``"llama3"``) or ``a`` of ``"dynamic"`` (default 1).
        original_max_position: the trained length ``L`` (``"dynamic"``,
            ``"yarn"``, ``"llama3"``); ``None``: the model's ``train_len``.
        window: ``"rerope"``, ``"self_extend"``: the window ``w`` of exact relative positions.
        group: ``"self_extend"``: the group size ``G``.
        beta_fast, beta_slow: ``"yarn"``'s ramp (32 and 1).
        low_freq_factor, high_freq_factor: ``"llama3"``'s bounds (1 and 4).
        attention_factor: ``"yarn"``'s multiplier of cos and sin (the logits
            get its square); ``None``: :func:`posenc.yarn_attention_factor` ``(s)``.

    Raises ``ValueError`` for an unknown method or a parameter out of range.

    >>> round(RopeScaling("yarn", 4.0).attention_scale(), 4)   # 0.1 ln 4 + 1, on cos and sin
    1.1386
    """

    method: str
    factor: float = 1.0
    original_max_position: Optional[int] = None
    window: Optional[int] = None
    group: Optional[int] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    attention_factor: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", one_of("rope scaling method", self.method, ROPE_SCALING_METHODS))
        unused = [f.name for f in dataclasses.fields(self) if f.name != "method" and f.name not in
                  _FIELDS_OF[self.method] and not _same(getattr(self, f.name), f.default)]
        if unused:  # a field the rule ignores would still enter config(), and the cache key
            raise ValueError(f"rope scaling {self.method!r} reads only {_FIELDS_OF[self.method]}; it does not use "
                             + ", ".join(f"{n}={getattr(self, n)!r}" for n in unused))
        object.__setattr__(self, "factor", _check_scale(self.factor))
        if self.original_max_position is not None:
            object.__setattr__(self, "original_max_position",
                               check_int("original_max_position", self.original_max_position, low=2))
        if self.method in _TWO_PASS:
            if self.window is None:
                raise ValueError(f"{self.method!r} needs a window w >= 1 of exact relative positions, e.g. "
                                 f"{('rerope', 64) if self.method == 'rerope' else ('self_extend', 4, 64)}")
            object.__setattr__(self, "window", check_int("window", self.window))
        if self.method == "self_extend":
            object.__setattr__(self, "group", check_int("group", self.group))
        if self.method == "yarn":
            rope_frequencies_yarn(4, 10000.0, self.factor, 2, self.beta_fast, self.beta_slow)  # checks the betas
            if self.attention_factor is not None:
                object.__setattr__(self, "attention_factor",
                                   check_number("attention_factor", self.attention_factor, 0))
        if self.method == "llama3":
            rope_frequencies_llama3(4, 10000.0, self.factor, self.low_freq_factor, self.high_freq_factor, 2)

    @property
    def needs_original(self) -> bool:
        """True if the rule reads the trained length ``L``."""
        return self.method in _NEEDS_ORIGINAL

    @property
    def two_pass(self) -> bool:
        """True for ReRoPE and Self-Extend: logits from two rotations merged by a mask."""
        return self.method in _TWO_PASS

    @property
    def depends_on_length(self) -> bool:
        """True if the frequencies change with the current length (``"dynamic"``)."""
        return self.method == "dynamic"

    def with_original(self, original_max_position: int) -> "RopeScaling":
        """A copy with ``original_max_position`` set; ``self`` for a rule that does not read it."""
        if not self.needs_original:
            return self
        return dataclasses.replace(self, original_max_position=original_max_position)

    def _original(self) -> int:
        if self.original_max_position is None:
            raise ValueError(f"rope scaling {self.method!r} needs the training length: give "
                             "original_max_position, or set model.train_len")
        return self.original_max_position

    def inv_freq(self, dim: int, base: float = 10000.0, seq_len: Optional[int] = None) -> torch.Tensor:
        """The ``(dim // 2,)`` float64 frequencies of this rule for ``dim`` rotated channels.

        ``seq_len``: the current length (``"dynamic"`` only; needed there).
        ReRoPE and Self-Extend keep the plain frequencies.
        """
        m = self.method
        if m == "linear":
            return rope_frequencies_interpolated(dim, base, self.factor)
        if m == "ntk":
            return rope_frequencies_ntk(dim, base, self.factor)
        if m == "dynamic":
            if seq_len is None:
                raise ValueError("dynamic NTK scaling needs seq_len, the current length")
            return rope_frequencies_dynamic_ntk(dim, seq_len, self._original(), base, self.factor)
        if m == "yarn":
            return rope_frequencies_yarn(dim, base, self.factor, self._original(), self.beta_fast, self.beta_slow)
        if m == "llama3":
            return rope_frequencies_llama3(dim, base, self.factor, self.low_freq_factor, self.high_freq_factor,
                                           self._original())
        return rope_frequencies(dim, base)

    def attention_scale(self) -> float:
        """The factor multiplying cos and sin (so the logits by its square): YaRN's temperature, else 1."""
        if self.method != "yarn":
            return 1.0
        return yarn_attention_factor(self.factor) if self.attention_factor is None else self.attention_factor

    def config(self) -> Dict[str, Any]:
        """The fields that differ from the defaults (for a training cache key)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name == "method" or getattr(self, f.name) != f.default}


def _same(value: Any, default: Any) -> bool:
    """``value`` equals a field's default (NaN never does)."""
    try:
        return bool(value == default)
    except (TypeError, ValueError, RuntimeError):
        return False


def rope_scaling(spec: Any) -> Optional[RopeScaling]:
    """A :class:`RopeScaling` from a short description, or ``None``.

    Accepted: ``None``; a :class:`RopeScaling`; a method name (``"dynamic"``);
    a tuple ``(method, factor)`` (``("yarn", 4)``, ``("linear", 2)``),
    ``("rerope", w)`` or ``("self_extend", G, w)``; a dict of fields, also in
    Hugging Face's spelling (``{"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 64}``).

    >>> rope_scaling(("self_extend", 4, 32))
    RopeScaling(method='self_extend', factor=1.0, original_max_position=None, window=32, group=4, \
beta_fast=32.0, beta_slow=1.0, low_freq_factor=1.0, high_freq_factor=4.0, attention_factor=None)
    """
    if spec is None or isinstance(spec, RopeScaling):
        return spec
    if isinstance(spec, str):
        return RopeScaling(spec)
    if isinstance(spec, dict):
        spellings: Dict[str, list] = {}  # two names of one field ("type", "rope_type") must not disagree
        for k, v in spec.items():
            spellings.setdefault(_HF_NAMES.get(k, k), []).append((k, v))
        for field, given in spellings.items():
            if len(given) > 1 and any(v != given[0][1] for _, v in given):
                raise ValueError(f"a rope scaling dict names its {field!r} twice with different values: "
                                 + ", ".join(f"{k}={v!r}" for k, v in given))
        fields = {_HF_NAMES.get(k, k): v for k, v in spec.items()}
        known = {f.name for f in dataclasses.fields(RopeScaling)}
        if "method" not in fields or set(fields) - known:
            raise ValueError(f"a rope scaling dict needs 'method' (or 'rope_type') and fields among {sorted(known)}, "
                             f"got {sorted(spec)}")
        return RopeScaling(**fields)
    if isinstance(spec, (tuple, list)) and spec and isinstance(spec[0], str):
        method, args = spec[0], tuple(spec[1:])
        names: Tuple[str, ...] = ("window",) if method == "rerope" else (
            ("group", "window") if method == "self_extend" else ("factor",))
        if len(args) > len(names):
            raise ValueError(f"rope scaling {method!r} takes {(method, *names)}, got {tuple(spec)!r}")
        return RopeScaling(method, **dict(zip(names, args)))
    raise ValueError("rope scaling must be None, a posenc.RopeScaling, a method name, a tuple like ('yarn', 4), "
                     f"('rerope', w) or ('self_extend', G, w), or a dict; got {spec!r}")


def _worst_cos_sum(context_length: int, theta: torch.Tensor, chunk: int = 4096) -> float:
    """``min over m = 0..context_length`` of ``sum_i cos(m theta_i)``, stopping at the first negative chunk."""
    worst = math.inf
    for start in range(0, context_length + 1, chunk):
        m = torch.arange(start, min(context_length + 1, start + chunk), dtype=torch.float64)
        worst = min(worst, torch.cos(m[:, None] * theta).sum(1).min().item())
        if worst < 0:
            break
    return worst


def rope_min_base(context_length: int, dim: int, *, steps_per_decade: int = 200, rel_tol: float = 1e-4) -> float:
    """The smallest RoPE base whose frequencies keep ``sum_i cos(m theta_i) >= 0`` for every ``m <= context_length``.

    Men et al., 2024 ("Base of RoPE Bounds Context Length") argue that a
    model can tell similar tokens from random ones at distance ``m`` only
    while ``B(m) = sum_{i < dim/2} cos(m * base^(-2i/dim))`` stays
    non-negative, which bounds the base from below for a context length; by
    this definition, for ``dim = 128``: about 4.3e3 for 1K tokens, 8.4e4 for
    8K, 6.3e5 for 32K. Raising the base for long context ("ABF", Xiong et al.,
    2023: 10,000 to 500,000 for 32K) is the practice this bound explains.

    ``B(m) >= 0`` is not monotone in the base (narrow windows of bases satisfy
    it below others that do not), so the bases are scanned upwards,
    ``steps_per_decade`` per factor of ten from 2, to the first that satisfies
    it; bisection between it and the one before then finds the crossing to a
    relative ``rel_tol``. A coarser scan may step over a narrow window.

    Args:
        context_length: the largest distance ``m`` (>= 1).
        dim: the rotated head dimension (even, >= 2).

    Returns:
        the base, a Python float.
    """
    context_length = check_int("context_length", context_length, low=1)
    dim = _check_rope_dim(dim)
    steps_per_decade = check_int("steps_per_decade", steps_per_decade, low=1)
    rel_tol = check_number("rel_tol", rel_tol, 0, what=" and < 1")
    if rel_tol >= 1:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol!r}")
    exponents = -2 * torch.arange(dim // 2, dtype=torch.float64) / dim
    holds = lambda base: _worst_cos_sum(context_length, torch.tensor(base, dtype=torch.float64) ** exponents) >= 0
    below, k = 2.0, 0
    if holds(below):
        return below
    while True:  # ends: for a large enough base every angle m * theta_i is small, every cosine near 1
        k += 1
        above = 2.0 * 10 ** (k / steps_per_decade)
        if holds(above):
            break
        below = above
    while above / below - 1 > rel_tol:
        middle = math.sqrt(below * above)
        below, above = (below, middle) if holds(middle) else (middle, above)
    return above
