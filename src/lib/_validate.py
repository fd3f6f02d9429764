"""Argument checks shared by the modules: clear ``ValueError``s on bad input."""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import operator
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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


class FlagError(ValueError, TypeError):
    """A flag that is not True or False: a ``ValueError``, as every wrong argument of the library, and a
    ``TypeError`` too, which some flags raised before (code that catches that keeps working)."""


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a Python bool (``True``/``False``, NumPy and one-element tensor booleans too), else
    :class:`FlagError` (a ``ValueError``).

    A truthy string such as ``"no"`` is refused, not read as ``True``; so are the integers 0 and 1.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        value = bool(value.item())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise FlagError(f"{name} must be True or False, got {value!r}")


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


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute distances and biases in: float32 for half precision (float16 holds no integer above
    65504, bfloat16 rounds those above 256), ``dtype`` itself otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_device(device: Any, default: Optional[torch.device] = None) -> Optional[torch.device]:
    """``device`` as a ``torch.device`` (``default`` when None), else raise ``ValueError``."""
    if device is None:
        return default
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r}") from None


def one_of(name: str, value: Any, choices: Sequence[str], *, also: str = "",
           aliases: Optional[Dict[str, str]] = None) -> str:
    """``value`` as the member of ``choices`` it names, else ``ValueError`` ("did you mean ...?" for a near miss).

    Case and ``-`` / ``_`` do not matter (``"RoPE"`` is ``"rope"``, ``"p-rope"``
    is ``"p_rope"``). ``also`` completes "must be one of (...)" with what else
    is accepted; ``aliases`` maps other names (lower case) to choices.

    >>> one_of("position", "ALiBi", ("rope", "alibi"))
    'alibi'
    >>> one_of("position", "alibbi", ("rope", "alibi"))
    Traceback (most recent call last):
    ...
    ValueError: position must be one of ('rope', 'alibi'), got 'alibbi'; did you mean 'alibi'?
    """
    choices = tuple(choices)
    if isinstance(value, str):
        if value in choices:
            return value
        folded = {**{_folded(a): c for a, c in (aliases or {}).items()}, **{_folded(c): c for c in choices}}
        if _folded(value) in folded:
            return folded[_folded(value)]
        near = difflib.get_close_matches(_folded(value), list(folded), n=1, cutoff=0.6)
        hint = f"; did you mean {folded[near[0]]!r}?" if near else ""
    else:
        hint = ""
    raise ValueError(f"{name} must be one of {choices}{also}, got {value!r}{hint}")


def _folded(name: str) -> str:
    return name.strip().lower().replace("-", "_")


#: Memory orders of queries, keys and values: ``"bhsd"`` ``(batch, heads, seq, head_dim)``, the library's,
#: and ``"bshd"`` ``(batch, seq, heads, head_dim)`` (what ``x.view(b, n, h, d)`` of a projection gives).
LAYOUTS: Tuple[str, ...] = ("bhsd", "bshd")


def check_layout(layout: Any) -> str:
    """``layout`` as one of :data:`LAYOUTS`, else ``ValueError``."""
    return one_of("layout", layout, LAYOUTS, also=" ('bhsd': (batch, heads, seq, head_dim); 'bshd': "
                  "(batch, seq, heads, head_dim))")


def check_id_shape(positions: Any, batch: Optional[int], seq: int, of: str) -> torch.Tensor:
    """``positions`` if it is integer ids of shape ``(seq,)`` or ``(batch, seq)`` (only ``(seq,)`` where ``batch``
    is ``None``), else ``ValueError`` naming ``of``, what they are the positions of (``"idx of shape (2, 5)"``)."""
    shapes = [(seq,)] if batch is None else [(seq,), (batch, seq)]
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int64, torch.int32, torch.int16) \
            or tuple(positions.shape) not in shapes:
        raise ValueError(f"positions must be integer ids of shape {' or '.join(map(str, shapes))} for {of}, got "
                         f"{getattr(positions, 'shape', type(positions).__name__)} {getattr(positions, 'dtype', '')}")
    return positions


