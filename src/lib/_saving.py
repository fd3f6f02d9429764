"""Saving a :class:`posenc.TinyLM` to a file and rebuilding it (the model's helper; exported by :mod:`posenc.model`).

:func:`save_model` writes the model's config, weights and evaluation-time
settings as plain values and tensors (``torch.load(weights_only=True)`` reads
them), atomically; :func:`load_model` rebuilds the model from them. A position
scheme is rebuilt from its :meth:`~posenc.PositionScheme.config`: a built-in
one by its registered name and options, a class of yours by importing it by
its recorded path and calling it with the arguments of its ``__init__`` found
in its config or among the model's sizes (:func:`_scheme_from_config`, which
``TinyLM(**model.config)`` uses too).
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from ._positions import builtin
from ._validate import check_device_here
from .runtime import _atomic_save
from .scheme import _REGISTRY, LayerSchemes, PositionScheme, position_scheme

if TYPE_CHECKING:  # the model imports this module; the functions import the model when called
    from .model import TinyLM

__all__ = ["save_model", "load_model"]


#: What :func:`save_model` writes as ``format``, and the version of its layout.
_FORMAT, _VERSION = "posenc.TinyLM", 1
#: Config keys that a scheme of yours gets from posenc (not from its constructor): a changed one warns.
_DERIVED = ("source", "initial")


def _layer_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """Pop the layer options of a :attr:`posenc.TinyLM.config` from ``options``, as ``TinyLM`` arguments."""
    out: Dict[str, Any] = {}
    features = {options.pop(k) for k in ("linear_feature", "norm_feature") if k in options}
    if len(features) > 1:
        raise ValueError(f"linear_feature and norm_feature are one setting of TinyLM (feature=...); got {features}")
    if features:
        out["feature"] = features.pop()
    if "diag_block_size" in options:
        out["diag_block"] = options.pop("diag_block_size")
    return out


def _config_arguments(config: Mapping[str, Any], options: Dict[str, Any], feature: str, diag_block: int, *,
                      d_model: int, n_heads: int, n_layers: int) -> Any:
    """``TinyLM(**model.config)``: the scheme rebuilt from its ``config``, and the model's ``feature``, ``diag_block``
    with the layer options of the config (``linear_feature``, ``diag_block_size``) popped from ``options``."""
    layer_options = _layer_options(options)
    if options:
        raise ValueError(f"position is a scheme's config ({dict(config)!r}), which holds its options; "
                         f"the options {sorted(options)} are for a scheme given by name")
    scheme = _scheme_from_config(config, d_model=d_model, n_heads=n_heads, n_layers=n_layers)
    return scheme, layer_options.get("feature", feature), layer_options.get("diag_block", diag_block)


def _scheme_class(path: str, classes: Sequence[type]) -> type:
    """The :class:`PositionScheme` subclass named ``module.Qualname`` by a config: one of ``classes``, or imported."""
    name = path.rsplit(".", 1)[-1]
    for cls in classes:
        if f"{cls.__module__}.{cls.__qualname__}" == path or cls.__name__ == name:
            return cls
    how = (f"pass the class: pe.load_model(path, classes=[{name}]), or move it into a module (a .py file on "
           "sys.path), build the model with the class imported from there and save it again")
    if "<locals>" in path:
        raise ValueError(f"the position scheme class {path!r} was defined inside a function, where no other code "
                         f"can import it: {how}")
    parts = path.split(".")
    found: Any = None
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                continue  # not a module: try a shorter prefix
            raise ValueError(f"importing {module_name!r} for the position scheme class {path!r} failed: "
                             f"{err}") from err
        except Exception as err:  # the module itself raised
            raise ValueError(f"importing {module_name!r} for the position scheme class {path!r} failed: "
                             f"{type(err).__name__}: {err}") from err
        for name in parts[cut:]:
            found = getattr(found, name, None)
        break
    if not (isinstance(found, type) and issubclass(found, PositionScheme)):
        where = ("it was defined in __main__ (a script, a notebook or a console) of the process that saved the "
                 "model, which another process cannot import" if parts[0] == "__main__" else
                 "no module on sys.path defines it (is the folder of its .py file on sys.path?)")
        raise ValueError(f"cannot find the position scheme class {path!r}: {where}; {how}")
    return found


def _scheme_arguments(cls: type, config: Mapping[str, Any], sizes: Dict[str, int]) -> Any:
    """``(args, kwargs)`` that rebuild a scheme of class ``cls`` from its ``config`` (and the model's sizes).

    An argument of ``__init__`` is read from the config key of its name (or
    ``_name``: a private attribute), else from the model's sizes (``n_heads``,
    ``d_model``, ``n_layers``, ``head_dim``), else left to its default.
    """
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
    except (TypeError, ValueError):  # pragma: no cover - an __init__ without a signature
        params = []
    args: List[Any] = []
    kwargs: Dict[str, Any] = {}
    missing = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in config and p.name not in ("scheme",) + _DERIVED:
            value = config[p.name]
        elif f"_{p.name}" in config:
            value = config[f"_{p.name}"]
        elif p.name in sizes:
            value = sizes[p.name]
        elif p.default is not p.empty:
            continue
        else:
            missing.append(p.name)
            continue
        if p.kind is p.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[p.name] = value
    if missing:
        path = f"{cls.__module__}.{cls.__qualname__}"
        raise ValueError(f"cannot rebuild the position scheme {path} from its config {dict(config)!r}: its __init__ "
                         f"takes {missing}, which the scheme does not keep as attributes of the same name, so the "
                         "config does not record them; keep each one in __init__ (" +
                         ", ".join(f"self.{m} = {m}" for m in missing) + ") or give it a default")
    return args, kwargs


def _scheme_from_config(config: Mapping[str, Any], *, d_model: int, n_heads: int, n_layers: int,
                        classes: Sequence[type] = (), layer_index: Optional[Sequence[int]] = None) -> Any:
    """A scheme object (or a list with one per layer) built from a :meth:`PositionScheme.config`."""
    name = config.get("scheme")
    if not isinstance(name, str):
        raise ValueError(f"a position scheme's config names its scheme under 'scheme', got {dict(config)!r}")
    sizes = dict(d_model=d_model, n_heads=n_heads, n_layers=n_layers, head_dim=d_model // n_heads)
    if name == "layers":
        layers = config.get("layers")
        if not isinstance(layers, (list, tuple)) or len(layers) != n_layers or \
                not all(isinstance(c, Mapping) for c in layers):
            raise ValueError(f"a config of schemes per layer lists one scheme config per layer ({n_layers}), "
                             f"got {layers!r}")
        if layer_index is None:  # equal configs are one object, as names given twice are
            layer_index = [next(j for j in range(n_layers) if layers[j] == c) for c in layers]
        built: Dict[int, PositionScheme] = {}
        out = []
        for c, i in zip(layers, layer_index):
            if i not in built:
                built[i] = _scheme_from_config(c, classes=classes, **dict(d_model=d_model, n_heads=n_heads,
                                                                             n_layers=n_layers))
            out.append(built[i])
        return out
    if name in _REGISTRY:
        return position_scheme(name, **{k: v for k, v in config.items() if k != "scheme"})
    cls = _scheme_class(name, classes)
    args, kwargs = _scheme_arguments(cls, config, sizes)
    return cls(*args, **kwargs)


def _without(config: Any, keys: Sequence[str]) -> Any:
    """``config`` (nested in a config per layer) without ``keys``."""
    if isinstance(config, Mapping):
        return {k: _without(v, keys) for k, v in config.items() if k not in keys}
    if isinstance(config, (list, tuple)):
        return [_without(v, keys) for v in config]
    return config


def _check_rebuilt(saved: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> None:
    """``ValueError`` if a scheme rebuilt from ``saved`` has another config; a warning if only its code changed."""
    if dict(rebuilt) == dict(saved):
        return
    if _without(rebuilt, ("scheme",) + _DERIVED) != _without(saved, ("scheme",) + _DERIVED):
        raise ValueError(f"the position scheme config {dict(saved)!r} rebuilds as {dict(rebuilt)!r}: its class takes "
                         "other arguments than the config records (keep every argument of __init__ as an "
                         "attribute of the same name)")
    warnings.warn(f"the position scheme rebuilt from {dict(saved)!r} has another class path, source or "
                  f"initial-tensor hash, {dict(rebuilt)!r}: its class was moved or edited since (or draws its "
                  "initial tensors at random); the saved weights are loaded into the class as it is now",
                  UserWarning, stacklevel=3)


def _file_path(path: Any, what: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(os.fspath(path)):
        raise ValueError(f"{what} must be a file path (a str or a pathlib.Path), got {path!r}")
    out = Path(os.fspath(path))
    if out.is_dir():
        raise ValueError(f"{what} {str(out)!r} is a folder; give a file name, e.g. {str(out / 'model.pt')!r}")
    return out


def save_model(model: TinyLM, path: Union[str, "os.PathLike[str]"]) -> None:
    """Write ``model`` to ``path``: its :attr:`~posenc.TinyLM.config`, weights and evaluation-time settings.

    :func:`load_model` rebuilds it, in this process or another; the file
    loads with ``torch.load(path, weights_only=True)`` (plain values and
    tensors, no pickled objects). It is written whole or not at all (a
    temporary file beside it, then a rename), so an interrupted save leaves
    any earlier file at ``path`` as it was.

    A scheme of your own (a :class:`~posenc.PositionScheme` subclass) is
    recorded by its class path (``module.ClassName``) and config; loading
    imports the class again and calls it with the arguments of its
    ``__init__`` found in the config (attributes of the same name) or among
    the model's sizes (``n_heads``, ``d_model``, ``n_layers``, ``head_dim``).
    Define the class in a module (a ``.py`` file), not in ``__main__``,
    to load the model in another process.

    Raises:
        ValueError: if ``model`` is not a :class:`~posenc.TinyLM`, ``path`` is not a
            file path, or a scheme of yours could not be rebuilt from its
            config (an ``__init__`` argument it does not keep).

    >>> import os, tempfile, posenc as pe
    >>> model = pe.TinyLM(16, 32, 2, 4, position="alibi")
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     pe.save_model(model, os.path.join(folder, "model.pt"))
    ...     again = pe.load_model(os.path.join(folder, "model.pt"))
    >>> idx = torch.tensor([[1, 2, 3]])
    >>> torch.equal(again(idx), model(idx))
    True
    """
    from .model import TinyLM

    if not isinstance(model, TinyLM):
        raise ValueError(f"model must be a posenc TinyLM, got {type(model).__name__}")
    path = _file_path(path, "path")
    config = model.config
    schemes = model.position.schemes if isinstance(model.position, LayerSchemes) else [model.position]
    sizes = dict(d_model=model.d_model, n_heads=model.n_heads, n_layers=model.n_layers,
                 head_dim=model.d_model // model.n_heads)
    for scheme in schemes:
        if builtin(scheme):
            continue
        cls = type(scheme)
        _scheme_arguments(cls, scheme.config(), sizes)  # refused now, not when the file is loaded
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            warnings.warn(f"the position scheme class {cls.__qualname__} is defined "
                          f"{'in __main__' if cls.__module__ == '__main__' else 'inside a function'}: only this "
                          f"process can import it, so loading {str(path)!r} elsewhere needs "
                          f"pe.load_model(path, classes=[{cls.__name__}]); define it in a module (a .py file) "
                          "to avoid that", UserWarning, stacklevel=2)
    scaling = model.rope_scaling
    settings = dict(train_len=model.train_len, window=model.window, sinks=model.sinks,
                    sink_positions=model.sink_positions, log_n_scaling=model.log_n_scaling,
                    rope_scaling=None if scaling is None else scaling.config())
    floating = {p.dtype for p in model.parameters() if p.is_floating_point()}
    payload = dict(format=_FORMAT, version=_VERSION, config=config, settings=settings,
                   layer_index=list(model.position._index) if isinstance(model.position, LayerSchemes) else None,
                   dtype=str(floating.pop()).replace("torch.", "") if len(floating) == 1 else None,
                   training=model.training)
    try:  # a value of a scheme's config that weights_only loading would refuse: now, not at load time
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as err:
        raise ValueError(f"the model's config holds a value that torch.load(weights_only=True) cannot read back "
                         f"({err}); a scheme's config() must hold numbers, strings, booleans, None and lists or "
                         f"dicts of them: {config['position']!r}") from None
    payload["state_dict"] = model.state_dict()
    _atomic_save(payload, path)


def load_model(path: Union[str, "os.PathLike[str]"], *, device: Union[None, str, torch.device] = None,
               classes: Sequence[type] = ()) -> TinyLM:
    """The model that :func:`save_model` wrote to ``path``: same config, weights and settings, so the same logits.

    Reads the file with ``torch.load(weights_only=True)``. A scheme of your
    own is imported by the class path recorded in the file (the module is
    imported: load files you trust), or taken from ``classes``: the class
    objects to use, matched by name (needed for a class defined in
    ``__main__`` or inside a function of the process that saved it).

    Args:
        path: a file written by :func:`save_model`.
        device: where the model goes (default: the CPU).
        classes: scheme classes of yours to use instead of importing them.

    Raises:
        ValueError: if the file is not one that :func:`save_model` wrote, its
            scheme class cannot be found or imported (saying what to do), or
            the rebuilt model does not match the saved weights.
        FileNotFoundError: if there is no file at ``path``.
    """
    path = _file_path(path, "path")
    where = torch.device("cpu") if device is None else check_device_here(device)  # names the devices there are
    if isinstance(classes, type) or not all(isinstance(c, type) and issubclass(c, PositionScheme)
                                            for c in classes):
        raise ValueError(f"classes must be a list of posenc.PositionScheme subclasses, got {classes!r}")
    if not path.exists():
        raise FileNotFoundError(f"no saved model at {str(path)!r}")
    try:
        saved = torch.load(path, map_location=where, weights_only=True)
    except Exception as err:
        raise ValueError(f"{str(path)!r} is not a model written by posenc.save_model, or it is damaged "
                         f"(torch.load: {type(err).__name__}: {err})") from None
    if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
        raise ValueError(f"{str(path)!r} is not a model written by posenc.save_model (a file of torch.save, but "
                         "without its 'format' entry)")
    if saved.get("version") != _VERSION:
        raise ValueError(f"{str(path)!r} was written by another version of posenc (file layout "
                         f"{saved.get('version')!r}, this one reads {_VERSION})")
    config = dict(saved["config"])
    kwargs = {k: v for k, v in config.items() if k != "position"}
    kwargs.update(_layer_options(kwargs))
    scheme = _scheme_from_config(config["position"], d_model=config["d_model"], n_heads=config["n_heads"],
                                 n_layers=config["n_layers"], classes=classes, layer_index=saved["layer_index"])
    from .model import TinyLM

    model = TinyLM(position=scheme, **kwargs)
    _check_rebuilt(config["position"], model.position.config())
    model.to(device=where, dtype=getattr(torch, saved["dtype"]) if saved["dtype"] else None)
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as err:
        raise ValueError(f"the weights in {str(path)!r} do not fit the model rebuilt from its config ({err})") \
            from None
    settings = saved["settings"]
    model.train_len = settings["train_len"]
    model.window = settings["window"]
    model.sinks = settings["sinks"]
    model.sink_positions = settings["sink_positions"]
    model.log_n_scaling = settings["log_n_scaling"]
    model.rope_scaling = settings["rope_scaling"]
    model.train(saved["training"])
    return model
