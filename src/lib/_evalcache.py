"""A cache of evaluations: the same weights, settings, data and arguments give the same numbers.

Running a chapter again (its test after the book's build, the summary chapter
after the chapters it gathers) evaluates the same trained models at the same
lengths again: :func:`posenc.evaluate_lengths` and
:func:`posenc.passkey_accuracy` keep what they measured in
``$POSENC_CACHE/evals`` (or ``~/.cache/posenc/evals``) and return it when
asked the same question.

The key is the SHA-256 of everything the answer depends on: every parameter
and buffer of every submodule of the model (their bytes), every setting a
submodule holds (a window, the sinks, a RoPE scaling, ...; not the tables a
``posenc`` class computes from them and keeps in ``_cache``), the classes (the
source of any class defined outside ``posenc`` and ``torch``), the data's
class and ``config``, every argument, the source of the whole ``posenc``
package, the torch version, the device and the CPU kernel set. A model the
key cannot describe (a forward hook, a replaced ``forward``, a setting of a
kind it does not know) is evaluated and not cached. An entry is written
atomically with a digest of its result (:func:`digest`) and checked when
read: one whose result no longer matches its digest (a damaged or edited
file), that has no digest, or that cannot be used otherwise, is warned about
and replaced.
``POSENC_EVAL_CACHE=0`` turns the cache off; delete the folder to measure
everything anew.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from .runtime import _atomic_save, cache_dir
from ._source import _source_hash
from .scheme import PositionScheme

_VERSION = 1


class _Uncacheable(Exception):
    """The key cannot describe this model or argument: evaluate without the cache."""


@functools.lru_cache(maxsize=1)
def _library_digest() -> str:
    """SHA-256 of every ``.py`` file of the ``posenc`` package: an edit to the library measures anew."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _tensor(value: torch.Tensor) -> list:
    t = value.detach().to("cpu").contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ["tensor", str(t.dtype), list(t.shape), hashlib.sha256(data).hexdigest()]


