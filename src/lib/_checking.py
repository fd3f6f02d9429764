"""Comparing a reader's answer with the expected one, for :mod:`posenc.exercises`.

An answer is compared in its plain form (tensors and arrays as nested lists of
Python numbers): first its *kind* (how many numbers, integer or not), then each
value, with a tolerance per exercise. Messages say what was expected and
whether a number is too large or too small, never the expected value itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Callable, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class _Exercise:
    """One checker: how to compute the expected answer and what to say."""

    title: str                                   # one line, shown by exercises()
    confirm: str                                 # printed after a right answer
    hint: str                                    # printed after a wrong one
    expected: Optional[Callable[[], Any]] = None  # the value to compare with
    rtol: float = 0.0
    atol: float = 0.0
    signature: Optional[str] = None              # e.g. "slow_pairs(base, L, d)"
    reference: Optional[Callable[..., Any]] = None  # the library's version of it
    inputs: Optional[Callable[[], List[tuple]]] = None  # argument tuples to try
    fn_rtol: float = 1e-6
    fn_atol: float = 1e-9
    scheme: Optional[Callable[[Any], Tuple[bool, str]]] = None  # checks a position scheme answer


# --- Comparing an answer with the expected value ----------------------------


def _plain(x: Any) -> Any:
    """Tensors, arrays, tuples and lists as nested lists of Python scalars."""
    if isinstance(x, (str, bytes)):
        return x
    if isinstance(x, (list, tuple, range)):
        return [_plain(e) for e in x]
    if hasattr(x, "tolist") and not callable(x):  # torch tensors, numpy arrays and scalars
        return _plain(x.tolist())
    return x


def _is_number(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _kind(expected: Any) -> str:
    """What an answer should look like, in words: 'an integer', '2 numbers', ..."""
    if isinstance(expected, list):
        inner = {_kind(e) for e in expected}
        if inner <= {"an integer", "a number"}:
            noun = "integer" if inner == {"an integer"} else "number"
            return f"{len(expected)} {noun}{'' if len(expected) == 1 else 's'}"
        if len(inner) == 1:
            return f"{len(expected)} sequences of {inner.pop()}"
        return f"{len(expected)} values"
    return "an integer" if isinstance(expected, int) else "a number"


def _describe(x: Any) -> str:
    if callable(x) or isinstance(x, (list, bool, str)):
        return ("a function" if callable(x) else f"{len(x)} values" if isinstance(x, list)
                else f"the boolean {x}" if isinstance(x, bool) else f"the text {x[:20]!r}")
    return repr(x) if _is_number(x) else f"{'an' if type(x).__name__[0] in 'aeiou' else 'a'} {type(x).__name__}"


def _where(path: Tuple[int, ...]) -> str:
    return f"entry {path[0] if len(path) == 1 else path}: " if path else ""


def _kind_problem(answer: Any, expected: Any, path: Tuple[int, ...] = ()) -> Optional[str]:
    """What is wrong with the *form* of ``answer`` (length, type), or ``None``."""
    if isinstance(expected, list):
        if not isinstance(answer, list) or len(answer) != len(expected):
            return f"{_where(path)}expected {_kind(expected)}, got {_describe(answer)}"
        for i, (a, e) in enumerate(zip(answer, expected)):
            problem = _kind_problem(a, e, path + (i,))
            if problem is not None:
                return problem
        return None
    if not _is_number(answer):
        return f"{_where(path)}expected {_kind(expected)}, got {_describe(answer)}"
    if isinstance(expected, int) and isinstance(answer, float) and not answer.is_integer():
        return f"{_where(path)}expected an integer, got {answer!r}"
    return None


def _value_problem(answer: Any, expected: Any, rtol: float, atol: float,
                   path: Tuple[int, ...] = ()) -> Optional[str]:
    """The first entry of a well-formed ``answer`` that is wrong, or ``None``."""
    if isinstance(expected, list):
        for i, (a, e) in enumerate(zip(answer, expected)):
            problem = _value_problem(a, e, rtol, atol, path + (i,))
            if problem is not None:
                return problem
        return None
    if math.isnan(answer):
        return f"{_where(path)}got NaN"
    if answer == expected if isinstance(expected, int) else math.isclose(answer, expected, rel_tol=rtol, abs_tol=atol):
        return None
    return f"{_where(path)}{answer!r} is too {'large' if answer > expected else 'small'}"


def _compare(answer: Any, expected: Any, rtol: float, atol: float) -> Optional[Tuple[bool, str]]:
    """``None`` when ``answer`` matches, else ``(is_kind_error, message)``."""
    problem = _kind_problem(answer, expected)
    if problem is not None:
        return True, problem
    problem = _value_problem(answer, expected, rtol, atol)
    return None if problem is None else (False, problem)


def _show(arg: Any) -> str:
    if isinstance(arg, torch.Tensor):
        return f"<tensor of shape {tuple(arg.shape)}>"
    return f"{arg:g}" if isinstance(arg, float) else repr(arg)


def _check_function(ex: _Exercise, answer: Callable[..., Any]) -> Tuple[bool, str]:
    """Call ``answer`` on every input of ``ex`` and compare with the library."""
    name, cases = ex.signature.split("(")[0], ex.inputs()
    for args in cases:
        call = f"{name}({', '.join(_show(a) for a in args)})"
        expected = _plain(ex.reference(*args))
        try:
            got = answer(*args)
        except Exception as err:  # the student's function failed: report, don't raise
            return False, f"{call} raised {type(err).__name__}: {err}"
        problem = _compare(_plain(got), expected, ex.fn_rtol, ex.fn_atol)
        if problem is not None:
            return False, f"{call} is wrong ({problem[1]}). Hint: {ex.hint}"
    return True, f" on all {len(cases)} test inputs"


def _expected_in_words(ex: _Exercise) -> str:
    kinds = [_kind(_plain(ex.expected()))] if ex.expected is not None else []
    return " or ".join(kinds + ([f"a function {ex.signature}"] if ex.signature is not None else []))
