"""Position schemes as small objects that a model composes.

Every way of telling a Transformer where a token is acts in (at most) three
places, and :class:`PositionScheme` has one hook for each:

=====================================  =============================  ==========================
hook                                   where it acts                  built-in schemes
=====================================  =============================  ==========================
``embed(x)``                           added to the token embeddings  learned, sinusoidal
``rotate(qk)``                         rotates queries and keys       RoPE, xPos
``distance_bias(length, ...)``         added to the logits by         ALiBi, KERPLE, Sandwich, T5
                                       distance ``i - j``
=====================================  =============================  ==========================

A scheme overrides the hooks it needs and leaves the others alone; the model
skips a hook that is not overridden. ``config()`` describes the scheme for the
training cache (:func:`posenc.train`), and ``reset_parameters(generator)``
draws its learned parameters, if it has any.

Built-in schemes live in their topic modules (``posenc.rope.RoPE``,
``posenc.alibi.ALiBi``, ...) and are registered under the names that
``TinyLM(position="alibi")`` accepts (:data:`POSITION_SCHEMES`,
:func:`position_scheme`). A scheme of your own is a subclass passed as an
object, ``TinyLM(position=MyScheme(...))``::

    class ExponentialDecay(pe.PositionScheme):
        "Bias -log(1 + r_h d) with a learned rate per head (KERPLE's log kernel, r1 = 1)."

        def __init__(self, n_heads):
            super().__init__()
            self.log_rate = torch.nn.Parameter(torch.zeros(n_heads))

        def distance_bias(self, length, *, device, dtype):
            d = torch.arange(length, device=device, dtype=dtype)      # distances 0 .. length-1
            return -torch.log1p(self.log_rate.exp()[:, None] * d)      # (heads, length)

A distance bias goes through :func:`posenc.relative_attention` (the fused
kernel, no ``(heads, n, n)`` tensor) exactly like the built-in ones.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

import torch
from torch import nn

from ._source import _is_simple, _plain, _source_hash
from ._validate import _folded, check_int, one_of

__all__ = ["PositionScheme", "NoPE", "LayerSchemes", "POSITION_SCHEMES", "register_scheme", "position_scheme"]

# name -> factory(**options) -> PositionScheme; filled by the topic modules on import
_REGISTRY: Dict[str, Callable[..., "PositionScheme"]] = {}

# the order in which the book meets the built-in schemes (registration order depends on imports)
_BOOK_ORDER = ("none", "learned", "sinusoidal", "rope", "alibi", "kerple_power", "kerple_log", "sandwich",
               "xpos", "t5", "p_rope", "cope")

#: The names accepted by ``TinyLM(position=...)``, in the book's order (the
#: topic modules register them when ``posenc`` is imported).
POSITION_SCHEMES: Tuple[str, ...] = ()


def register_scheme(name: str, factory: Optional[Callable[..., "PositionScheme"]] = None):
    """Register ``factory`` (a scheme class, or any callable returning a scheme) under ``name``.

    Used as a decorator on a class (``@register_scheme("alibi")``) or called
    with a factory (``register_scheme("kerple_log", partial(Kerple, kind="log"))``).
    A name can be registered once, and names are read in any case and with
    ``-`` for ``_`` (``"ALiBi"`` is ``"alibi"``), so a name that reads as one
    already registered is refused too.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a scheme name must be a non-empty string, got {name!r}")

    def add(f: Callable[..., "PositionScheme"]):
        global POSITION_SCHEMES
        if not callable(f):
            raise ValueError(f"register_scheme({name!r}, ...) needs a scheme class or a function returning a "
                             f"scheme, got {type(f).__name__}")
        same = [n for n in _REGISTRY if _folded(n) in (_folded(name), "none" if _folded(name) == "nope" else None)
                and _REGISTRY[n] is not f]  # "nope" is read as "none"
        if same:
            raise ValueError(f"a position scheme named {name!r} is already registered"
                             + (f" (as {same[0]!r}: names are read in any case, '-' as '_')"
                                if same and same[0] != name else ""))
        _REGISTRY[name] = f
        POSITION_SCHEMES = tuple(sorted(_REGISTRY, key=lambda n: (_BOOK_ORDER.index(n) if n in _BOOK_ORDER
                                                                  else len(_BOOK_ORDER))))
        return f

    return add if factory is None else add(factory)