def _plain(value: Any) -> Any:
    """``value`` as JSON data that identifies it, or :class:`_Uncacheable`."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_plain(v) for v in value]]
    if isinstance(value, (set, frozenset)):
        return ["set", sorted(json.dumps(_plain(v), sort_keys=True) for v in value)]
    if isinstance(value, dict):
        return ["dict", sorted([json.dumps(_plain(k), sort_keys=True), _plain(v)] for k, v in value.items())]
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, (torch.dtype, torch.device, enum.Enum)):
        return [type(value).__name__, str(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__qualname__, {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}]
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # a NumPy scalar
        return _plain(value.item())
    raise _Uncacheable(type(value).__name__)


def digest(value: Any) -> str:
    """SHA-256 of ``value`` (numbers, strings, lists, dicts and tensors: every tensor's bytes, dtype and shape).

    Stored beside a cached result and compared when it is read, so that an
    entry whose numbers were changed after it was written is not trusted.
    Raises :class:`_Uncacheable` for a value it cannot describe.
    """
    return hashlib.sha256(json.dumps(_plain(value), sort_keys=True).encode()).hexdigest()


def _class(cls: type) -> list:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return [name] if cls.__module__.startswith(("posenc.", "torch.")) else [name, _source_hash(cls)]


def _model(model: torch.nn.Module) -> list:
    """Every submodule's class, settings, parameters and buffers; :class:`_Uncacheable` if a hook may act."""
    from torch.nn.modules import module as torch_module

    for name in dir(torch_module):
        if name.startswith("_global") and "hook" in name and getattr(torch_module, name, None):
            raise _Uncacheable(f"a global module hook ({name})")
    described = []
    for name, module in model.named_modules():
        entry = {"name": name, "class": _class(type(module))}
        derived = type(module).__module__.startswith("posenc.")
        for key, value in vars(module).items():
            if key == "training" or derived and key == "_cache":  # posenc's tables computed from the settings
                continue
            if "hook" in key:
                if value:
                    raise _Uncacheable(f"{name or 'the model'} has hooks ({key})")
                continue
            if key == "_modules":
                value = sorted(value)  # the names; each submodule is described in its own entry
            entry[key] = _plain(value)
        described.append(entry)
    return described


def _capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an old torch: what was asked for
        return os.environ.get("ATEN_CPU_CAPABILITY", "")


def evaluation_key(kind: str, model: Any, data: Any, device: torch.device, **arguments: Any) -> Optional[str]:
    """The cache key of one evaluation, or ``None`` where the cache cannot be used (off, or undescribable)."""
    return evaluation_keys(kind, model, data, device, [{}], **arguments)[0]


def evaluation_keys(kind: str, model: Any, data: Any, device: torch.device, parts: Sequence[Dict[str, Any]],
                    **arguments: Any) -> List[Optional[str]]:
    """One key per part of an evaluation (``arguments`` updated by each of ``parts``), the model described once.

    :func:`posenc.evaluate_lengths` stores each length under its own key, so
    that what was measured before an interrupt or an error is kept.
    """
    if os.environ.get("POSENC_EVAL_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return [None] * len(parts)
    if not isinstance(model, torch.nn.Module):
        return [None] * len(parts)
    keys: List[Optional[str]] = []
    try:
        described = dict(version=_VERSION, kind=kind, library=_library_digest(), torch=torch.__version__,
                         kernels=_capability(), device=str(device), model=_model(model),
                         data=[_class(type(data)), _plain(getattr(data, "config"))])
        for part in parts:
            blob = json.dumps(dict(described, arguments=_plain(dict(arguments, **part))), sort_keys=True)
            keys.append(hashlib.sha256(blob.encode()).hexdigest()[:32])
    except (_Uncacheable, TypeError, ValueError, RuntimeError, AttributeError):
        return [None] * len(parts)
    return keys


def _path(key: str) -> Path:
    return cache_dir("evals") / f"{key}.pt"


def load(key: Optional[str], check: Callable[[Any], Any]) -> Optional[Any]:
    """The stored result of ``key`` passed through ``check`` (which raises on a wrong one), or ``None``.

    An entry whose result does not match its stored digest, or that has none, is
    warned about and ``None`` returned (measured again).
    """
    if key is None:
        return None
    try:
        path = _path(key)
        if not path.is_file():
            return None
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("key") != key:
            raise ValueError("it holds another evaluation")
        if "digest" not in saved:
            raise ValueError("it has no digest to check its result against")
        if saved["digest"] != digest(saved["result"]):
            raise ValueError("its result does not match its digest (the file was changed or damaged)")
        return check(saved["result"])
    except Exception as err:  # truncated, garbled, of another shape: never trusted, measured again
        warnings.warn(f"the cached evaluation {key} cannot be used ({type(err).__name__}: {err}); "
                      "evaluating again, and the new result will replace it", RuntimeWarning, stacklevel=3)
        return None


def save(key: Optional[str], result: Any) -> None:
    """Store ``result`` and its :func:`digest` under ``key`` atomically; a cache that cannot be written is warned
    about once."""
    if key is None:
        return
    try:
        _atomic_save(dict(key=key, result=result, digest=digest(result)), _path(key))
    except Exception as err:  # read-only folder, no home, full disk: no half-written file stays
        _warn_unwritable(f"{type(err).__name__}: {err}")


@functools.lru_cache(maxsize=1)
def _warn_unwritable(reason: str) -> None:
    warnings.warn(f"could not write the evaluation cache ({reason}); evaluations are measured every time "
                  "(set POSENC_CACHE to a writable folder, or POSENC_EVAL_CACHE=0)", RuntimeWarning, stacklevel=4)


# The run key of posenc.train names a scheme class of yours by what it computes, not where it was imported from


def scheme_classes(model: torch.nn.Module) -> Dict[str, Any]:
    """``{"module.Qualname": ("Qualname", code hash)}`` for each position scheme of ``model`` not from ``posenc``."""
    names = {}
    for module in model.modules():
        cls = type(module)
        if isinstance(module, PositionScheme) and not cls.__module__.startswith("posenc."):
            names[f"{cls.__module__}.{cls.__qualname__}"] = (cls.__qualname__, code_hash(cls))
    return names


def code_hash(cls: type) -> str:  # not cached: a module constant may change while the class stays
    """The scheme's source hash (:func:`posenc._source._source_hash`) with the module constants it reads named
    without their module: the code and the constants' values, wherever the class was imported from."""
    return _source_hash(cls, module_names=False)


def without_modules(config: Any, names: Dict[str, Any]) -> Any:
    """``config`` with the schemes of yours named by their class alone, not by the module that defines them.

    The run key describes what a scheme computes: its settings and a hash of
    its source code (:meth:`~posenc.PositionScheme.config`). The module it
    was imported from computes nothing: the class of a notebook
    (``__main__.X``) moved into a file (``task2.X``) is the same run, and
    loads. A class of the same name with other code keeps another key.
    """
    if isinstance(config, dict):
        named = names.get(config.get("scheme")) if isinstance(config.get("scheme"), str) else None
        out = {k: without_modules(v, names) for k, v in config.items()}
        if named is not None:
            out["scheme"] = named[0]
            if "source" in out:  # its hash names the module of each constant the methods read: without it
                out["source"] = named[1]
        return out
    if isinstance(config, (list, tuple)):
        return [without_modules(v, names) for v in config]
    return config
