"""A tiny decoder-only Transformer with a switchable position scheme.

:class:`TinyLM` is a small GPT (pre-norm blocks, causal self-attention, a
4x MLP; in the spirit of Karpathy's nanoGPT) whose only moving part is *how
it knows where a token is*. One argument, ``position``, chooses among

==================  ==========================================================
``"none"``          no position information at all (NoPE; the causal mask
                    still leaks some, Haviv et al. 2022)
``"learned"``       a learned table of absolute position vectors added to the
                    token embeddings (GPT-2); it has ``max_len`` rows
``"sinusoidal"``    Vaswani et al. (2017)'s fixed table, added to the tokens
``"rope"``          rotary embedding of queries and keys (Su et al., 2021)
``"alibi"``         linear distance penalty on the logits (Press et al., 2022)
``"kerple_power"``  learned ``-r1 |m-n|^r2`` (Chi et al., 2022)
``"kerple_log"``    learned ``-r1 log(1 + r2 |m-n|)`` (Chi et al., 2022)
``"sandwich"``      ``p_m . p_n`` of sinusoidal vectors as a bias (Chi et al., 2023)
``"xpos"``          RoPE with an exponential decay (Sun et al., 2023)
``"t5"``            learned bias per bucket of distances (Raffel et al., 2020)
==================  ==========================================================

Every scheme except ``"learned"`` runs at any length: biases and rotations are
computed for the length at hand, not read from a table of fixed size.

Two evaluation-time switches change attention without retraining:

* ``model.window = w`` restricts every query to its ``w`` most recent keys
  (a causal sliding window, :func:`posenc.sliding_window_mask`); with
  ``w`` equal to the training length this is the "super baseline" of length
  extrapolation (Su, 2023);
* ``model.log_n_scaling = True`` (with ``model.train_len = L``) multiplies
  the query at position ``i`` by ``max(1, log n_i / log L)``, where ``n_i``
  is the number of keys it sees (``i + 1``, or at most ``window``): log-n
  scaling (Su, 2021; Chiang & Cholak, 2022).

All attention goes through :func:`posenc.relative_attention`: PyTorch's
``scaled_dot_product_attention`` with the position bias given per distance,
so that no ``(heads, n, n)`` bias is stored and ALiBi runs on the fused
causal kernel.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .alibi import alibi_slopes
from .attention import relative_attention
from .bias import KerpleBias, T5RelativeBias, sandwich_bias
from .rope import RotaryEmbedding
from .sinusoidal import sinusoidal_embedding
from .xpos import XPos

__all__ = ["POSITION_SCHEMES", "TinyLM"]

#: The values accepted by ``TinyLM(position=...)``.
POSITION_SCHEMES: Tuple[str, ...] = (
    "none",
    "learned",
    "sinusoidal",
    "rope",
    "alibi",
    "kerple_power",
    "kerple_log",
    "sandwich",
    "xpos",
    "t5",
)
_ABSOLUTE = ("learned", "sinusoidal")  # added to the token embeddings
_LEARNED_BIAS = ("kerple_power", "kerple_log", "t5")  # a bias with parameters


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class _Attention(nn.Module):
    """Multi-head causal self-attention; position enters through ``rotate`` and ``bias``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, ctx: Dict[str, Any]) -> torch.Tensor:
        b, t, c = x.shape  # (batch, seq, d_model)
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv  # each (batch, heads, seq, head_dim)
        if ctx["rotate"] is not None:  # RoPE or xPos: rotate (and scale) q and k, both in one pass
            q, k = ctx["rotate"].rotate_stacked(qkv[:2])
        if ctx["q_scale"] is not None:  # log-n scaling, (seq, 1) per query position
            q = q * ctx["q_scale"].to(q.dtype)
        table = ctx["distance_bias"]
        if callable(table):  # a learned bias of this layer (KERPLE)
            table = _distance_table(table(1, t))
        # a bias per distance (never stored as (heads, t, t)) and the window: pe.relative_attention
        # picks the fused kernel, ALiBi folded into q and k, or query chunks
        want = ctx["weights"] is not None  # also record the attention weights
        y = relative_attention(q, k, v, slopes=ctx["slopes"], distance_bias=table, window=ctx["window"],
                               return_weights=want)
        if want:
            y, w = y
            ctx["weights"].append(w)  # (batch, heads, seq, seq)
        y = y.transpose(1, 2).reshape(b, t, c)  # (batch, seq, d_model)
        return self.drop(self.proj(y))


