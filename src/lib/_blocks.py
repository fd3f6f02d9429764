"""The Transformer block of :class:`posenc.TinyLM` (the model's helper): pre-norm attention and feed-forward."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Positions

#: The feed-forward kinds of ``TinyLM(ffn=...)``.
FFNS = ("mlp", "glu")


class FeedForward(nn.Module):
    """``"mlp"``: ``proj(gelu(fc(x)))`` (GPT-2); ``"glu"``: ``proj(silu(gate) * value)`` (Shazeer, 2020)."""

    def __init__(self, d_model: int, d_ff: int, kind: str, dropout: float) -> None:
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(d_model, (2 if kind == "glu" else 1) * d_ff)
        self.proj = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "glu":
            gate, value = self.fc(x).chunk(2, dim=-1)
            return self.drop(self.proj(F.silu(gate) * value))
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm Transformer block: ``x + attn(ln(x))``, then ``x + ffn(ln(x))``."""

    def __init__(self, attn: nn.Module, d_model: int, d_ff: int, ffn: str, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, d_ff, ffn, dropout)

    def forward(self, x: torch.Tensor, positions: Positions, weights: Optional[List[torch.Tensor]]) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), positions, weights)
        return x + self.mlp(self.ln2(x))
