"""The expected answers of the exercises, computed with the library's own functions or the chapters' formulas.

:mod:`posenc.exercises` checks a reader's answer against these: one function
per exercise whose answer is computed (a number, a few numbers, a tensor), or
the reference a function answer is compared with on several inputs. Nothing
here is stored: every value is computed when it is asked for.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch

from .alibi import alibi_slopes
from .kerple import kerple_log_bias, kerple_power_bias
from .linear import linear_attention
from .masks import relative_positions, sliding_window_mask
from .extend import (rope_frequencies_dynamic_ntk, rope_frequencies_interpolated, rope_frequencies_ntk,
                     yarn_attention_factor)
from .forgetting import forgetting_bias
from .rotary import p_rope_frequencies, rope_frequencies
from .sinusoidal import sinusoidal_period_coverage
from .t5 import t5_relative_buckets
from .transnormer import block_diagonal_mask
from .xpos import xpos_scales


def _bfloat16_collision() -> int:
    marker = (1 / torch.arange(1, 4000, dtype=torch.float64)).to(torch.bfloat16)  # 1/(i+1) in bfloat16
    return int((marker[1:] == marker[:-1]).nonzero()[0].item())


def _far_fraction(L: int, n: int) -> float:  # the n x n query-key pairs with |i - j| >= L (no mask)
    return (relative_positions(n).abs() >= L).double().mean().item()


def _key_weight(n: int, a: float) -> float:  # softmax weight of a key with logit a among n keys, the others at 0
    return torch.cat([torch.tensor([a]), torch.zeros(n - 1)]).double().softmax(0)[0].item()


def _turning_pairs(L: int, d: int, base: float) -> int:
    return int((sinusoidal_period_coverage(L, d, base) == 1).sum())


def _slow_pairs(base: float, L: int, d: int) -> int:
    return int((2 * math.pi / rope_frequencies(d, base) > L).sum())


def _random_gap(L: int, M: int) -> float:
    # Mean gap between neighbouring ids of a sorted uniform sample of L distinct ids from 0 .. M-1:
    # the k-th smallest has mean k (M + 1) / (L + 1) - 1, so neighbours are (M + 1) / (L + 1) apart.
    return (M + 1) / (L + 1)


def _random_pick(k: int, n: int) -> float:  # the queried record (1/k), or another whose value equals the answer
    return 1 / k + (1 - 1 / k) / n


def _p_rope_pairs(dim: int, base: float, p: float) -> tuple:
    # (pairs left unrotated, longest wavelength still rotating) of p-RoPE.
    freqs = p_rope_frequencies(dim, base, p)
    turning = freqs[freqs > 0]
    return int((freqs == 0).sum()), (2 * math.pi / turning.min()).item() if len(turning) else 0.0


def _ntk_base(d: int, base: float, s: float) -> float:  # NTK-aware theta_i = b' ** (-2i/d): b' off pair 1
    return rope_frequencies_ntk(d, base, s)[1].item() ** (-d / 2)


def _dynamic_base(n: int, L: int, d: int, base: float, a: float) -> float:
    # The base of dynamic NTK scaling at length n, read off pair 1 of the library's frequencies.
    return rope_frequencies_dynamic_ntk(d, n, L, base, a)[1].item() ** (-d / 2)


def _llama3_pairs(d: int, base: float, L: int) -> Tuple[int, int, int]:
    # Pairs (unchanged, divided by the factor, smoothed) of the Llama 3.1 rule, low 1 and high 4.
    wavelength = 2 * math.pi / rope_frequencies(d, base)
    fast, slow = int((wavelength < L / 4).sum()), int((wavelength > L).sum())
    return fast, slow, d // 2 - fast - slow


def _yarn_temperature(s: float) -> float:
    return 1 / yarn_attention_factor(s) ** 2  # sqrt(1/t) = 0.1 ln s + 1


def _slow_after_pi(d: int, base: float, L: int, s: float) -> int:
    return int((2 * math.pi / rope_frequencies_interpolated(d, base, s) > L).sum())


def _random_weights() -> List[tuple]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(out, inp, generator=g, dtype=torch.float64),)
            for out, inp in [(16, 32), (8, 8), (64, 10), (2, 5)]]


def _log_kernel_reach(r2: float, n_keys: int = 200) -> int:
    # Last distance at which -log(1 + r2 t) is at least 0.9 times -r2 t (r1 = 1).
    log_k = kerple_log_bias(1.0, r2, 1, n_keys)[0, 0].flip(0)[1:]  # distances 1 .. n_keys-1
    ok = log_k / (-r2 * torch.arange(1, n_keys)) >= 0.9
    return int(ok.nonzero().max()) + 1 if ok.any() else 0


def _new_weight(w: float, c: float) -> float:
    # Weight of a key that had weight w once c is added to its logit alone (the other keys share 1 - w).
    return (torch.tensor([math.log(w) + c, math.log1p(-w)], dtype=torch.float64)).softmax(0)[0].item()


def _mirror_differences(n: int = 12) -> List[int]:
    # Pairs (i, j) whose bias differs from that of (j, i): KERPLE, and T5 with 32 different table values.
    kerple, t5 = kerple_power_bias(1.0, 0.5, n)[0], t5_relative_buckets(relative_positions(n), bidirectional=True)
    return [int((kerple != kerple.T).sum()), int((t5 != t5.T).sum())]


def _far_share(r1: float, r2: float, n_keys: int = 2**22, near: int = 128) -> float:
    # Share of the keys `near` or more back (identical keys); the row is long enough to stand for the limit.
    weights = kerple_log_bias(*torch.tensor([[r1], [r2]], dtype=torch.float64), 1, n_keys)[0, 0].softmax(-1)
    return weights[: n_keys - near].sum().item()


def _last_bucket_size(n_keys: int) -> int:
    return int((t5_relative_buckets(-torch.arange(n_keys), bidirectional=False) == 31).sum())


def _xpos_float16_base(L: int = 32768, d: int = 64) -> float:
    # The largest factor is F(B) = (1/zeta_0) ** (e/B): B * ln F(B) does not depend on B.
    scales = xpos_scales(torch.arange(L), d, scale_base=4096.0)
    largest = torch.maximum(scales, 1 / scales).max().item()
    return 4096.0 * math.log(largest) / math.log(torch.finfo(torch.float16).max)


def _alibi_reach(m: float, s: float) -> int:
    # Largest distance D at which a key with logit s - m D keeps half of the attention against D keys at 0.
    D = torch.arange(1, int(s / m) + 2, dtype=torch.float64)
    ok = 1 / (1 + D * torch.exp(m * D - s)) >= 0.5
    return int(D[ok].max().item()) if ok.any() else 0


def _gradient_ratio(c: float = 1e-3) -> float:
    # |grad wrt phi(q)| at c * q divided by the one at q (relu features, eps = 0).
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(1, 1, 8, 4, generator=g, dtype=torch.float64) for _ in range(4))
    grads = [torch.autograd.grad((linear_attention(qc, k.abs(), v, feature="relu", eps=0.0) * w).sum(), qc)[0]
             for qc in ((scale * q.abs()).requires_grad_() for scale in (1.0, c))]
    return (grads[1].norm() / grads[0].norm()).item()


def _diag_fraction(n: int, w: int) -> float:
    return block_diagonal_mask(n, w).sum().item() / (n * (n + 1) / 2)


def _fox_slope(f: float) -> float:
    # The ALiBi slope of a forget gate held at f: minus the bias one step back, D_(i, i-1) = log f.
    return -forgetting_bias(torch.full((1, 1, 2), math.log(f), dtype=torch.float64))[0, 0, 1, 0].item()


def _half_weight_gaps(n: int, s: float) -> Tuple[float, float]:
    # The logit gap that keeps half the weight on one key among n (the others at 0): plain softmax needs
    # e^gap = n - 1, SSMax (logits times s log n) needs n^(s gap) = n - 1.
    return math.log(n - 1), math.log(n - 1) / (s * math.log(n))


def _window_fraction(n: int, w: int) -> float:
    # Share of the n(n+1)/2 causal query-key pairs that a causal window of w keys computes.
    return sliding_window_mask(n, window=w).sum().item() / (n * (n + 1) / 2)


def _reach_100() -> List[int]:
    slope_sets = alibi_slopes(8, dtype=torch.float64), torch.arange(8, 0, -1, dtype=torch.float64) / 8
    return [int((math.log(100) / m > 100).sum()) for m in slope_sets]


def _mean_lookback() -> torch.Tensor:
    # Mean of the geometric weights (1 - r) r^delta, r = e^-m, over a long past.
    m, delta = alibi_slopes(8, dtype=torch.float64)[:, None], torch.arange(100_000, dtype=torch.float64)
    return (-torch.expm1(-m) * torch.exp(-m * delta) * delta).sum(-1)
