"""Numbers measured once per seed: their spread, the comparisons a verdict may make, and the prose that quotes them.

* :func:`spread` aggregates per-seed results, leaf by leaf, into
  :class:`Spread` values: the mean with the min-max range, the form the
  book's tables and prose use (``"mean (low–high)"``).
* :func:`separated` (and :meth:`Spread.below`, :meth:`Spread.above`,
  :meth:`Spread.versus`) says whether two ranges separate, the first
  condition for a verdict (:func:`posenc.judge` weighs the others). A
  comparison never reads the means alone, and refuses a NaN.
* :func:`glue` hands a number to the page's prose (myst-nb's
  ``{glue:text}`` role) and returns its text, so that no measured number is
  typed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ._validate import check_number

__all__ = ["Spread", "spread", "separated", "glue"]


Number = Union[int, float]


@dataclass(frozen=True)
class Spread:
    """A quantity measured once per seed: its ``values``, ``mean``, ``low`` (min) and ``high`` (max).

    ``format(s, ".3f")`` and ``str(s)`` give ``"mean (low–high)"``, the form
    the book's tables and prose use; comparisons of two spreads go through
    :func:`separated` or :meth:`below`, never through the means alone.

    A NaN among the values (a seed whose measurement failed) makes ``mean``,
    ``low`` and ``high`` NaN, so the table shows it; comparing such a spread
    (:meth:`below`, :meth:`above`, :meth:`versus`, :func:`separated`) raises
    ``ValueError`` rather than answer from the other seeds.
    """

    values: Tuple[float, ...]

    def __post_init__(self):
        if isinstance(self.values, (str, bytes)) or not isinstance(self.values, (tuple, list)):
            raise ValueError(f"a Spread holds a tuple of numbers, one per seed, got {self.values!r}")
        numbers = tuple(_leaf(v) for v in self.values)
        if any(v is None for v in numbers):
            raise ValueError(f"a Spread holds real numbers, one per seed (no booleans, None or text), got "
                             f"{self.values!r}")
        if not numbers:
            raise ValueError("a Spread needs at least one value")
        object.__setattr__(self, "values", numbers)  # plain floats: hashable, and equal spreads compare equal

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def low(self) -> float:
        return math.nan if self.has_nan else min(self.values)  # min() of a list with a NaN depends on its order

    @property
    def high(self) -> float:
        return math.nan if self.has_nan else max(self.values)

    @property
    def has_nan(self) -> bool:
        """Whether a seed's value is NaN."""
        return any(math.isnan(v) for v in self.values)

    @property
    def width(self) -> float:
        """``high - low``: how much the seeds disagree."""
        return self.high - self.low

    def below(self, other: Union["Spread", Number], margin: float = 0.0) -> bool:
        """Every value of ``self`` is below every value of ``other`` by more than ``margin``."""
        return _high(self) + _margin(margin) < _low(other)

    def above(self, other: Union["Spread", Number], margin: float = 0.0) -> bool:
        """Every value of ``self`` is above every value of ``other`` by more than ``margin``."""
        return _low(self) - _margin(margin) > _high(other)

    def versus(self, other: Union["Spread", Number], below: str = "below", above: str = "above",
               tie: str = "within seed noise of", equal: str = "equal to") -> str:
        """The word for ``self`` against ``other``: ``below`` or ``above`` where the seed ranges separate,
        ``equal`` where every seed of both gave one and the same value (1.00 against 1.00 is not noise), else ``tie``.

        >>> Spread((0.2, 0.3)).versus(Spread((0.5, 0.6))), Spread((1.0, 1.0)).versus(1.0)
        ('below', 'equal to')
        """
        if self.below(other):
            return below
        if self.above(other):
            return above
        return equal if _low(other) == _high(other) == self.low == self.high else tie

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        if len(self.values) == 1:
            return _signed(_format_number(self.mean, spec))
        mean, low, high = (_signed(_format_number(x, spec)) for x in (self.mean, self.low, self.high))
        # "−0.004 to −0.002" and "+0.004 to +0.013" read better than a dash between two signs
        return f"{mean} ({low}{' to ' if high[:1] in '+−' else '–'}{high})"

    def __str__(self) -> str:
        return format(self, "")

    def __float__(self) -> float:
        return self.mean


def _signed(text: str) -> str:
    """A formatted number with the typographic minus sign (U+2212) instead of the hyphen."""
    return "−" + text[1:] if text.startswith("-") else text


def _format_number(x: float, spec: str) -> str:
    """``format(x, spec)``, without the minus sign of a value that rounds to zero ("-0.00" reads "0.00", "+0.00" with "+")."""
    text = format(x, spec)
    if text.startswith("-"):
        try:
            zero = float(text.rstrip("%")) == 0.0
        except ValueError:
            zero = False
        if zero:
            text = ("+" if "+" in spec else "") + text[1:]
    return text


def _compared(x: Any) -> Union[Spread, float]:
    """``x`` as something to compare: a :class:`Spread` or a number, neither with a NaN (``ValueError`` otherwise)."""
    value = x if isinstance(x, Spread) else _leaf(x)
    if value is None:
        raise ValueError(f"a comparison takes Spreads or numbers, got {x!r}")
    if (value.has_nan if isinstance(value, Spread) else math.isnan(value)):
        raise ValueError(f"cannot compare {x!r}: a seed's value is NaN (its measurement failed)")
    return value


