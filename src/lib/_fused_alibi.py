"""ALiBi on PyTorch's fused causal kernel: two exact rewrites of ``-m_h (i - j)``.

Softmax ignores a constant per query, so ALiBi's bias may be replaced by one
that depends on the key only,

.. math:: -m_h (i - j) = m_h (j - c) - m_h (i - c),

with any centre ``c``; the second term is the same for every key of query ``i``
and drops out. What is left, ``m_h (j - c)``, reaches the fused kernel in one
of two ways:

* ``fold``: as one extra channel of ``q`` (a 1) and ``k`` (``m_h (j - c) /
  scale``): any SDPA kernel computes it, at ``head_dim + 1`` channels.
* ``key_bias``: as a ``(1, heads, 1, n)`` float mask, broadcast over the
  queries, that the CPU flash kernel adds to its causal scores. The kernel takes a causal
  flag and a mask together (PyTorch's public function refuses the pair), so no
  channel is added and nothing of size ``n^2`` is built.

Both keep ``c = (n - 1) / 2``, which halves the largest logit added: in
float32 the logits then round to about ``max(m) n 2^-25``. Half precision is
computed in float32 (in bfloat16 the logits would be off by 1 at ``n = 1024``)
and cast back.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

#: PyTorch's flash attention for the CPU, with the causal flag and a mask in one call (None in a torch without it).
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _key_term(slopes: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``m_h (j - (n - 1) / 2)`` for keys ``j = 0 .. n-1``: ``(heads, n)``, computed in float64."""
    j = torch.arange(n, device=slopes.device, dtype=torch.float64) - (n - 1) / 2
    return (slopes.double()[:, None] * j).to(dtype)


def _in_float32(path):
    """Run ``path`` in float32 for half-precision inputs and cast the output back."""
    @functools.wraps(path)
    def run(q, k, v, scale, slopes):
        if q.dtype in (torch.float16, torch.bfloat16):
            return path(q.float(), k.float(), v.float(), scale, slopes).to(q.dtype)
        return path(q, k, v, scale, slopes)
    return run


@_in_float32
def _path_fold(q, k, v, scale, slopes):
    """ALiBi as one extra channel: the key term ``m_h (j - c)`` is a product of a query feature (1) and a key feature."""
    b, h, n, _ = q.shape
    key_feature = (_key_term(slopes, n, torch.float64) / scale).to(q.dtype)  # (heads, n)
    ones = q.new_ones(b, h, n, 1)
    q1 = torch.cat([q, ones], dim=-1)
    k1 = torch.cat([k, key_feature[None, :, :, None].expand(b, h, n, 1)], dim=-1)
    v1 = torch.cat([v, ones], dim=-1)  # same width as q, k: keeps SDPA on its fused kernel
    return F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, scale=scale)[..., :-1]


@_in_float32
def _path_key_bias(q, k, v, scale, slopes):
    """ALiBi as a mask per key, ``(1, heads, 1, n)``, added by the CPU flash kernel to its causal scores.

    The kernel needs ``v`` as wide as ``q`` and ``k``; another width goes through the fold. It reads
    the channels of a row as adjacent numbers (it ignores ``stride(-1)``): a tensor whose last dimension
    is not dense (column-major last two dims, every other channel) is copied first; other layouts
    (heads and seq transposed, expanded, sliced along seq) pass as they are.
    """
    if v.shape[-1] != q.shape[-1]:
        return _path_fold(q, k, v, scale, slopes)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    mask = _key_term(slopes, k.shape[2], q.dtype)[None, :, None, :]
    return _CPU_FLASH(q, k, v, 0.0, True, attn_mask=mask, scale=scale)[0]


@functools.lru_cache(maxsize=None)
def key_bias_available() -> bool:
    """Whether this torch's CPU flash kernel takes a causal flag and a broadcast mask together (torch >= 2.3 or so).

    Checked once, on a tiny input against the explicit softmax, so that an older
    torch (or one that ignores the mask) never takes the path.
    """
    if _CPU_FLASH is None:
        return False
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
        slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)
        out = _path_key_bias(q, k, v, 0.5, slopes)
        d = torch.arange(5)[:, None] - torch.arange(5)
        scores = (q @ k.transpose(-2, -1)) * 0.5 - slopes[:, None, None] * d.clamp(min=0)
        ref = scores.masked_fill(d < 0, float("-inf")).softmax(-1) @ v
        return bool(torch.allclose(out, ref, atol=1e-10))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