def scheme_name(position: Any) -> str:
    """The registered name ``position`` reads as: "RoPE", "ALiBi", "p-rope", "kerple-log", "NoPE" are "rope",
    "alibi", "p_rope", "kerple_log", "none"; else ``ValueError`` ("did you mean 'alibi'?" for "alibbi")."""
    return one_of("position", position, POSITION_SCHEMES, also=" or a posenc.PositionScheme object",
                  aliases={"nope": "none"})


def position_scheme(position: Any, **options: Any) -> "PositionScheme":
    """The scheme object for ``position``: a registered name (built with ``options``) or a scheme object.

    >>> position_scheme("ALiBi").name   # any case, as the book writes the names
    'alibi'
    >>> position_scheme("rope", base=500.0).config()["base"]
    500.0
    """
    if isinstance(position, PositionScheme):
        if "_modules" not in position.__dict__ or "n_heads" not in position.__dict__:
            raise ValueError(f"{type(position).__name__}.__init__ must call super().__init__() before anything else "
                             "(PositionScheme sets up the model's sizes and torch's module state there)")
        if options:
            raise ValueError(f"options {sorted(options)} are for a scheme given by name; "
                             f"{type(position).__name__} is already built")
        return position
    position = scheme_name(position)
    factory = _REGISTRY[position]
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as err:
        raise ValueError(f"position={position!r} takes the options "
                         f"{_option_names(factory)}, got {sorted(options)} ({err})") from None
    built = factory(**options)
    if not isinstance(built, PositionScheme):
        raise ValueError(f"the factory registered as {position!r} returned {type(built).__name__!r}, not a "
                         "posenc.PositionScheme")
    return built


def retunable_options(config: Dict[str, Any]) -> Tuple[str, ...]:
    """The :attr:`PositionScheme.retunable` options of the scheme whose :meth:`~PositionScheme.config` is ``config``.

    A built-in scheme by its registered name; a class of yours lists them in its config.

    >>> retunable_options({"scheme": "rope", "base": 10000.0}), retunable_options({"scheme": "alibi"})
    (('base',), ())
    """
    name = config.get("scheme")
    return tuple(getattr(_REGISTRY.get(name), "retunable", ()) if isinstance(name, str) else ()) \
        or tuple(config.get("retunable", ()))