def check_stacked_qk(scheme: Any, qk: Any, positions: Any = None) -> None:
    """For a bound scheme's rotations: raise ``ValueError`` unless ``qk`` is ``(2, batch, n_heads, seq, head_dim)``
    of its model's sizes and ``positions`` (if given) ``(batch, seq)`` or ``(seq,)``.

    The layout cannot be read off a shape in general, but the model's sizes
    catch queries and keys passed as ``(2, batch, seq, heads, head_dim)``.
    """
    name, heads, head_dim = type(scheme).__name__, scheme.n_heads, scheme.head_dim
    shape = tuple(qk.shape) if isinstance(qk, torch.Tensor) else None
    if shape is None or len(shape) != 5 or shape[0] != 2 or shape[2] != heads or shape[4] != head_dim:
        got = shape if shape is not None else type(qk).__name__
        hint = (" (is it (2, batch, seq, heads, head_dim)? transpose seq and heads: qk.transpose(2, 3))"
                if shape is not None and len(shape) == 5 and shape[3] == heads != shape[2] else "")
        raise ValueError(f"{name}.rotate expects queries and keys stacked as (2, batch, heads={heads}, seq, "
                         f"head_dim={head_dim}), got {got}{hint}")
    if positions is not None and tuple(getattr(positions, "shape", ())) not in ((shape[1], shape[3]), (shape[3],)):
        raise ValueError(f"{name}.rotate: positions must be (batch, seq) = {(shape[1], shape[3])} or (seq,) ids "
                         f"for qk of shape {shape}, got {getattr(positions, 'shape', type(positions).__name__)}")


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


# ---------------------------------------------------------------------------
# Tensor arguments (posenc.sinusoidal, posenc.rotary, posenc.xpos, posenc.rerope): a clear ValueError
# (TypeError for a wrong kind of object) saying what was expected.
# ---------------------------------------------------------------------------


def _tensor(x: Any, name: str) -> torch.Tensor:
    """A tensor as it is, a NumPy array as a tensor; ``TypeError`` for any other object."""
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (or a NumPy array), got {type(x).__name__}")
    return x


def _float_tensor(x: Any, name: str) -> torch.Tensor:
    """Queries, keys, embeddings: a floating-point tensor (a rotation of integers or booleans is meaningless)."""
    x = _tensor(x, name)
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype} "
                         f"(convert it, e.g. {name}.float())")
    return x


def _real_tensor(values: Any, name: str) -> torch.Tensor:
    """Positions, distances, frequencies: a tensor (NumPy arrays, sequences and numbers converted) of finite
    integers or floats; ``ValueError`` for booleans, complex numbers, NaN or infinities."""
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.as_tensor(np.ascontiguousarray(values) if isinstance(values, np.ndarray) else values)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a tensor, a NumPy array or a sequence of numbers, "
                            f"got {type(values).__name__}") from None
    if values.dtype == torch.bool or values.is_complex():
        raise ValueError(f"{name} must be integers or floating-point numbers, got dtype {values.dtype}")
    if values.is_floating_point() and values.device.type != "meta" and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} must be finite, got NaN or infinite entries")
    return values