def _distance_table(last_row: torch.Tensor) -> torch.Tensor:
    """``(heads, 1, n)`` bias of the last query over keys ``0..n-1`` -> ``(heads, n)`` by distance ``0..n-1``."""
    return last_row[:, 0].flip(-1)


class _Block(nn.Module):
    """Pre-norm Transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 kerple: Optional[str]) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _Attention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout)
        )
        # KERPLE learns its kernel parameters in every layer (as in the authors' code)
        self.kerple = KerpleBias(n_heads, kind=kerple) if kerple else None

    def forward(self, x: torch.Tensor, ctx: Dict[str, Any]) -> torch.Tensor:
        if self.kerple is not None:
            ctx = {**ctx, "distance_bias": self.kerple}
        x = x + self.attn(self.ln1(x), ctx)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A small decoder-only language model with one switchable position scheme.

    ``forward(idx)`` maps token ids ``(batch, seq)`` to next-token logits
    ``(batch, seq, vocab_size)``. Token ``t``'s logits depend only on tokens
    ``0 .. t`` (causal), whatever the scheme, window or scaling.

    Args:
        vocab_size: number of token ids.
        d_model: width of the residual stream (divisible by ``n_heads``;
            ``d_model / n_heads`` must be even for ``"rope"`` and ``"xpos"``).
        n_layers: number of blocks.
        n_heads: attention heads per block.
        position: one of :data:`POSITION_SCHEMES` (see the module docstring).
        max_len: rows of the table of ``position="learned"`` (required there,
            and only there); longer inputs raise ``ValueError``.
        window: causal sliding window ``w`` (each query sees its ``w`` most
            recent keys, itself included), or ``None`` for full causal
            attention. An attribute you may change on a trained model.
        log_n_scaling: multiply queries by ``max(1, log n_i / log train_len)``
            (``n_i`` = keys seen by query ``i``). Needs ``train_len``.
        train_len: the training length ``L`` used by log-n scaling
            (:func:`posenc.train.train` sets it when it is ``None``).
        dropout: dropout on attention outputs, MLP outputs and embeddings.
        d_ff: MLP hidden width (default ``4 * d_model``).
        rope_base: RoPE / xPos base.
        xpos_scale_base: xPos decay scale ``B`` (512 in the paper).
        sandwich_dim: dimension of the sinusoidal vectors of Sandwich.
        t5_num_buckets, t5_max_distance: the T5 bias's buckets (shared by all layers).

    Embeddings are initialised ``N(0, 1)`` (tokens and learned positions, the
    PyTorch default), so an added sinusoidal table (entries in ``[-1, 1]``) is
    on the same scale; linear layers ``N(0, 0.02^2)`` with the residual
    projections shrunk by ``1/sqrt(2 n_layers)`` (GPT-2). The output layer is
    a separate linear map (no weight tying).

    Raises:
        ValueError: on an unknown scheme, non-positive sizes, ``d_model`` not
            divisible by ``n_heads``, an odd head dimension for RoPE/xPos,
            ``max_len`` missing for (or given to a scheme other than)
            ``"learned"``, a bad window, or ``log_n_scaling`` without ``train_len``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        position: str = "rope",
        *,
        max_len: Optional[int] = None,
        window: Optional[int] = None,
        log_n_scaling: bool = False,
        train_len: Optional[int] = None,
        dropout: float = 0.0,
        d_ff: Optional[int] = None,
        rope_base: float = 10000.0,
        xpos_scale_base: float = 512.0,
        sandwich_dim: int = 128,
        t5_num_buckets: int = 32,
        t5_max_distance: int = 128,
    ) -> None:
        super().__init__()
        _positive_int("vocab_size", vocab_size)
        _positive_int("d_model", d_model)
        _positive_int("n_layers", n_layers)
        _positive_int("n_heads", n_heads)
        if position not in POSITION_SCHEMES:
            raise ValueError(f"position must be one of {POSITION_SCHEMES}, got {position!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        head_dim = d_model // n_heads
        if position in ("rope", "xpos") and head_dim % 2:
            raise ValueError(f"{position} rotates channel pairs: head_dim = d_model / n_heads "
                             f"must be even, got {head_dim}")
        if position == "sinusoidal" and d_model % 2:
            raise ValueError(f"sinusoidal needs an even d_model, got {d_model}")
        if position == "learned":
            _positive_int("max_len (the size of the learned table)", max_len)
        elif max_len is not None:
            raise ValueError(f"max_len is the size of the learned table; position={position!r} "
                             "has no table and runs at any length, so leave max_len=None")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        d_ff = 4 * d_model if d_ff is None else _positive_int("d_ff", d_ff)

        self.vocab_size, self.d_model, self.n_layers, self.n_heads = vocab_size, d_model, n_layers, n_heads
        self.position, self.max_len = position, max_len
        self._config: Dict[str, Any] = dict(
            vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
            position=position, max_len=max_len, dropout=float(dropout), d_ff=d_ff,
        )
        # scheme-specific hyperparameters enter the config only where they matter
        if position in ("rope", "xpos"):
            self._config["rope_base"] = float(rope_base)
        if position == "xpos":
            self._config["xpos_scale_base"] = float(xpos_scale_base)
        if position == "sandwich":
            self._config["sandwich_dim"] = sandwich_dim
        if position == "t5":
            self._config.update(t5_num_buckets=t5_num_buckets, t5_max_distance=t5_max_distance)

        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model) if position == "learned" else None
        self.drop = nn.Dropout(dropout)
        kerple = position.split("_")[1] if position.startswith("kerple") else None
        self.blocks = nn.ModuleList(
            _Block(d_model, n_heads, d_ff, dropout, kerple) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

        self.rope = RotaryEmbedding(head_dim, rope_base) if position == "rope" else None
        self.xpos = XPos(head_dim, rope_base, scale_base=xpos_scale_base) if position == "xpos" else None
        self.t5 = (T5RelativeBias(n_heads, t5_num_buckets, t5_max_distance)
                   if position == "t5" else None)
        self._sandwich_dim = sandwich_dim
        # ALiBi's fixed slopes, (n_heads,): moves with the model, not trained, not saved
        self.register_buffer("alibi_slopes", alibi_slopes(n_heads) if position == "alibi" else None,
                             persistent=False)
        self._cache: Dict[Tuple[int, str], torch.Tensor] = {}

        self.window = window  # validated by the property setter
        self.train_len = train_len
        self.log_n_scaling = log_n_scaling
        self.reset_parameters()

    # ------------------------------------------------------------------ settings

    @property
    def config(self) -> Dict[str, Any]:
        """The architecture (everything that shapes the weights and the training).

        ``window``, ``log_n_scaling`` and ``train_len`` are evaluation-time
        settings and are not part of it.
        """
        return dict(self._config)

    @property
    def window(self) -> Optional[int]:
        """Causal sliding window (``None``: full causal attention)."""
        return self._window

    @window.setter
    def window(self, value: Optional[int]) -> None:
        if value is not None:
            _positive_int("window", value)
        self._window = value

    @property
    def train_len(self) -> Optional[int]:
        """Training length ``L`` used by log-n scaling."""
        return self._train_len

    @train_len.setter
    def train_len(self, value: Optional[int]) -> None:
        if value is not None:
            _positive_int("train_len", value, low=2)
        self._train_len = value

    @property
    def log_n_scaling(self) -> bool:
        """Multiply queries by ``max(1, log n / log train_len)``."""
        return self._log_n

    @log_n_scaling.setter
    def log_n_scaling(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"log_n_scaling must be True or False, got {value!r}")
        if value and self.train_len is None:
            raise ValueError("log_n_scaling=True needs train_len (the training length L)")
        self._log_n = value

    def extra_repr(self) -> str:
        return (f"position={self.position!r}, window={self.window}, "
                f"log_n_scaling={self.log_n_scaling}, train_len={self.train_len}")

    # ------------------------------------------------------------ initialisation

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Draw fresh weights (from ``generator`` if given, for reproducibility).

        Embeddings ``N(0, 1)``; linear weights ``N(0, 0.02^2)``, biases 0, the
        two residual projections of each block ``N(0, (0.02 / sqrt(2 n_layers))^2)``
        (GPT-2); LayerNorms 1 and 0; KERPLE ``r1, r2`` uniform as in the
        authors' code; T5 bias ``N(0, 0.05^2)``.
        """
        def normal(t: torch.Tensor, std: float) -> None:
            t.copy_(torch.randn(t.shape, generator=generator) * std)

        normal(self.tok.weight, 1.0)
        if self.pos is not None:
            normal(self.pos.weight, 1.0)
        residual_std = 0.02 / math.sqrt(2 * self.n_layers)
        for block in self.blocks:
            for ln in (block.ln1, block.ln2):
                ln.weight.fill_(1.0)
                ln.bias.zero_()
            for lin in (block.attn.qkv, block.attn.proj, block.mlp[0], block.mlp[2]):
                std = residual_std if lin in (block.attn.proj, block.mlp[2]) else 0.02
                normal(lin.weight, std)
                lin.bias.zero_()
            if block.kerple is not None:
                s1, s2 = (1.0, 2.0) if block.kerple.kind == "power" else (2.0, 1.0)
                block.kerple.r1.copy_(torch.rand(self.n_heads, generator=generator) * s1)
                block.kerple.r2.copy_(torch.rand(self.n_heads, generator=generator) * s2)
                block.kerple.clamp_parameters()
        self.ln_f.weight.fill_(1.0)
        self.ln_f.bias.zero_()
        normal(self.head.weight, 0.02)
        if self.t5 is not None:
            normal(self.t5.relative_attention_bias.weight, 0.05)

    def num_parameters(self) -> int:
        """Number of trainable parameters."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ---------------------------------------------------------------- position

    def _sandwich_table(self, t: int, device: torch.device) -> torch.Tensor:
        """Sandwich bias by distance, ``(heads, t)``, cached per length."""
        key = (t, str(device))
        if key not in self._cache:
            if len(self._cache) >= 8:
                self._cache.clear()
            self._cache[key] = _distance_table(sandwich_bias(self.n_heads, 1, t, dim=self._sandwich_dim, device=device))
        return self._cache[key]

    def _log_n_scale(self, t: int, device: torch.device) -> Optional[torch.Tensor]:
        """``(seq, 1)`` factors ``max(1, log n_i / log L)``, or None if all are 1."""
        if not self.log_n_scaling:
            return None
        seen = torch.arange(1, t + 1, dtype=torch.float64)  # keys seen by query i: i + 1
        if self.window is not None:
            seen = seen.clamp(max=self.window)
        scale = (seen.log() / math.log(self.train_len)).clamp(min=1.0)
        if bool((scale == 1).all()):
            return None
        return scale.to(device=device, dtype=torch.float32)[:, None]

    def _context(self, t: int, device: torch.device) -> Dict[str, Any]:
        """What every attention layer needs to know about positions at length ``t``."""
        ctx: Dict[str, Any] = dict(rotate=self.rope or self.xpos, q_scale=self._log_n_scale(t, device),
                                   slopes=None, distance_bias=None, weights=None,
                                   window=self.window if self.window is not None and self.window < t else None)
        if self.position == "alibi":
            ctx["slopes"] = self.alibi_slopes
        elif self.position == "sandwich":
            ctx["distance_bias"] = self._sandwich_table(t, device)
        elif self.position == "t5":  # one table shared by all layers
            ctx["distance_bias"] = _distance_table(self.t5(1, t))
        # KERPLE: a table per layer, see _Block
        return ctx

    # ------------------------------------------------------------------ forward

    def forward(self, idx: torch.Tensor, return_attention: bool = False):
        """Next-token logits.

        Args:
            idx: ``(batch, seq)`` int64 token ids in ``[0, vocab_size)``.
            return_attention: also return every layer's attention weights
                (computed explicitly, slower).

        Returns:
            ``(batch, seq, vocab_size)`` logits; position ``t`` predicts token
            ``t + 1``. With ``return_attention``: ``(logits, weights)``, where
            ``weights`` is a list with one ``(batch, heads, seq, seq)`` tensor
            per layer.
        """
        if idx.ndim != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be (batch, seq) integer token ids, got {tuple(idx.shape)} {idx.dtype}")
        b, t = idx.shape
        if t < 1:
            raise ValueError("idx must hold at least one token")
        if self.pos is not None and t > self.max_len:
            raise ValueError(
                f"position='learned' has a table of max_len={self.max_len} positions and cannot "
                f"run a sequence of {t} tokens (that is the point: learned absolute positions do "
                "not extrapolate); build the model with a larger max_len"
            )
        x = self.tok(idx)  # (batch, seq, d_model)
        if self.pos is not None:
            x = x + self.pos.weight[:t]  # (seq, d_model) broadcast over the batch
        elif self.position == "sinusoidal":
            x = x + sinusoidal_embedding(t, self.d_model).to(device=x.device, dtype=x.dtype)
        x = self.drop(x)
        ctx = self._context(t, x.device)
        if return_attention:
            ctx["weights"] = []
        for block in self.blocks:
            x = block(x, ctx)
        logits = self.head(self.ln_f(x))  # (batch, seq, vocab_size)
        return (logits, ctx["weights"]) if return_attention else logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (nats) over targets that are not ``-100`` (ignored)."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