def _option_names(factory: Callable[..., Any]) -> list:
    try:
        return [p for p, v in inspect.signature(factory).parameters.items()
                if v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return []


#: The methods the model calls; an attribute, parameter, buffer or submodule of that name would hide one.
_HOOKS = ("embed", "rotate", "distance_bias", "slopes")


def _check_name(scheme: Any, name: str, what: str) -> None:
    if name in _HOOKS:
        raise ValueError(f"{type(scheme).__name__}: {name!r} is a PositionScheme hook (a method the model calls); "
                         f"a {what} of that name would hide it or be hidden by it: call it, e.g., '{name}_' or "
                         f"'my_{name}' (ALiBi-like slopes: override slopes() to return them)")


class PositionScheme(nn.Module):
    """How a model knows where a token is: override the hooks your scheme needs.

    The model calls :meth:`bind` once with its sizes (after which
    ``self.d_model``, ``self.n_heads``, ``self.head_dim`` and ``self.n_layers``
    are set), then, at every forward pass over ``seq`` tokens:

    * :meth:`embed` on the token embeddings ``(batch, seq, d_model)``;
    * :meth:`rotate` on queries and keys stacked as ``(2, batch, heads, seq, head_dim)``
      in every attention layer;
    * :meth:`distance_bias` once, for distances ``0 .. seq-1``: ``(heads, seq)``
      shared by every layer, or ``(n_layers, heads, seq)``, one table per layer.
      It is added to the logits of query ``i`` and key ``j`` at distance ``i - j``
      (after the ``1/sqrt(head_dim)`` scale), through
      :func:`posenc.relative_attention`.

    A hook that is not overridden is skipped. ``max_len`` is the longest
    sequence the scheme can run (``None``: any length).
    """

    #: The registered name of a built-in scheme; the class name for yours.
    name: ClassVar[str] = "custom"
    #: Options (keys of :meth:`config`) that set no weights, so a fine-tune
    #: (``pe.train(init=...)``) may start from a model where they differ: RoPE's
    #: ``base`` (ABF raises it while training on). Everything else must match.
    retunable: ClassVar[Tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __init__(self) -> None:
        super().__init__()
        self.d_model: Optional[int] = None
        self.n_heads: Optional[int] = None
        self.head_dim: Optional[int] = None
        self.n_layers: Optional[int] = None
        self.max_len: Optional[int] = None

    # ------------------------------------------------- names kept for the hooks

    def __setattr__(self, name: str, value: Any) -> None:
        _check_name(self, name, "attribute")
        super().__setattr__(name, value)

    def register_buffer(self, name: str, tensor: Optional[torch.Tensor], persistent: bool = True) -> None:
        _check_name(self, name, "buffer")
        super().register_buffer(name, tensor, persistent)

    def register_parameter(self, name: str, param: Optional[nn.Parameter]) -> None:
        _check_name(self, name, "parameter")
        super().register_parameter(name, param)

    def add_module(self, name: str, module: Optional[nn.Module]) -> None:
        _check_name(self, name, "submodule")
        super().add_module(name, module)

    # -------------------------------------------------------------- binding

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        """Learn the model's sizes (called once by the model; override to build tables or parameters).

        Raises ``ValueError`` when the scheme cannot serve these sizes, or when
        the object already belongs to a model of other sizes (a scheme holds its
        model's parameters: build one object per model).
        """
        d_model, n_heads, n_layers = (check_int(name, value) for name, value in
                                      (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers)))
        sizes = (d_model, n_heads, n_layers)
        if self.d_model is not None and (self.d_model, self.n_heads, self.n_layers) != sizes:
            raise ValueError(f"this {type(self).__name__} object already belongs to a model with "
                             f"(d_model, n_heads, n_layers) = {(self.d_model, self.n_heads, self.n_layers)}; "
                             "build a new scheme object for each model")
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.head_dim = d_model // n_heads

    def _require_bound(self, *built: Any) -> None:
        """Raise ``ValueError`` if no model has bound this scheme yet (or ``bind`` left any of ``built`` unmade)."""
        if self.n_heads is None or any(b is None for b in built):
            raise ValueError(f"this {type(self).__name__} scheme is not bound to a model yet: call "
                             "bind(d_model=..., n_heads=..., n_layers=...) first (a model does it)")

    def _require_even_head_dim(self) -> None:
        """For rotations: raise ``ValueError`` unless ``head_dim`` is even."""
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError(f"{self.name} rotates channel pairs: head_dim = d_model / n_heads must be even, "
                             f"got {self.head_dim}")

    # ---------------------------------------------------------------- hooks

    def embed(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Absolute schemes: token embeddings ``(batch, seq, d_model)`` -> the same with positions added.

        ``positions``: ``None`` (token ``i`` at position ``i``) or ``(batch, seq)``
        int64 ids, strictly increasing along each row (``model(idx, positions=...)``).
        A scheme of yours that leaves the argument out serves contiguous positions only.
        """
        return x

    def rotate(self, qk: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rotations: queries and keys stacked ``(2, batch, heads, seq, head_dim)`` -> the same shape.

        Query ``i`` and key ``j`` are at positions ``i`` and ``j`` of the
        sequence (self-attention, equal lengths), or at ``positions[b, i]`` and
        ``positions[b, j]`` when ids are given (``(batch, seq)`` int64).
        :func:`posenc.apply_rope` takes the stacked tensor and the ids as they come:

        >>> import posenc as pe
        >>> class MyRoPE(pe.PositionScheme):
        ...     def rotate(self, qk, positions=None):    # qk: (2, batch, heads, seq, head_dim)
        ...         return pe.apply_rope(qk, positions, base=500.0)  # positions: None or (batch, seq)
        >>> qk = torch.randn(2, 3, 4, 5, 8)              # batch 3, heads 4, seq 5, head_dim 8
        >>> ids = torch.tensor([[0, 1, 2, 3, 4], [0, 2, 4, 6, 8], [7, 8, 9, 10, 11]])
        >>> out = MyRoPE().rotate(qk, ids)                # TinyLM(position=MyRoPE())(idx, positions=ids)
        >>> torch.allclose(out[1, 2], pe.apply_rope(qk[1, 2], ids[2], base=500.0))  # keys of row 2 at its ids
        True
        """
        return qk

    def distance_bias(self, length: int, *, device: torch.device, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Additive logit bias for distances ``0 .. length-1``.

        Returns ``(heads, length)`` (every layer) or ``(n_layers, heads, length)``
        (a table per layer); ``None`` for no bias. Entry ``[h, d]`` is added to
        the logit of every query-key pair at distance ``i - j = d`` of head ``h``.
        """
        return None

    def slopes(self) -> Optional[torch.Tensor]:
        """``(heads,)`` slopes ``m`` when the bias is exactly ``-m (i - j)`` (ALiBi), else ``None``.

        With slopes, attention may fold the bias into the fused kernel instead
        of reading a table (:func:`posenc.relative_attention`, path ``"fold"``).
        """
        return None

    def config(self) -> Dict[str, Any]:
        """What identifies this scheme in the training cache.

        By default: the class, its public attributes that are numbers,
        strings, booleans or tuples of them (so hyperparameters stored as
        ``self.rate = rate`` count; NumPy and one-element tensor values as the
        Python numbers they spell), and, for a class defined outside
        ``posenc``, also its private attributes of those kinds
        (``self._scale``), a hash of its source code and of the module
        constants its methods read, and a hash of its initial tensors, so that
        editing the class, a constant or a starting value trains anew.
        Override to add settings kept elsewhere.
        """
        cls = type(self)
        builtin = cls.__module__.startswith("posenc.")
        out: Dict[str, Any] = {"scheme": self.name if builtin else f"{cls.__module__}.{cls.__qualname__}"}
        skip = {"training", "d_model", "n_heads", "head_dim", "n_layers", "_is_full_backward_hook"}
        for key, value in vars(self).items():
            value = _plain(value)
            if key.startswith("__") or key.startswith("_") and (builtin or key.startswith("_initial")):
                continue
            if key not in skip and value is not None and _is_simple(value):
                out[key] = list(value) if isinstance(value, tuple) else value
        if not builtin:
            out["source"] = _source_hash(cls)
            if cls.retunable:
                out["retunable"] = list(cls.retunable)
            if self.__dict__.get("_initial_hash") is not None:  # set by snapshot()
                out["initial"] = self.__dict__["_initial_hash"]
        return out

    # ------------------------------------------------------ parameters

    def _layers(self) -> Dict[str, nn.Module]:
        """A scheme of yours: its torch layers that draw their own weights (``nn.Linear``, ...), by name."""
        if type(self).__module__.startswith("posenc."):
            return {}
        layers: Dict[str, nn.Module] = {}
        for name, module in self.named_modules():
            inside = any(name.startswith(f"{outer}.") for outer in layers)
            if name and not inside and callable(getattr(module, "reset_parameters", None)):
                layers[name] = module
        return layers

    def snapshot(self) -> None:
        """Remember the current tensors as the ones :meth:`reset_parameters` restores (the model calls it)."""
        state = {k: v.detach().clone() for k, v in self.state_dict().items()}
        self.__dict__["_initial_state"] = state
        drawn = tuple(f"{name}." for name in self._layers())  # drawn from the training seed: only shapes count
        digest = hashlib.sha256()
        for k in sorted(state):
            digest.update(f"{k} {tuple(state[k].shape)} {state[k].dtype}".encode())
            if state[k].numel() and not k.startswith(drawn):
                digest.update(state[k].cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        self.__dict__["_initial_hash"] = digest.hexdigest()[:16] if state else None

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Re-draw learned parameters (from ``generator``); by default restore the initial values.

        Built-in learned schemes draw from ``generator`` (reproducible with the
        training seed). In a scheme of yours, the torch layers it holds
        (``nn.Linear``, ``nn.Embedding``, any submodule with a
        ``reset_parameters()`` method) are drawn again by that method with
        torch's random generator seeded from ``generator``, as the model's own
        layers are, so a run depends on its seed and not on what ran before;
        tensors held by the scheme itself (``nn.Parameter(torch.zeros(h))``)
        keep the values it was built with, which enter :meth:`config`.
        Override to draw them otherwise.
        """
        state = self.__dict__.get("_initial_state")
        if state:
            self.load_state_dict(state)
        layers = self._layers()
        if generator is not None and layers:
            seed = int(torch.randint(2 ** 62, (1,), generator=generator))
            with torch.random.fork_rng(devices=[]):  # the global generator is left as it was
                torch.manual_seed(seed)
                for module in layers.values():
                    module.reset_parameters()

    @property
    def embeds(self) -> bool:
        """True if :meth:`embed` is overridden."""
        return type(self).embed is not PositionScheme.embed

    @property
    def rotates(self) -> bool:
        """True if :meth:`rotate` is overridden."""
        return type(self).rotate is not PositionScheme.rotate

    @property
    def biases(self) -> bool:
        """True if :meth:`distance_bias` or :meth:`slopes` is overridden."""
        return (type(self).distance_bias is not PositionScheme.distance_bias
                or type(self).slopes is not PositionScheme.slopes)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k not in ("scheme", "source", "initial"))


@register_scheme("none")
class NoPE(PositionScheme):
    """No position information (NoPE): the causal mask still leaks some (Haviv et al., 2022)."""

    name = "none"


# how the model calls each hook: (positional, keyword) arguments, and the signature to tell a scheme's author
_HOOK_CALLS = {"embed": ((None,), {}, "embed(self, x, positions=None)"),
               "rotate": ((None,), {}, "rotate(self, qk, positions=None)"),
               "distance_bias": ((1,), dict(device=None, dtype=None), "distance_bias(self, length, *, device, dtype)"),
               "slopes": ((), {}, "slopes(self)")}


def _check_hook_signatures(scheme: "PositionScheme") -> None:
    """``ValueError`` naming the expected signature if an overridden hook cannot be called as the model calls it."""
    for hook, (args, kwargs, expected) in _HOOK_CALLS.items():
        method = getattr(type(scheme), hook, None)
        if method is getattr(PositionScheme, hook) or not callable(method):
            continue
        try:
            signature = inspect.signature(getattr(scheme, hook))
        except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature: let the call decide
            continue
        try:
            signature.bind(*args, **kwargs)
        except TypeError:
            raise ValueError(f"{type(scheme).__name__}.{hook}{signature} cannot be called as the model calls it; "
                             f"define it as {expected}") from None


def _bind_checked(scheme: "PositionScheme", *, d_model: int, n_heads: int, n_layers: int) -> None:
    """``scheme.bind(...)``, refused (``ValueError``) if the scheme's ``bind`` did not record the sizes
    or a hook it overrides has another signature than the model's call."""
    _check_hook_signatures(scheme)
    scheme.bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
    if (scheme.d_model, scheme.n_heads, scheme.n_layers) != (d_model, n_heads, n_layers):
        raise ValueError(f"{type(scheme).__name__}.bind() must call super().bind(d_model=..., n_heads=..., "
                         "n_layers=...) so that the scheme knows the model's sizes")


class LayerSchemes(PositionScheme):
    """One position scheme per layer: ``TinyLM(position=["rope", "none", "rope", "none"])``.

    Interleaving rotated and unrotated layers is what Llama 4 does (iRoPE:
    every fourth layer without position) and what Yang et al. (2025, "RoPE to
    NoPE and back again") study; a list may mix any schemes that act inside
    attention: rotations, distance biases and ``"none"``. A scheme that adds to
    the embeddings (``"learned"``, ``"sinusoidal"``) acts once, on the model's
    input, and cannot be given per layer.

    Entries given by the same name are one scheme object (built with the
    model's position options); a scheme object of yours is used where it
    appears. The model builds this object itself from the list; its
    :meth:`config` lists every layer's scheme (the cache key), and the RoPE
    scaling rules (``model.rope_scaling``) apply to every layer that rotates
    with RoPE.

    Args:
        schemes: one scheme object per layer.
    """

    name = "layers"

    def __init__(self, schemes: Any) -> None:
        super().__init__()
        if isinstance(schemes, (PositionScheme, str)) or not isinstance(schemes, (list, tuple)):
            raise ValueError(f"LayerSchemes takes a list of PositionScheme objects, one per layer, got "
                             f"{type(schemes).__name__}")
        unique, index = [], []
        for scheme in schemes:
            if not isinstance(scheme, PositionScheme) or isinstance(scheme, LayerSchemes):
                raise ValueError(f"LayerSchemes takes one PositionScheme object per layer, got "
                                 f"{type(scheme).__name__}")
            if scheme.embeds:
                raise ValueError(f"position={scheme.name!r} adds to the embeddings, once for the model: a list of "
                                 "schemes per layer takes schemes that act inside attention (rotations, biases, "
                                 "'none')")
            found = next((k for k, u in enumerate(unique) if u is scheme), None)
            if found is None:
                unique.append(scheme)
                found = len(unique) - 1
            index.append(found)
        if not unique:
            raise ValueError("LayerSchemes needs one scheme per layer, got none")
        self.schemes = nn.ModuleList(unique)
        self._index = tuple(index)

    def layer(self, i: int) -> PositionScheme:
        """The scheme of layer ``i``."""
        i = check_int("layer", i, low=0)
        if i >= len(self._index):
            raise ValueError(f"layer must be one of the {len(self._index)} layers (0 .. {len(self._index) - 1}), got {i}")
        return self.schemes[self._index[i]]

    def bind(self, *, d_model: int, n_heads: int, n_layers: int) -> None:
        if len(self._index) != n_layers:
            raise ValueError(f"a list of position schemes needs one per layer: {n_layers} layers, "
                             f"got {len(self._index)}")
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        for scheme in self.schemes:
            _bind_checked(scheme, d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        limits = [s.max_len for s in self.schemes if s.max_len is not None]
        self.max_len = min(limits) if limits else None

    def config(self) -> Dict[str, Any]:
        return {"scheme": self.name, "layers": [self.layer(i).config() for i in range(len(self._index))]}

    @property
    def rotates(self) -> bool:
        return any(s.rotates for s in self.schemes)

    @property
    def biases(self) -> bool:
        return any(s.biases for s in self.schemes)

    def snapshot(self) -> None:
        for scheme in self.schemes:
            scheme.snapshot()

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        for scheme in self.schemes:
            scheme.reset_parameters(generator)

    @property
    def scaling(self) -> Any:
        """The RoPE layers' evaluation-time scaling (``None``: plain RoPE, or no RoPE layer)."""
        return next((s.scaling for s in self.schemes if callable(getattr(s, "set_scaling", None))), None)

    def set_scaling(self, value: Any, *, train_len: Optional[int] = None) -> None:
        """Set the scaling of every RoPE layer (``ValueError`` for a scaling and no RoPE layer)."""
        rope = [s for s in self.schemes if callable(getattr(s, "set_scaling", None))]
        if not rope and value is not None:
            raise ValueError(f"rope_scaling applies to RoPE layers; these layers have "
                             f"{[self.layer(i).name for i in range(len(self._index))]}")
        for scheme in rope:
            scheme.set_scaling(value, train_len=train_len)

    def extra_repr(self) -> str:
        return f"layers={[self.layer(i).name for i in range(len(self._index))]}"


def _kept(tables: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``tables[key]``, made by ``make()`` the first time; at most 8 kept (tables on the device, scaled rotations)."""
    if key not in tables:
        if len(tables) >= 8:
            tables.clear()
        tables[key] = make()
    return tables[key]
