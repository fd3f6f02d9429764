"""What identifies a class of yours: the SHA-256 of its source and of the module constants its methods read.

A position scheme or a data source defined in a notebook enters the run and
evaluation cache keys by its code, so that an edited method never reads an
earlier result (:meth:`posenc.PositionScheme.config`, :mod:`posenc._evalcache`).
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Dict

import numpy as np
import torch


def _code_text(code: Any) -> str:
    """The bytecode, constants and names of a code object, nested ones included (when no source is at hand)."""
    consts = [_code_text(c) if inspect.iscode(c) else repr(c) for c in code.co_consts]
    return repr((code.co_code, consts, code.co_names, code.co_varnames))


def _source_hash(cls: type, module_names: bool = True) -> str:
    """16 hex digits of the SHA-256 of the code of ``cls`` and of its user-defined bases.

    The class's source where Python can find it; otherwise (a class defined in
    a notebook cell or a console, where ``inspect.getsource`` fails) the source
    or bytecode of each of its functions, so that an edited method still
    changes the hash. The module constants its methods read count by their
    values, named with their module, or without it (``module_names=False``:
    the same class imported from another file hashes the same).
    """
    digest = hashlib.sha256()
    for klass in cls.__mro__:
        if klass.__module__.startswith(("posenc", "torch", "builtins")):
            continue
        try:
            digest.update(inspect.getsource(klass).encode())
            continue
        except (OSError, TypeError):
            pass
        for name, value in sorted(vars(klass).items()):
            function = getattr(value, "__func__", getattr(value, "fget", value))  # methods, properties
            code = getattr(function, "__code__", None)
            if code is None:
                continue
            try:
                text = inspect.getsource(function)
            except (OSError, TypeError):
                text = _code_text(code)
            digest.update(f"{name}\n{text}".encode())
    constants = sorted((name if module_names else name.rpartition(".")[2], repr(value))
                       for name, value in _constants(cls).items())  # module constants the methods read
    for name, text in constants:
        digest.update(f"{name}={text}\n".encode())
    return digest.hexdigest()[:16]


def _names(code: Any) -> set:
    """The global names a code object (and the code nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _names(const)
    return names


def _constants(cls: type) -> Dict[str, Any]:
    """Numbers, strings and tuples of them in the module globals that the methods of ``cls`` read."""
    found: Dict[str, Any] = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith(("posenc", "torch", "builtins")):
            continue
        for value in vars(klass).values():
            function = getattr(value, "__func__", getattr(value, "fget", value))
            code, space = getattr(function, "__code__", None), getattr(function, "__globals__", None)
            if code is None or space is None:
                continue
            for name in _names(code):
                constant = _plain(space.get(name))
                if name in space and constant is not None and _is_simple(constant):
                    found[f"{klass.__module__}.{name}"] = constant
    return found


_SIMPLE = (bool, int, float, str, type(None))


def _plain(value: Any) -> Any:
    """A NumPy scalar or a one-element tensor as the Python value it spells (so equal values give equal keys)."""
    if isinstance(value, np.generic) or (isinstance(value, torch.Tensor) and value.ndim == 0):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def _is_simple(value: Any) -> bool:
    if isinstance(value, _SIMPLE):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, _SIMPLE) for v in value)
