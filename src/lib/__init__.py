"""posenc: position encodings for Transformers and their length extrapolation.

The library behind the book *Train Short, Test Long*. One import serves every
chapter::

    import posenc as pe

    q = pe.apply_rope(q)                       # RoPE, (batch, heads, seq, head_dim)
    bias = pe.alibi_bias(8, q_len=512)         # (heads, q_len, k_len)
    out = pe.attention(q, k, v, bias=bias)     # causal softmax attention via SDPA

Conventions: tensors are ``(batch, heads, seq, head_dim)``; biases are
``(heads, q_len, k_len)``; masks are boolean with True = may attend; when
``k_len > q_len`` the queries are the last ``q_len`` key positions.

Every public name of the topic modules (``posenc.rope``, ``posenc.alibi``, ...)
is re-exported here; ``posenc.viz`` holds the plotting helpers.
"""

import importlib as _importlib

from . import exercises, viz

#: The topic modules whose public names are re-exported, in reading order.
_TOPICS = (
    "sinusoidal", "rope", "alibi", "bias", "xpos", "masks", "attention",
    "linear", "model", "data", "train", "runtime",
)

__all__ = []
for _name in _TOPICS:
    _module = _importlib.import_module(f".{_name}", __name__)
    for _public in _module.__all__:
        globals()[_public] = getattr(_module, _public)
    __all__ += list(_module.__all__)
__all__ += ["exercises", "viz"]
del _name, _module, _public

__version__ = "0.1.0"
