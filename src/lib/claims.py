"""Published claims re-tested: a verdict computed from the seed spread and the conditions of the test.

A tiny experiment can say a paper's claim holds, fails, or cannot tell, and
which of these it may say depends on the test as much as on the numbers:

* the seed ranges must separate (:class:`~posenc.spread.Spread`), or the
  difference is seed noise;
* the test must be able to fail for the right reason: a *control*, a model
  without the mechanism the claim is about, fails the same test (a task that
  a model without position information solves cannot show that a position
  scheme reaches far);
* the compared models must not all sit at the task's ceiling or floor
  (passkey accuracy 1.00 against 1.00 ranks nothing);
* the task must be learned within the training length before it is tested
  beyond it.

:func:`judge` takes the spreads and these conditions and returns a
:class:`Verdict`: ``reproduced``, ``partially reproduced``, ``not
reproduced``, ``within seed noise`` or ``not tested here``, the last two with
their reason in a few words. It never says ``reproduced`` or ``not
reproduced`` when a condition is missing.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._validate import check_int, check_number
from .spread import Spread

__all__ = ["Verdict", "judge"]

#: The five verdicts, from the strongest to the weakest statement.
OUTCOMES = ("reproduced", "partially reproduced", "not reproduced", "within seed noise", "not tested here")

Number = Union[int, float]
Measured = Union[Spread, Number]


class Verdict(str):
    """A verdict as the text a page prints (``"not tested here (every model at the ceiling)"``), with its parts.

    ``outcome`` is one of :data:`OUTCOMES`; ``reason`` the words in
    parentheses (empty for a plain outcome); ``conditions`` maps each
    condition of the test (a length, say) to its own outcome.
    """

    outcome: str
    reason: str
    conditions: Dict[str, str]

    def __new__(cls, outcome: str, reason: str = "", conditions: Optional[Mapping[str, str]] = None) -> "Verdict":
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        self = super().__new__(cls, f"{outcome} ({reason})" if reason else outcome)
        self.outcome, self.reason, self.conditions = outcome, reason, dict(conditions or {})
        return self

    @property
    def decisive(self) -> bool:
        """``True`` for ``reproduced``, ``partially reproduced`` and ``not reproduced``."""
        return self.outcome in OUTCOMES[:3]

    def sentence(self) -> str:
        """The text with its first letter capitalised (and nothing else: "L" stays "L")."""
        return self[:1].upper() + self[1:]


def _check_measured(name: str, x: Any, min_seeds: int, number: bool = True) -> Measured:
    """``x`` checked: a spread over at least ``min_seeds`` seeds, or (``number``) a finite number, a threshold."""
    if not number and not isinstance(x, Spread):
        raise ValueError(f"{name} must be a posenc.Spread over at least {min_seeds} seeds (one number is one "
                         f"measurement, not a test over seeds), got {x!r}")
    if isinstance(x, Spread):
        if len(x.values) < min_seeds:
            raise ValueError(f"{name} must hold at least {min_seeds} seeds to be compared, got {len(x.values)}")
        if not all(math.isfinite(v) for v in x.values):
            raise ValueError(f"{name} has a value that is not finite: {x.values}")
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"{name} must be a posenc.Spread over seeds or a finite number, got {x!r}")
    return float(x)


def _values(x: Measured) -> Tuple[float, ...]:
    return x.values if isinstance(x, Spread) else (float(x),)


def _better(a: Measured, b: Measured, lower: bool, margin: float) -> bool:
    """Every seed of ``a`` on the claimed side of every seed of ``b``, by more than ``margin``."""
    if lower:
        return max(_values(a)) + margin < min(_values(b))
    return min(_values(a)) - margin > max(_values(b))


def _at_bound(xs: Sequence[Measured], bound: Optional[float], tolerance: float) -> bool:
    return bound is not None and all(abs(v - bound) <= tolerance for x in xs for v in _values(x))


def _conditions(name: str, x: Any) -> Dict[str, Any]:
    if isinstance(x, Mapping):
        if not x:
            raise ValueError(f"{name} must not be empty")
        named = {str(k): v for k, v in x.items()}
        if len(named) != len(x):  # 2 and "2" would become one condition, one of the two values lost
            raise ValueError(f"{name} has conditions whose names read the same: {list(x)}")
        return named
    return {"": x}


def _names(name: str, x: Any) -> List[str]:
    """``needs`` / ``unsolved``: a list of model names (``None``: none)."""
    if x is None:
        return []
    if isinstance(x, str) or not isinstance(x, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in x):
        raise ValueError(f"{name} must be a list of model names (strings), not a single string or anything else, "
                         f"got {x!r}")
    return list(x)


def _same_conditions(name: str, given: Dict[str, Any], claimed_at: Dict[str, Any]) -> Dict[str, Any]:
    """``given`` in the order of ``claimed_at`` (the order of a dict's keys does not matter; their set does)."""
    if set(given) != set(claimed_at):
        raise ValueError(f"{name} must have the conditions of claimed, {list(claimed_at)}, got {list(given)}")
    return {key: given[key] for key in claimed_at}


def judge(claimed: Union[Measured, Mapping[Any, Measured]], against: Union[Measured, Mapping[Any, Measured]], *,
          better: str, margin: float = 0.0, control: Union[None, Measured, Mapping[Any, Measured]] = None,
          ceiling: Optional[float] = None, floor: Optional[float] = None, tolerance: float = 0.0,
          what: str = "", needs: Sequence[str] = (), unsolved: Sequence[str] = (),
          untested: Union[None, str, Mapping[Any, str]] = None,
          min_seeds: int = 3) -> Verdict:
    """The verdict on a claim that ``claimed`` is ``better`` (``"lower"`` or ``"higher"``) than ``against``.

    Args:
        claimed: the measurement of the model with the mechanism the claim is
            about, a :class:`~posenc.spread.Spread` over seeds; or a dict of
            them, one per condition of the test (``{"2L": ..., "8L": ...}``).
        against: what the claim says it beats: another model's spread (the
            comparison), or a number (a threshold: "holds within 0.02 nats");
            a dict with the keys of ``claimed`` where it has conditions.
        better: ``"lower"`` (a loss, a rise) or ``"higher"`` (an accuracy).
        margin: the ranges must separate by more than this.
        control: the same measurement on a model *without* the mechanism
            (a spread, or a dict per condition). Required where ``against``
            is a threshold, since a test that every model passes says nothing
            about the mechanism; optional for a comparison, whose ``against``
            already lacks it. The control must fail the test on every seed
            (on the other side of ``against``), or the condition is "not
            tested here".
        ceiling, floor: the best and worst values the task allows (accuracy
            1 and chance, say), whichever way the claim points (a claim that
            a model *fails* a retrieval task has ``better="lower"`` and
            still the ceiling 1). Where every seed of ``claimed`` and of
            ``against`` lies within ``tolerance`` of the same one, the
            condition is "not tested here": a test at its ceiling ranks nothing.
        what: the quantity, named in "within seed noise (what)".
        needs, unsolved: model names; if a model the claim rests on (``needs``)
            was not solved within the training length on every seed (is in
            ``unsolved``), the verdict is "not tested here (name not solved
            within L)". ``unsolved`` without ``needs`` is refused: it would be
            ignored.
        untested: a reason the design cannot speak to the claim at all (a
            task without the distances the mechanism acts on, say):
            "not tested here (untested)"; or a dict from some of the
            conditions to the reason each cannot speak (two models both worse
            than a uniform guess at 8L, say): those conditions are "not
            tested" and the verdict rests on the others.
        min_seeds: spreads with fewer seeds are refused.

    Returns:
        A :class:`Verdict`. With conditions: ``reproduced`` where every tested
        condition reproduces, ``partially reproduced (at 2L; not at 8L)``
        (conditions that are lengths read "at 2L", others "for RoPE")
        where some do, ``not reproduced`` where none does and some separate
        the other way (``not reproduced (at 8L; within seed noise at 4L)``
        where the others are within noise), else ``within seed noise``.

    >>> from posenc import Spread
    >>> judge(Spread((0.01, 0.02, 0.02)), 0.05, better="lower", control=Spread((0.3, 0.4, 0.6)))
    'reproduced'
    >>> judge(Spread((1.0, 1.0, 1.0)), Spread((1.0, 1.0, 1.0)), better="higher", ceiling=1.0)
    'not tested here (every compared model at the ceiling, 1)'
    >>> str(judge({"2L": Spread((0.1, 0.2, 0.2)), "8L": Spread((2.0, 2.5, 3.0))},
    ...           {"2L": Spread((0.5, 0.6, 0.9)), "8L": Spread((1.0, 2.1, 3.1))}, better="lower", what="rise"))
    'partially reproduced (at 2L; within seed noise at 8L)'
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', got {better!r}")
    lower = better == "lower"
    margin, tolerance = check_number("margin", margin), check_number("tolerance", tolerance)
    if margin < 0 or tolerance < 0:
        raise ValueError(f"margin and tolerance must be >= 0, got {margin} and {tolerance}")
    min_seeds = check_int("min_seeds", min_seeds, 1)
    needs, unsolved = (_names(name, x) for name, x in (("needs", needs), ("unsolved", unsolved)))
    if unsolved and not needs:
        raise ValueError(f"unsolved={list(unsolved)} without needs= would be ignored: give needs=, the models the claim "
                         "rests on (a claim is not tested where one of them is unsolved)")
    ceiling, floor = (None if b is None else check_number(name, b) for name, b in (("ceiling", ceiling), ("floor", floor)))
    if ceiling is not None and ceiling == floor:
        raise ValueError(f"ceiling and floor must differ, got {ceiling} for both")
    claimed_at = _conditions("claimed", claimed)
    untested_at: Dict[str, str] = {}
    if isinstance(untested, Mapping):
        untested_at = {str(k): v for k, v in untested.items()}
        if not untested_at or not set(untested_at) <= set(claimed_at) or list(claimed_at) == [""]:
            raise ValueError(f"untested as a dict must map some of the conditions of claimed, {list(claimed_at)}, to "
                             f"their reasons, got {list(untested)}")
        untested = None
    for reason in ([untested] if untested is not None else []) + list(untested_at.values()):
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"untested must be the reason in a few words (or a dict of them per condition), got {reason!r}")
    against_at = _same_conditions("against", _conditions("against", against), claimed_at)
    control_at = None if control is None else _same_conditions("control", _conditions("control", control), claimed_at)
    for key in claimed_at:  # every value checked, even where the verdict is decided before it is read
        where = f" at {key}" if key else ""
        claimed_at[key] = _check_measured(f"claimed{where}", claimed_at[key], min_seeds, number=False)
        against_at[key] = _check_measured(f"against{where}", against_at[key], min_seeds)
        if control_at is not None:
            control_at[key] = _check_measured(f"control{where}", control_at[key], min_seeds, number=False)
    if untested is not None:
        return Verdict("not tested here", untested.strip())
    missing = sorted(set(needs) & set(unsolved))
    if missing:
        return Verdict("not tested here", f"{' and '.join(missing)} not solved within L")

    outcome: Dict[str, str] = {}
    why: Dict[str, str] = {}
    for key, a in claimed_at.items():
        b = against_at[key]
        if key in untested_at:
            outcome[key], why[key] = "not tested here", untested_at[key].strip()
            continue
        for bound, name in ((ceiling, "ceiling"), (floor, "floor")):
            if _at_bound([a, b], bound, tolerance):
                near = f"within {tolerance:g} of the {name}" if tolerance else f"at the {name}"
                outcome[key], why[key] = "not tested here", f"every compared model {near}, {bound:g}"
                break
        else:
            if control_at is None and not isinstance(b, Spread):
                raise ValueError("a threshold test needs control=, the same measurement on a model without the "
                                 "mechanism: a test that such a model passes too cannot show the mechanism works")
            if control_at is not None and not _better(b, control_at[key], lower, 0.0):
                seeds = "" if _better(control_at[key], b, lower, 0.0) else " on some seeds"
                outcome[key], why[key] = "not tested here", f"a model without the mechanism passes the same test{seeds}"
            elif _better(a, b, lower, margin):
                outcome[key] = "reproduced"
            elif _better(b, a, lower, margin):
                outcome[key] = "not reproduced"
            else:
                outcome[key] = "within seed noise"
    return _combine(outcome, why, what)


def _combine(outcome: Dict[str, str], why: Dict[str, str], what: str) -> Verdict:
    if list(outcome) == [""]:  # one condition
        kind = outcome[""]
        reason = why.get("", what if kind == "within seed noise" else "")
        return Verdict(kind, reason)
    tested = {k: v for k, v in outcome.items() if v != "not tested here"}
    if not tested:
        reasons = list(dict.fromkeys(why.values()))
        return Verdict("not tested here", "; ".join(reasons), outcome)
    groups: Dict[str, List[str]] = {}
    for key, kind in outcome.items():
        groups.setdefault(kind, []).append(key)

    def at(kind: str, words: str) -> str:  # "at 2L, 4L" for lengths, "for RoPE" for models
        if kind not in groups:
            return ""
        keys = groups[kind]
        if all(re.fullmatch(r"[\d.]*[×x]?L|[\d.]+", k) for k in keys):
            return f"{words} at {', '.join(keys)}"
        by_model: Dict[str, List[str]] = {}  # "ALiBi at 1024", "ALiBi at 2048" read "ALiBi at 1024, 2048"
        for k in keys:
            model, sep, where = k.rpartition(" at ")
            by_model.setdefault(model if sep else k, []).append(where if sep else "")
        if len(by_model) <= 2 and all(all(ws) for ws in by_model.values()) and len(by_model) < len(keys):
            grouped = [f"{model} at {', '.join(where)}" for model, where in by_model.items()]
            return f"{words} for {' and '.join(grouped)}"
        return f"{words} for {', '.join(keys)}"

    kinds = set(tested.values())
    if kinds == {"reproduced"}:
        kind = "reproduced"
    elif "reproduced" in kinds:
        kind = "partially reproduced"
    elif "not reproduced" in kinds:  # none reproduces, some separate the other way: the rest within noise
        kind = "not reproduced"
    else:
        kind = "within seed noise"
    parts = [at("reproduced", "") if kind == "partially reproduced" else "",
             at("not reproduced", "not" if kind == "partially reproduced" else "") if len(kinds) > 1 else "",
             at("within seed noise", "within seed noise") if kind != "within seed noise" else "",
             at("not tested here", "not tested")]
    if kind == "within seed noise" and what:
        parts.insert(0, what)
    reason = "; ".join(p.strip() for p in parts if p)
    return Verdict(kind, reason, outcome)