def _low(x: Union[Spread, Number]) -> float:
    x = _compared(x)
    return x.low if isinstance(x, Spread) else x


def _high(x: Union[Spread, Number]) -> float:
    x = _compared(x)
    return x.high if isinstance(x, Spread) else x


def _leaf(x: Any) -> Optional[float]:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.is_floating_point():
        return float(x.item())
    if hasattr(x, "dtype") and getattr(x, "shape", None) == () and hasattr(x, "item"):  # NumPy scalars
        item = x.item()
        return float(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else None
    return None


def spread(per_seed: Sequence[Any]) -> Any:
    """Aggregate per-seed results of the same structure into :class:`Spread` leaves.

    ``per_seed[i]`` is the result of seed ``i``: a number, a dict or a
    list/tuple of them, nested any depth (dict keys and list lengths must agree
    across seeds). A per-element tensor becomes a tensor-shaped list of
    spreads. Anything else is refused.

    >>> s = spread([{"a": 1.0, "b": [2.0, 3.0]}, {"a": 3.0, "b": [2.0, 5.0]}])
    >>> s["a"].mean, s["a"].low, s["a"].high, format(s["b"][1], ".1f")
    (2.0, 1.0, 3.0, '4.0 (3.0–5.0)')
    """
    if not isinstance(per_seed, (list, tuple)) or not per_seed:
        raise ValueError(f"per_seed must be a non-empty list of per-seed results, got {per_seed!r}")
    return _aggregate(list(per_seed), "result")


def _aggregate(items: List[Any], where: str) -> Any:
    first = items[0]
    numbers = [_leaf(x) for x in items]
    if all(v is not None for v in numbers):
        return Spread(tuple(numbers))
    if isinstance(first, Mapping):
        keys = list(first)
        for x in items:
            if not isinstance(x, Mapping) or list(x) != keys:
                raise ValueError(f"{where}: every seed must give the same keys {keys}, got {x!r}")
        return {k: _aggregate([x[k] for x in items], f"{where}[{k!r}]") for k in keys}
    if isinstance(first, torch.Tensor):
        for x in items:
            if not isinstance(x, torch.Tensor) or x.shape != first.shape:
                raise ValueError(f"{where}: every seed must give a tensor of shape {tuple(first.shape)}")
        return _aggregate([x.tolist() for x in items], where)
    if isinstance(first, (list, tuple)):
        for x in items:
            if not isinstance(x, (list, tuple)) or len(x) != len(first):
                raise ValueError(f"{where}: every seed must give a sequence of length {len(first)}, got {x!r}")
        return [_aggregate([x[i] for x in items], f"{where}[{i}]") for i in range(len(first))]
    raise ValueError(f"{where}: a per-seed result must be numbers, dicts, lists or tensors, got {first!r}")


def separated(a: Union[Spread, Number], b: Union[Spread, Number], margin: float = 0.0) -> bool:
    """True when the ranges of ``a`` and ``b`` do not overlap (apart by more than ``margin``).

    Raises:
        ValueError: for anything but Spreads and numbers, a NaN among them, or a
            ``margin`` that is not a finite number ``>= 0``.
    """
    margin = _margin(margin)
    return _high(a) + margin < _low(b) or _high(b) + margin < _low(a)


def _margin(margin: Any) -> float:
    """``margin`` as a float: a finite real number >= 0 (NumPy and one-element tensors too), else ``ValueError``."""
    try:
        value = check_number("margin", margin)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    return value


def glue(name: str, value: Any, spec: str = ".3f") -> str:
    """Hand ``value``, formatted with ``spec``, to the page's prose as ``{glue:text}`name```; return the text.

    A :class:`Spread` becomes ``"mean (low–high)"``, a number ``format(value,
    spec)``, a string stays as it is (without math: ``$`` is refused, since
    the page shows glued text as written). The text is glued with myst-nb (the
    website's build reads it from the executed notebook); where myst-nb is
    not installed or no kernel runs (Colab, a script) nothing is displayed.
    """
    if not isinstance(name, str) or not name or any(c.isspace() or c in "`:" for c in name):
        raise ValueError(f"name must be a non-empty name without spaces, colons or backticks, got {name!r}")
    if isinstance(value, str):
        text = value
    elif isinstance(value, Spread) or _leaf(value) is not None:
        text = format(value if isinstance(value, Spread) else _leaf(value), spec)
    else:
        raise ValueError(f"glue takes a number, a Spread or a string, got {type(value).__name__}")
    if "$" in text:  # {glue:text} pastes characters: "$L$" would reach the page as written
        raise ValueError(f"glued text is shown as it is, math is not rendered in it: keep the math in the markdown "
                         f"around {{glue:text}}`{name}`, got {text!r}")
    _myst_glue(name, text)
    return text


def _myst_glue(name: str, value: Any) -> None:
    """Glue ``value`` (text, or an object with a rich display) with myst-nb, not shown; nothing without a kernel."""
    try:
        from IPython import get_ipython
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    if get_ipython() is not None:
        myst_glue(name, value, display=False)