def _align_positions(pos: torch.Tensor, batch: Sequence[int], length: int, what: str = "sequence length",
                     name: str = "x") -> torch.Tensor:
    """``pos`` (from :func:`_real_tensor`) shaped to broadcast over ``x`` of shape ``(*batch, length, dim)``.

    The rule of the library: ``(length,)`` is shared by every row; a 2-D
    ``(batch, length)`` of a 4-D ``x (batch, heads, seq, dim)``, or of a 5-D
    ``x (2, batch, heads, seq, dim)`` (queries and keys stacked, as a scheme's
    ``rotate`` hook receives them; also when ``batch == heads``), is viewed as
    ``(batch, 1, length)`` (the same positions for every head, and for queries
    and keys); any other shape
    must have at most ``x.ndim - 1`` dimensions, each 1 or equal to ``x``'s
    (right-aligned): positions never broadcast ``x`` to a larger output.
    """
    if pos.ndim == 0 or pos.shape[-1] != length:
        got = "a single number" if pos.ndim == 0 else f"shape {tuple(pos.shape)}"
        raise ValueError(f"positions must be ({length},) or (..., {length}), ending in the {what} {length}; got {got}")
    # 5-D: (batch, length) of stacked (2, batch, heads, ...), else right-aligned ((q_len, k_len) per pair of
    # (batch, heads, q_len, k_len, dim)); first size equal to both batch and heads: stacked if x starts with 2
    stacked = (len(batch) == 3 and pos.ndim == 2 and pos.shape[0] == batch[1] != 1
               and (pos.shape[0] != batch[2] or batch[0] == 2))
    aligned = pos[:, None] if pos.ndim == 2 and len(batch) == 2 or stacked else pos  # (batch, 1, length)
    fits = aligned.ndim <= len(batch) + 1
    if not fits or any(p not in (1, s) for p, s in zip(aligned.shape[:-1], batch[len(batch) + 1 - aligned.ndim:])):
        raise ValueError(f"positions of shape {tuple(pos.shape)} do not fit {name} of shape "
                         f"{(*batch, length)} + (dim,): expected ({length},), (batch, {length}) for a 4-D {name} "
                         f"(batch, heads, seq, dim) or a 5-D {name} (2, batch, heads, seq, dim), or at most "
                         f"{len(batch) + 1} dims, each 1 or the size of {name}'s (positions never enlarge {name})")
    return aligned


def _devices_here() -> List[str]:
    """The devices this machine has: ``cpu``, then ``cuda:0``, ``cuda:1``, ... and ``mps`` where available."""
    here = ["cpu"]
    if torch.cuda.is_available():
        here += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        here.append("mps")
    return here


def check_device_here(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` this machine has, else ``ValueError`` naming the devices it has.

    Used by :func:`posenc.train`, :func:`posenc.evaluate_lengths` and
    :func:`posenc.passkey_accuracy`: ``"cuda"`` without a GPU, ``"gpu"`` or
    ``0`` would otherwise fail deep inside torch.
    """
    devices = _devices_here()
    here = ", ".join(repr(name) for name in devices)
    try:
        checked = check_device(device)
    except ValueError as err:
        raise ValueError(f"{err}; this machine has {here}") from None
    index = 0 if checked.index is None else checked.index
    name = f"cuda:{index}" if checked.type == "cuda" else checked.type
    if name not in devices:
        raise ValueError(f"device {device!r} is not available: this machine has {here}")
    return checked


def check_sequence(name: str, values: Any, what: str) -> list:
    """``values`` as a list: a sequence of ``what`` (a list, tuple, 1-D tensor or array), never a single
    value or a string, else ``ValueError``."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or getattr(values, "ndim", 1) == 0:
        raise ValueError(f"{name} must be a sequence of {what}, got {values!r} (for one value: [{values!r}])")
    return list(values)


def checked_targets(targets: Any, shape: tuple, vocab_size: int, device: torch.device) -> torch.Tensor:
    """``targets`` as int64 token ids on ``device`` for a cross-entropy, else ``ValueError``.

    They must be an integer tensor of ``shape`` ``(batch, seq)``, each id in
    ``[0, vocab_size)`` or ``-100`` (ignored), and not all ``-100`` (no counted
    target: the mean would be NaN).
    """
    if not isinstance(targets, torch.Tensor):
        raise ValueError(f"targets must be a (batch, seq) tensor of token ids, got {type(targets).__name__}")
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        raise ValueError(f"targets must be integer token ids (e.g. torch.int64), got dtype {targets.dtype}")
    if tuple(targets.shape) != shape:
        raise ValueError(f"targets must have the shape of idx, (batch, seq) = {shape}, got {tuple(targets.shape)}")
    targets = targets.to(device=device, dtype=torch.long)
    counted = targets != -100
    if bool((counted & ((targets < 0) | (targets >= vocab_size))).any()):
        raise ValueError(f"targets must be token ids in [0, {vocab_size}) (vocab_size) or -100 (ignored), got "
                         f"values from {int(targets.min())} to {int(targets.max())}")
    if not bool(counted.any()):
        raise ValueError("every target is -100 (ignored): there is no counted target to average the loss over")
    return targets
