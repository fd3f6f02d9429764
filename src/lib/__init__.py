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

from . import alibi, bias, masks, rope, runtime, sinusoidal, viz, xpos
from . import attention as _attention
from .alibi import *  # noqa: F401,F403
from .bias import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .masks import *  # noqa: F401,F403
from .rope import *  # noqa: F401,F403
from .runtime import *  # noqa: F401,F403
from .sinusoidal import *  # noqa: F401,F403
from .xpos import *  # noqa: F401,F403

__version__ = "0.1.0"

__all__ = [
    *sinusoidal.__all__,
    *rope.__all__,
    *alibi.__all__,
    *bias.__all__,
    *masks.__all__,
    *_attention.__all__,
    *xpos.__all__,
    *runtime.__all__,
    "viz",
]
