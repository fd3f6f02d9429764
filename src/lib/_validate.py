"""Argument checks shared by the modules: clear ``ValueError``s on bad input."""

from __future__ import annotations

import inspect
import math
import numbers
import operator
import sys
import types
from typing import Any, Callable, Optional

import numpy as np
import torch

__all__: list = []  # private helpers


def check_int(name: str, value: Any, low: int = 1) -> int:
    """``value`` as a Python ``int >= low`` (NumPy and 0-d integer tensors too, never a bool), else ``ValueError``."""
    number = None
    if not isinstance(value, bool) and "bool" not in type(value).__name__ and not (
            isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        try:
            number = operator.index(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    if number is None or number < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a Python bool (``True``/``False``, NumPy and one-element tensor booleans too), else ``ValueError``.

    A truthy string such as ``"no"`` is refused, not read as ``True``.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        value = bool(value.item())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_number(name: str, value: Any, low: float = -math.inf, *, inf_ok: bool = False, what: str = "") -> float:
    """``value`` as a float: a real number (NumPy scalars and one-element real tensors too, never a bool),
    finite (or ``+inf`` if ``inf_ok``) and ``> low``; else ``ValueError``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (value.dtype == torch.bool or value.is_complex()):
        value = value.item()
    v = float(value) if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) else math.nan
    if not (v > low and (math.isfinite(v) or (inf_ok and v == math.inf))):
        bound = "" if low == -math.inf else f" > {low:g}"
        raise ValueError(f"{name} must be a {'' if inf_ok else 'finite '}number{bound}{what}, got {value!r}")
    return v


def check_even_dim(dim: Any, what: str) -> int:
    """Return ``dim`` if it is an even integer ``>= 2`` (channel pairs), else raise ``ValueError``."""
    try:
        value = check_int("dim", dim, low=2)
    except ValueError:
        value = None
    if value is None or value % 2:
        raise ValueError(f"{what} needs an even dimension >= 2, got dim={dim!r}")
    return value


def check_float_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """Return ``dtype`` if it is a floating-point ``torch.dtype``, else raise ``ValueError``."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"{name} must be a floating-point torch.dtype (torch.float32, torch.float64, torch.float16 "
                         f"or torch.bfloat16), got {dtype!r}")
    return dtype


def check_device(device: Any, default: Optional[torch.device] = None) -> Optional[torch.device]:
    """``device`` as a ``torch.device`` (``default`` when None), else raise ``ValueError``."""
    if device is None:
        return default
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r}") from None


def make_module_callable(module_name: str, function: Callable[..., Any]) -> None:
    """Make the module ``module_name`` callable as ``function``.

    ``posenc.train`` and ``posenc.attention`` are both a module (``import
    posenc.train as m`` gives the module) and, called, their main function
    (``pe.train(model, data)``), so neither name shadows the other. ``help()``
    and Jupyter's ``?`` show the function's signature and docstring first, then
    the module's (kept as ``__module_doc__`` for the API page).
    """
    module = sys.modules[module_name]
    module.__module_doc__ = module.__doc__  # type: ignore[attr-defined]
    head = f"{module_name.rsplit('.', 1)[-1]}{inspect.signature(function)}"
    module.__doc__ = (f"{head}\n\n{inspect.getdoc(function) or ''}\n\n"
                      f"The module {module_name}, of which this is the main function:\n\n{inspect.cleandoc(module.__doc__ or '')}")

    class _CallableModule(types.ModuleType):
        __doc__ = None   # pydoc drops a module docstring equal to its class's

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs)

    module.__class__ = _CallableModule
    module.__signature__ = inspect.signature(function)  # help() and editors show the function's arguments
