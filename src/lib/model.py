"""A tiny decoder-only Transformer that composes a position scheme and attention layers.

:class:`TinyLM` is a small GPT (pre-norm blocks, causal self-attention, a
feed-forward block; in the spirit of Karpathy's nanoGPT) whose moving parts
are *how it knows where a token is* and *how its layers attend*:

* ``position``: a registered name (:data:`posenc.POSITION_SCHEMES`: ``"none"``,
  ``"learned"``, ``"sinusoidal"``, ``"rope"``, ``"alibi"``, ``"kerple_power"``,
  ``"kerple_log"``, ``"sandwich"``, ``"xpos"``, ``"t5"``, ``"p_rope"``), with its options as
  keyword arguments (``TinyLM(..., position="rope", base=500.0)``), or a
  :class:`posenc.PositionScheme` object, yours included. The model calls the
  scheme's hooks and names no scheme itself.
* ``attention``: ``"softmax"`` (default), ``"linear"`` (``1 + elu``),
  ``"norm"`` (NormAttention), ``"diag"`` (DiagAttention), ``"decay"``
  (linear attention whose state decays, RetNet's retention: ``decay="retnet"``,
  ``"alibi"`` or rates of your own) or ``"gated"`` (the decay a learned gate
  per step, GLA; ``gate_temperature``), ``"forgetting"`` (softmax with a
  forget gate per head and step, FoX; ``forget_bias``; :mod:`posenc.forgetting`),
  ``"stick_breaking"`` (:mod:`posenc.stick_breaking`), or one kind per layer: TransNormer is
  ``["diag"] * (n // 2) + ["norm"] * (n - n // 2)`` with ``ffn="glu"``
  (:mod:`posenc.layers`, :mod:`posenc.decay`).

Two evaluation-time switches change softmax attention without retraining:

* ``model.window = w`` restricts every query to its ``w`` most recent keys
  (a causal sliding window, :func:`posenc.sliding_window_mask`; a list sets one
  window per layer, ``None`` for a global layer); with
  ``w`` equal to the training length this is the "super baseline" of length
  extrapolation (Su, 2023);
* ``model.log_n_scaling = True`` (with ``model.train_len = L``) multiplies
  the query at position ``i`` by ``max(1, log n_i / log L)``, where ``n_i``
  is the number of keys it sees (``i + 1``, or at most ``window``): log-n
  scaling (Su, 2021; Chiang & Cholak, 2022). Its learned form,
  ``log_n_scaling="ssmax"`` (Scalable-Softmax, :mod:`posenc.ssmax`), is part
  of the architecture: given when the model is built, it stays.

Evaluation-time position tricks for long contexts (Chapter "Stretching a trained model"):

* ``model.sinks = k`` keeps the first ``k`` tokens visible to every query in
  addition to the window (StreamingLLM's attention sinks, Xiao et al., 2024;
  :func:`posenc.sink_attention`; tokens keep their original positions, or,
  in a RoPE model with ``model.sink_positions = "cache"``, positions within
  StreamingLLM's rolling cache, :func:`posenc.streaming_attention`);
* ``model.rope_scaling = ("yarn", 4)`` (a RoPE model): a context-extension
  rule of :mod:`posenc.extend` ("linear", "ntk", "dynamic", "yarn",
  "llama3", or ReRoPE / Self-Extend: ``("rerope", w)``, ``("self_extend", G, w)``),
  ``None`` for plain RoPE. Rules that need the training length read
  ``train_len`` when they are set.

None of these enters :attr:`TinyLM.config`: a trained model keeps its cache
key whatever they are.

Softmax attention goes through :func:`posenc.relative_attention`: PyTorch's
``scaled_dot_product_attention`` with the position bias given per distance,
so that no ``(heads, n, n)`` bias is stored and ALiBi runs on the fused
causal kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from ._validate import check_bool, check_int, check_number, checked_targets, one_of
from .extend import RopeScaling, rope_scaling
from .decay import _decay_value
from ._blocks import FFNS, Block
from .layers import ATTENTION_KINDS, GATE_KINDS, Positions, attention_layer, kind_options, options_config
from .linear import FEATURE_MAPS, feature_map
from ._positions import builtin, check_same, position_ids, scheme_positions, takes_positions
from ._saving import _check_rebuilt, _config_arguments, load_model, save_model
from .scheme import LayerSchemes, PositionScheme, _bind_checked, position_scheme
from .ssmax import log_n_factors

__all__ = ["TinyLM", "save_model", "load_model"]

class TinyLM(nn.Module):
    """A small decoder-only language model with one position scheme and one attention kind per layer.

    ``forward(idx)`` maps token ids ``(batch, seq)`` to next-token logits
    ``(batch, seq, vocab_size)``. Token ``t``'s logits depend only on tokens
    ``0 .. t`` (causal), whatever the scheme, attention, window or scaling.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream (divisible by ``n_heads``;
            ``d_model / n_heads`` must be even for rotations).
        n_layers: number of blocks.
        n_heads: attention heads per block.
        position: a name in :data:`posenc.POSITION_SCHEMES` or a :class:`posenc.PositionScheme`
            object (one per model), or a list with one per layer (:class:`posenc.LayerSchemes`:
            schemes that act inside attention, ``"none"`` included; e.g. RoPE and NoPE layers
            interleaved, ``["rope", "rope", "rope", "none"]`` as Llama 4), or a scheme's config
            (a dict: ``TinyLM(**model.config)`` rebuilds a model).
        attention: a kind in :data:`posenc.ATTENTION_KINDS` for every layer,
            or a sequence of ``n_layers`` kinds.
        ffn: ``"mlp"`` (GELU) or ``"glu"`` (SiLU-gated) feed-forward blocks.
        window: causal sliding window ``w`` (each query sees its ``w`` most
            recent keys, itself included), or ``None`` for full causal
            attention, or a list with one per layer (local and global layers
            interleaved, as Gemma 2 and 3: ``[w, None, w, None]``). An
            attribute you may change on a trained model.
        log_n_scaling: multiply queries by ``max(1, log n_i / log train_len)``
            (``n_i`` = keys seen by query ``i``; needs ``train_len``); or
            ``"ssmax"``: by ``s_h log n_i`` with ``s_h`` learned per head and
            layer, starting at 1 (Scalable-Softmax, Nakanishi, 2025). Softmax layers.
        train_len: the training length ``L`` used by log-n scaling
            (:func:`posenc.train` sets it when it is ``None``).
        dropout: dropout on attention outputs, feed-forward outputs and embeddings.
        d_ff: feed-forward hidden width (default ``4 * d_model``).
        diag_block: block size of ``"diag"`` layers.
        feature: feature map of ``"linear"`` and ``"norm"`` layers.
        decay: per-head decay of ``"decay"`` layers: ``"retnet"`` (``1 - 2^(-5-h)``),
            ``"alibi"`` (``exp(-m_h)``) or ``(n_heads,)`` rates in ``(0, 1]``
            (:func:`posenc.decay_rates`; in :attr:`config` as the name or a list of floats).
        gate_temperature: ``tau`` of the gates ``sigmoid(w.x+b)^(1/tau)`` of ``"gated"`` layers.
        gate: ``"head"`` (one gate per head and step, Mamba-2's granularity) or
            ``"channel"`` (one per head, step and key channel, GLA's) for ``"gated"`` layers.
        sink_logit: a learned logit per head in every softmax row's normaliser
            (gpt-oss's sinks, :func:`posenc.sink_logit_attention`): a head may
            put less than all of its attention on the tokens. Softmax layers.
        forget_bias: the initial bias ``b_h`` of the forget gates of ``"forgetting"``
            layers (0, as the FoX authors: gates start near 1/2; :class:`posenc.ForgettingAttention`).
        **position_options: options of a scheme given by name, e.g.
            ``max_len`` (``"learned"``: rows of the table), ``base``
            (``"rope"``, ``"xpos"``), ``partial`` (``"rope"``: the rotated
            fraction of each head) and ``original_max_position`` (``"rope"``:
            the training length for scaling rules), ``scale_base`` (``"xpos"``), ``dim``
            (``"sandwich"``), ``num_buckets``, ``max_distance`` (``"t5"``).

    Embeddings are initialised ``N(0, 1)`` (tokens and learned positions, the
    PyTorch default), so an added sinusoidal table (entries in ``[-1, 1]``) is
    on the same scale; linear layers ``N(0, 0.02^2)`` with the residual
    projections shrunk by ``1/sqrt(2 n_layers)`` (GPT-2). The output layer is
    a separate linear map (no weight tying).

    Raises:
        ValueError: on an unknown scheme or attention kind, non-positive
            sizes, ``d_model`` not divisible by ``n_heads``, a scheme that
            cannot serve these sizes (an odd head dimension for a rotation,
            a bias of the wrong shape), a distance bias with non-softmax
            layers, a bad window, or ``log_n_scaling`` without ``train_len``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        position: Union[str, PositionScheme, Sequence[Union[str, PositionScheme]], Mapping[str, Any]] = "rope",
        *,
        attention: Union[str, Sequence[str]] = "softmax",
        ffn: str = "mlp",
        window: Union[None, int, Sequence[Optional[int]]] = None,
        log_n_scaling: Union[bool, str] = False,
        train_len: Optional[int] = None,
        dropout: float = 0.0,
        d_ff: Optional[int] = None,
        diag_block: int = 64,
        feature: str = "elu+1",
        decay: Any = "retnet",
        gate_temperature: float = 16.0,
        gate: str = "head",
        sink_logit: bool = False,
        forget_bias: float = 0.0,
        **position_options: Any,
    ) -> None:
        super().__init__()
        if torch.empty(0).is_meta:  # torch.device("meta") as a context, or torch.set_default_device("meta")
            raise ValueError("TinyLM cannot be built on the meta device (torch.device('meta')): it computes and "
                             "checks its position tables when built; build it on a real device, e.g. 'cpu'")
        vocab_size = check_int("vocab_size", vocab_size)
        d_model = check_int("d_model", d_model)
        n_layers = check_int("n_layers", n_layers)
        n_heads = check_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        rebuilt = dict(position) if isinstance(position, Mapping) else None  # TinyLM(**model.config)
        if rebuilt is not None:
            position, feature, diag_block = _config_arguments(rebuilt, position_options, feature, diag_block,
                                                              d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        try:
            kinds = [attention] * n_layers if isinstance(attention, str) else list(attention)
        except TypeError:  # None, a number
            kinds = []
        if len(kinds) != n_layers or any(not isinstance(kd, str) for kd in kinds):
            raise ValueError(f"attention must be one of {ATTENTION_KINDS} or a sequence of {n_layers} of them, "
                             f"got {attention!r}")
        kinds = [one_of("attention", kd, ATTENTION_KINDS, also=f" or a sequence of {n_layers} of them") for kd in kinds]
        ffn = one_of("ffn", ffn, FFNS)
        dropout = check_number("dropout", dropout, what=" in [0, 1)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        d_ff = 4 * d_model if d_ff is None else check_int("d_ff", d_ff)
        diag_block = check_int("diag_block", diag_block)  # checked (and a Python int) whatever the kinds
        if not isinstance(feature, str):
            raise ValueError(f"feature must be the name of a feature map, one of {sorted(FEATURE_MAPS)}, "
                             f"got {feature!r}")
        feature_map(feature)
        decay = _decay_value(decay, n_heads)  # checked (and Python values) whatever the kinds
        gate_temperature = check_number("gate_temperature", gate_temperature, 0.0)
        gate = one_of("gate", gate, GATE_KINDS)
        sink_logit = check_bool("sink_logit", sink_logit)
        if sink_logit and "softmax" not in kinds:
            raise ValueError(f"sink_logit joins the softmax normaliser; attention={kinds} has no softmax layer")
        ssmax = isinstance(log_n_scaling, str) and one_of("log_n_scaling", log_n_scaling, ("ssmax",),
                                                           also=", True or False") == "ssmax"
        forget_bias = check_number("forget_bias", forget_bias)

        if isinstance(position, (list, tuple)):  # one scheme per layer; a name given twice is one object
            if len(position) != n_layers:
                raise ValueError(f"a list of position schemes needs one per layer: {n_layers} layers, got "
                                 f"{len(position)} ({list(position)!r})")
            named: Dict[str, PositionScheme] = {}
            for p in position:
                if isinstance(p, str) and p not in named:
                    named[p] = position_scheme(p, **position_options)
            scheme = LayerSchemes([named[p] if isinstance(p, str) else position_scheme(p) for p in position])
        else:
            scheme = position_scheme(position, **position_options)
        _bind_checked(scheme, d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        for i, kd in enumerate(kinds):
            own = scheme.layer(i) if isinstance(scheme, LayerSchemes) else scheme
            if own.biases and kd != "softmax":
                hint = (" ALiBi's slopes act on a linear state as a decay: position='none', attention='decay', "
                        "decay='alibi'" if own.name == "alibi" else "")
                raise ValueError(f"position={own.name!r} adds a bias to the attention logits, which only softmax "
                                 f"layers have; attention={kinds} (linear kinds take rotations and absolute "
                                 f"schemes).{hint}")

        self.vocab_size, self.d_model, self.n_layers, self.n_heads = vocab_size, d_model, n_layers, n_heads
        self.attention_kinds = kinds
        self._config: Dict[str, Any] = dict(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                                            n_heads=n_heads, dropout=float(dropout), d_ff=d_ff)
        # layer settings enter the config only where they matter
        if any(kd != "softmax" for kd in kinds):
            self._config["attention"] = kinds
        if ffn != "mlp":
            self._config["ffn"] = ffn
        if sink_logit:
            self._config["sink_logit"] = True
        if ssmax:
            self._config["log_n_scaling"] = log_n_scaling = "ssmax"
        options = kind_options(feature=feature, diag_block=diag_block, decay=decay, gate_temperature=gate_temperature,
                               gate=gate, forget_bias=forget_bias)
        self._config.update(options_config(options, kinds))

        self.tok = nn.Embedding(vocab_size, d_model)
        self.position = scheme
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(attention_layer(kd, d_model, n_heads, bias=True, dropout=dropout, **options[kd],
                                   **(dict(sink_logit=sink_logit, ssmax=ssmax) if kd == "softmax" else {})),
                   d_model, d_ff, ffn, dropout)
            for kd in kinds
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

        self.window = window  # validated by the property setter
        self._sinks, self._sink_positions = 0, "original"
        self.train_len = train_len
        self.log_n_scaling = log_n_scaling
        scheme.snapshot()
        self.reset_parameters()
        with torch.no_grad():  # a scheme that cannot serve this model fails now, not at the first forward
            self._positions(min(3, self.max_len or 3), torch.device("cpu"))
        if rebuilt is not None:
            _check_rebuilt(rebuilt, self.position.config())

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "TinyLM":
        """A new model (fresh weights) of the architecture ``config``, a :attr:`config`: ``TinyLM(**config)``.

        The scheme is rebuilt from its config (a class of yours imported, as by
        :func:`load_model`, which also restores saved weights).
        """
        if not isinstance(config, Mapping) or not isinstance(config.get("position"), Mapping):
            raise ValueError(f"config must be a TinyLM's config (a dict whose 'position' is a dict), got {config!r}")
        return cls(**config)

    # ------------------------------------------------------------------ settings

    @property
    def config(self) -> Dict[str, Any]:
        """The architecture (everything that shapes the weights and the training).

        ``position`` is the scheme's :meth:`~posenc.PositionScheme.config`.
        ``window``, ``sinks``, ``rope_scaling``, ``log_n_scaling`` and
        ``train_len`` are evaluation-time settings and are not part of it.
        """
        return dict(self._config, position=self.position.config())

    @property
    def max_len(self) -> Optional[int]:
        """The longest sequence the position scheme can run (``None``: any length)."""
        return self.position.max_len

    def _softmax_only(self, what: str) -> None:
        if any(kd != "softmax" for kd in self.attention_kinds):
            raise ValueError(f"{what} applies to softmax attention; this model has {self.attention_kinds}")

    @property
    def window(self) -> Union[None, int, tuple]:
        """Causal sliding window (``None``: full causal attention), or a tuple with one per layer."""
        return self._window

    @window.setter
    def window(self, value: Union[None, int, Sequence[Optional[int]]]) -> None:
        if isinstance(value, (list, tuple)):  # local and global layers (Gemma 2 and 3)
            if len(value) != self.n_layers:
                raise ValueError(f"a list of windows needs one per layer (an int, or None for a global layer): "
                                 f"{self.n_layers} layers, got {len(value)} ({list(value)!r})")
            value = tuple(None if w is None else check_int(f"window[{i}]", w) for i, w in enumerate(value))
            for i, w in enumerate(value):
                if w is not None and self.attention_kinds[i] != "softmax":
                    raise ValueError(f"a window applies to softmax attention; layer {i} is "
                                     f"{self.attention_kinds[i]!r}")
            value = None if all(w is None for w in value) else value
        elif value is not None:
            value = check_int("window", value)
            self._softmax_only("a window")
        self._window = value

    def _layer_windows(self) -> List[Optional[int]]:
        """The window of every layer (``None``: global)."""
        w = self.window
        return list(w) if isinstance(w, tuple) else [w] * self.n_layers

    @property
    def sinks(self) -> int:
        """First tokens kept visible to every query next to the :attr:`window` (attention sinks); 0: none."""
        return self._sinks

    @sinks.setter
    def sinks(self, value: int) -> None:
        value = check_int("sinks (the number of first tokens kept)", value, low=0)
        if value:
            self._softmax_only("attention sinks")
        self._sinks = value

    @property
    def sink_positions(self) -> str:
        """Positions of the sinks: ``"original"`` (the true ones) or ``"cache"`` (StreamingLLM's rolling cache, RoPE)."""
        return self._sink_positions

    @sink_positions.setter
    def sink_positions(self, value: str) -> None:
        if value not in ("original", "cache"):
            raise ValueError(f"sink_positions must be 'original' or 'cache', got {value!r}")
        if value == "cache" and not callable(getattr(self.position, "attend", None)):
            raise ValueError("sink_positions='cache' re-indexes rotary positions: it needs a RoPE model "
                             f"(position='rope'), this one has position={self.position.name!r}")
        self._sink_positions = value

    @property
    def rope_scaling(self) -> Optional[RopeScaling]:
        """The RoPE scheme's evaluation-time scaling (:class:`posenc.RopeScaling`), or ``None``.

        Set it to anything :func:`posenc.rope_scaling` accepts: ``("linear", 4)``,
        ``("ntk", 4)``, ``("dynamic",)``, ``("yarn", 4)``, ``("llama3", 8)``,
        ``("rerope", w)``, ``("self_extend", G, w)``, a :class:`posenc.RopeScaling`,
        or ``None``. Rules that need the training length (dynamic, YaRN, Llama 3)
        take it from the scaling, the scheme's ``original_max_position`` or
        :attr:`train_len` (``ValueError`` if none is known).
        """
        return getattr(self.position, "scaling", None)

    @rope_scaling.setter
    def rope_scaling(self, value: Any) -> None:
        if not callable(getattr(self.position, "set_scaling", None)):
            if value is None:
                return
            raise ValueError(f"rope_scaling applies to a RoPE model (position='rope'); this one has "
                             f"position={self.position.name!r}")
        scaling = rope_scaling(value)
        if scaling is not None and scaling.two_pass:  # checked first: a refused value changes nothing
            self._softmax_only(f"rope scaling {scaling.method!r}")
        self.position.set_scaling(scaling, train_len=self.train_len)

    @property
    def train_len(self) -> Optional[int]:
        """Training length ``L`` used by log-n scaling."""
        return self._train_len

    @train_len.setter
    def train_len(self, value: Optional[int]) -> None:
        if value is not None:
            value = check_int("train_len", value, low=2)
        self._train_len = value

    @property
    def log_n_scaling(self) -> Union[bool, str]:
        """Multiply queries by ``max(1, log n / log train_len)`` (True), or by a learned ``s_h log n`` ("ssmax")."""
        return self._log_n

    @log_n_scaling.setter
    def log_n_scaling(self, value: Union[bool, str]) -> None:
        built = self._config.get("log_n_scaling", False)  # "ssmax" has weights: fixed when the model is built
        if isinstance(value, str):
            value = one_of("log_n_scaling", value, ("ssmax",), also=", True or False")
        elif not isinstance(value, bool):
            raise ValueError(f"log_n_scaling must be True, False or 'ssmax', got {value!r}")
        if (value == "ssmax") != (built == "ssmax"):
            raise ValueError("log_n_scaling='ssmax' learns a scale per head, so it is part of the architecture: "
                             "build the model with it (TinyLM(..., log_n_scaling='ssmax')); it cannot be switched "
                             f"on or off afterwards (this model: {built!r}, asked: {value!r})")
        if value is True and self.train_len is None:
            raise ValueError("log_n_scaling=True needs train_len (the training length L)")
        if value:
            self._softmax_only("log-n scaling")
        self._log_n = value

    def extra_repr(self) -> str:
        return (f"window={self.window}, log_n_scaling={self.log_n_scaling}, train_len={self.train_len}"
                + (f", sinks={self.sinks}" if self.sinks else "")
                + (f", sink_positions={self.sink_positions!r}" if self.sink_positions != "original" else "")
                + (f", rope_scaling={self.rope_scaling.config()}" if self.rope_scaling is not None else "")
                + (f", attention={self.attention_kinds}" if "attention" in self._config else ""))

    # ------------------------------------------------------------ initialisation

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw fresh weights (from ``generator`` if given, for reproducibility).

        Token embeddings ``N(0, 1)``; then the position scheme's
        :meth:`~posenc.PositionScheme.reset_parameters`; linear weights
        ``N(0, 0.02^2)``, biases 0, the two residual projections of each block
        ``N(0, (0.02 / sqrt(2 n_layers))^2)`` (GPT-2); norms 1 and 0.
        """
        def normal(t: torch.Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=generator) * std)

        normal(self.tok.weight, 1.0)
        self.position.reset_parameters(generator)
        residual_std = 0.02 / math.sqrt(2 * self.n_layers)
        for block in self.blocks:
            for ln in (block.ln1, block.ln2):
                ln.weight.fill_(1.0)
                ln.bias.zero_()
            for lin, std in ((block.attn.qkv, 0.02), (block.attn.proj, residual_std),
                             (block.mlp.fc, 0.02), (block.mlp.proj, residual_std)):
                normal(lin.weight, std)
                lin.bias.zero_()
            if getattr(block.attn, "gain", None) is not None:
                block.attn.gain.fill_(1.0)
            if getattr(block.attn, "sink_logits", None) is not None:
                block.attn.sink_logits.zero_()
            if getattr(block.attn, "ssmax_scale", None) is not None:  # SSMax: s_h = 1
                block.attn.ssmax_scale.fill_(1.0)
            if getattr(block.attn, "forget_gate", None) is not None:  # FoX: w ~ N(0, 0.02^2), b = forget_bias
                normal(block.attn.forget_gate.weight, 0.02)
                block.attn.forget_gate.bias.fill_(block.attn.forget_bias)
            if getattr(block.attn, "gate", None) is not None:  # "gated" layers: gates start near 0.5^(1/tau)
                normal(block.attn.gate.weight, 0.02)
                block.attn.gate.bias.zero_()
        self.ln_f.weight.fill_(1.0)
        self.ln_f.bias.zero_()
        normal(self.head.weight, 0.02)

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def state_numbers(self, n: int) -> int:
        """Numbers one head keeps, summed over the layers, to generate token ``n + 1`` after reading ``n`` tokens.

        A softmax layer keeps a key and a value (``2 * head_dim`` numbers) for
        every token it may still attend to: all ``n``, or at most ``window +
        sinks``; a stick-breaking layer the same, a forgetting layer also its
        cumulative log gate (``2 * head_dim + 1``); a diag layer (TransNormer's local one) those of its current
        block, at most ``block_size``; a linear layer its state ``S``
        (``head_dim x head_dim``) and normaliser ``z`` (``head_dim``); a norm,
        decay or gated layer ``S`` alone (it has no denominator). Only the
        first grows with ``n``.
        """
        n, d = check_int("n", n), self.d_model // self.n_heads
        total = 0
        for kind, block, window in zip(self.attention_kinds, self.blocks, self._layer_windows()):
            if kind in ("softmax", "forgetting", "stick_breaking"):  # FoX also keeps a log gate sum per token
                total += (2 * d + (kind == "forgetting")) * (n if window is None else min(n, window + self.sinks))
            elif kind == "diag":
                total += 2 * d * min(n, block.attn.block_size)
            else:
                total += d * d + (d if kind == "linear" else 0)
        return total

    # ---------------------------------------------------------------- position

    def _log_n_scale(self, t: int, device: torch.device, window: Optional[int]) -> Optional[torch.Tensor]:
        """``(seq, 1)`` factors ``max(1, log n_i / log L)`` in a layer with ``window``, or None if all are 1."""
        if self.log_n_scaling is not True:  # False, or "ssmax": its layers scale by their own s_h log n_i
            return None
        scale = log_n_factors(t, self.train_len, window=window)
        if bool((scale == 1).all()):
            return None
        return scale.to(device=device, dtype=torch.float32)[:, None]

    def _positions(self, t: int, device: torch.device, ids: Optional[torch.Tensor] = None) -> List[Positions]:
        """What every attention layer needs to know about positions at length ``t`` (or at ids ``(batch, t)``)."""
        if isinstance(self.position, LayerSchemes):
            per_scheme = {id(s): scheme_positions(s, t, device, ids, n_layers=self.n_layers,
                                                  sink_positions=self.sink_positions)
                          for s in self.position.schemes}
            out = [per_scheme[id(self.position.layer(i))][i] for i in range(self.n_layers)]
        else:
            out = scheme_positions(self.position, t, device, ids, n_layers=self.n_layers,
                                   sink_positions=self.sink_positions)
        scales: Dict[Optional[int], Optional[torch.Tensor]] = {}
        for i, w in enumerate(self._layer_windows()):
            window = w if w is not None and w < t else None
            if window not in scales:
                scales[window] = self._log_n_scale(t, device, window)
            sinks = self.sinks if window is not None else 0
            out[i] = dataclasses.replace(out[i], window=window, q_scale=scales[window], sinks=sinks)
            if sinks and self.sink_positions == "cache" and ids is None:  # StreamingLLM's cache positions
                out[i] = dataclasses.replace(out[i], attend=functools.partial(self.position.attend,
                                                                              cache_positions=True))
        return out

    # ------------------------------------------------------------------ forward

    def _require_values(self) -> None:
        if any(p.is_meta for p in self.parameters()):  # shapes, no values
            raise ValueError("this model is on the meta device (shapes, no values): it cannot compute logits; "
                             "model.to_empty(device='cpu') then load_state_dict(...) gives it weights")

    def _embed(self, idx: torch.Tensor, ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not isinstance(idx, torch.Tensor) or idx.ndim != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be (batch, seq) integer token ids, got "
                             f"{tuple(getattr(idx, 'shape', ()))} {getattr(idx, 'dtype', type(idx).__name__)}")
        if idx.shape[1] < 1:
            raise ValueError("idx must hold at least one token")
        if idx.is_meta:
            raise ValueError("idx is on the meta device, which holds shapes but no values: TinyLM needs the token "
                             "ids (use a real device, e.g. 'cpu' or 'cuda')")
        if bool(((idx < 0) | (idx >= self.vocab_size)).any()):  # one check, not an IndexError (or a CUDA assert)
            raise ValueError(f"token ids must be in [0, {self.vocab_size}) (vocab_size), got values from "
                             f"{int(idx.min())} to {int(idx.max())}")
        x = self.tok(idx)  # (batch, seq, d_model)
        if self.position.embeds:
            if ids is not None:
                takes_positions(self.position, "embed")
            try:
                out = self.position.embed(x) if ids is None else self.position.embed(x, positions=ids)
            except IndexError as err:  # a table of a scheme of yours shorter than the sequence
                rows = [m.num_embeddings for m in self.position.modules() if isinstance(m, nn.Embedding)]
                raise ValueError(f"{type(self.position).__name__}.embed() raised IndexError ({err}) at positions up to "
                                 f"{idx.shape[1] - 1 if ids is None else int(ids.max())}: its tables have {rows or '?'} "
                                 f"rows (max_len={self.position.max_len}); build it with a larger table") from None
            if not builtin(self.position):
                check_same(out, x, f"{type(self.position).__name__}.embed(x)", "(batch, seq, d_model)")
            x = out
        return self.drop(x)

    def forward(self, idx: torch.Tensor, return_attention: bool = False, *,
                positions: Optional[torch.Tensor] = None):
        """Next-token logits.

        Args:
            idx: ``(batch, seq)`` int64 token ids in ``[0, vocab_size)``, on any
                device (moved to the model's; so are ``positions``).
            positions: the tokens' position ids, ``(seq,)`` or ``(batch, seq)``
                integers ``>= 0``, strictly increasing along each sequence;
                ``None``: ``0 .. seq-1``. Added tables are read at the ids,
                rotations turn by them, distance biases take the ids'
                differences (one ``(batch, heads, seq, seq)`` tensor instead of
                the fused per-distance path); a window counts tokens. Used by
                randomized positions and PoSE (:func:`posenc.train`'s
                ``position_sampling``).
            return_attention: ``True``: also return every layer's attention weights
                (computed explicitly, slower); not ``True`` or ``False``: ``ValueError``.

        Returns:
            ``(batch, seq, vocab_size)`` logits; position ``t`` predicts token
            ``t + 1``. With ``return_attention``: ``(logits, weights)``, where
            ``weights`` is a list with one ``(batch, heads, seq, seq)`` tensor
            per layer (softmax and DiagAttention layers: probabilities; linear
            layers: ``phi(q_i) . phi(k_j)`` over the row sum; NormAttention
            layers: the raw scores before the norm; decay and gated layers:
            the decayed scores before the norm; forgetting layers:
            probabilities; stick-breaking layers: the weights with the
            remainder on the diagonal).
        """
        return_attention = check_bool("return_attention", return_attention)
        self._require_values()
        if isinstance(idx, torch.Tensor) and not idx.is_meta and idx.device != self.tok.weight.device:
            idx = idx.to(self.tok.weight.device)  # ids follow the model: a batch drawn on the CPU, a model on the GPU
        ids = None if positions is None else position_ids(positions, idx)
        x = self._embed(idx, ids)
        weights: Optional[List[torch.Tensor]] = [] if return_attention else None
        for block, layer_positions in zip(self.blocks, self._positions(idx.shape[1], x.device, ids)):
            x = block(x, layer_positions, weights)
        logits = self.head(self.ln_f(x))  # (batch, seq, vocab_size)
        return (logits, weights) if return_attention else logits

    @torch.no_grad()
    def attention_inputs(self, idx: torch.Tensor) -> List[torch.Tensor]:
        """Per layer, the ``(batch, seq, d_model)`` input of its attention (after the pre-norm).

        ``model.blocks[i].attn`` applied to it gives layer ``i``'s attention
        output; e.g. ``model.blocks[i].attn.denominator(x)`` for a ``"linear"`` layer.
        """
        self._require_values()
        x = self._embed(idx)
        inputs = []
        for block, positions in zip(self.blocks, self._positions(idx.shape[1], x.device)):
            inputs.append(block.ln1(x))
            x = block(x, positions, None)
        return inputs

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, *, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Mean cross-entropy (nats) over targets that are not ``-100`` (ignored); ``positions`` as in :meth:`forward`.

        ``ValueError`` unless ``targets`` are integer ids of ``idx``'s shape, each in ``[0, vocab_size)`` or
        ``-100``, and not all ``-100`` (:func:`posenc._validate.checked_targets`).
        """
        logits = self(idx, positions=positions)
        targets = checked_targets(targets, tuple(logits.shape[:2]), self.vocab_size, logits.device)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
