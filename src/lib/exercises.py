"""Answer checkers for the exercises at the end of every chapter.

Exercises whose answer is a number, a few numbers, a function or a position
scheme have a checker here, named by chapter and number (``"3.1"`` is
exercise 1 of chapter 3). :func:`check` prints one line and returns ``True``
or ``False``::

    answer = ...  # your answer
    pe.exercises.check("3.1", answer)    # 3.1: not answered yet (...)

An answer may be a number (integers are compared exactly, other numbers with
a tolerance chosen per exercise), a tuple or list of numbers, a tensor, a
*function* for the exercises that ask for a formula (called on several inputs
and compared with the library), or a position scheme (built into models of
several sizes). :func:`exercises` lists what each checker expects.

The expected values are not stored: they are computed with the library's own
functions, or from the formula the chapter derives, when :func:`check` runs.
When an answer is wrong, the checker gives a hint and says whether a number is
too large or too small, but does not print the expected value.

>>> check("4.1", lambda n: alibi_slopes(n))  # the library's own slopes pass
✓ 4.1: correct on all 13 test inputs. Extra heads take every other slope of twice as many.
True
>>> check("2.3", ...)
2.3: not answered yet (replace ... by your answer).
False
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, Optional, Tuple

import torch

from ._checking import _Exercise, _check_function, _compare, _describe, _expected_in_words, _plain, _value_problem
from .alibi import alibi_slopes
from .attention import log_length_scale
from .masks import sliding_window_mask
from .model import TinyLM
from .extend import rope_min_base, yarn_attention_factor
from .rotary import half_split_to_interleaved, rope_decay_bound
from .scheme import PositionScheme
from .sinusoidal import sinusoidal_wavelengths
from .xpos import blockwise_causal_mask

__all__ = ["check", "exercises"]


from ._answers import (_bfloat16_collision, _far_fraction, _key_weight, _turning_pairs, _slow_pairs, _random_gap, _random_pick, _p_rope_pairs, _ntk_base, _dynamic_base, _llama3_pairs, _yarn_temperature, _slow_after_pi, _random_weights, _log_kernel_reach, _new_weight, _mirror_differences, _far_share, _last_bucket_size, _xpos_float16_base, _alibi_reach, _gradient_ratio, _diag_fraction, _fox_slope, _half_weight_gaps, _window_fraction, _reach_100, _mean_lookback)


def _learned_alibi(answer: Any) -> Tuple[bool, str]:
    # Chapter 12: a scheme with the bias -m_h d, m_h learned and starting at alibi_slopes(n_heads).
    if not (isinstance(answer, PositionScheme) or isinstance(answer, type) and issubclass(answer, PositionScheme)):
        return False, f"expected a posenc.PositionScheme subclass or object, got {_describe(answer)}"
    hint, sizes = f"Hint: {_EXERCISES['12.3'].hint}", [(64, 4, 2), (48, 6, 1), (64, 8, 3), (16, 1, 1)]
    sizes = sizes if isinstance(answer, type) else [(answer.d_model or 64, answer.n_heads or 4, answer.n_layers or 2)]
    for d_model, heads, layers in sizes:
        try:  # an object is copied (the reader's is left as it is); TinyLM checks the shape of the bias
            scheme = answer() if isinstance(answer, type) else copy.deepcopy(answer)
            scheme = TinyLM(8, d_model, layers, heads, position=scheme).position
            bias = scheme.distance_bias(40, device=torch.device("cpu"), dtype=torch.float32)
            expected = -alibi_slopes(heads)[:, None] * torch.arange(40)
            wrong = ((bias.detach() - expected).abs() > 1e-5 + 1e-4 * expected.abs()).nonzero()
        except Exception as err:  # the reader's class failed: report, don't raise
            return False, f"with n_heads = {heads}: {type(err).__name__}: {err}. {hint}"
        if len(wrong):
            (*_, h, d), got = wrong[0].tolist(), bias.detach()[tuple(wrong[0])].item()
            problem = _value_problem(got, expected[h, d].item(), 0.0, 0.0)
            return False, f"with n_heads = {heads}, the bias of head {h} at distance {d}: {problem}. {hint}"
        learned = [p for p in scheme.parameters() if p.requires_grad]
        grads = torch.autograd.grad(bias.sum(), learned, allow_unused=True) if learned and bias.requires_grad else []
        if not any(g is not None and bool(g.abs().sum() > 0) for g in grads):
            return False, f"the bias does not depend on a learned torch.nn.Parameter. {hint}"
    return True, f" for {len(sizes)} model size{'s' * (len(sizes) > 1)}"


_EXERCISES: Dict[str, _Exercise] = {
    # Chapter 1: why position matters
    "1.2": _Exercise(
        title="the first position i whose bfloat16 marker 1/(i+1) equals that of i + 1",
        confirm="From here on neighbours start to collide; beyond a few hundred positions most do.",
        hint="store 1/(i+1) for many i in torch.bfloat16 and compare neighbours.",
        expected=_bfloat16_collision,
    ),
    "1.3": _Exercise(
        title="fraction of the n^2 pairs with |i - j| >= L, L = 512, n = 2048 "
              "(a number, or a function f(L, n))",
        confirm="More than half of the pairs have an offset never seen in training.",
        hint="count the pairs with i - j >= L and those with j - i >= L; "
             "pe.relative_positions(n) gives every j - i.",
        expected=lambda: _far_fraction(512, 2048), atol=1e-4,
        signature="f(L, n)", reference=_far_fraction,
        inputs=lambda: [(512, 2048), (4, 10), (1, 7), (3, 3), (5, 6), (100, 250)],
    ),
    "1.5": _Exercise(
        title="a function p(n, a): the attention weight of one key with logit a "
              "when the other n - 1 keys have logit 0",
        confirm="With fixed logits the key drowns as n grows; log-n scaling keeps it near 1/2.",
        hint="it is a softmax over n logits: one equal to a, the others 0.",
        signature="p(n, a)", reference=_key_weight, fn_rtol=1e-5,
        inputs=lambda: [(1, 0.0), (2, 0.0), (10, 1.0), (7, -2.5), (512, math.log(512)),
                        (4096, math.log(512)), (32768, math.log(512)),
                        (32768, math.log(512) * log_length_scale(32768, 512))],
    ),
    # Chapter 2: sinusoidal encoding
    "2.2": _Exercise(
        title="the longest wavelength of the sinusoidal encoding, d = 512, base 10000 (positions)",
        confirm="The slowest pair falls just short of 2π·base, which the table never reaches.",
        hint="pair i has the wavelength 2π / θ_i; which pair is the slowest, and what is its θ_i?",
        expected=lambda: sinusoidal_wavelengths(512, 10000.0).max().item(), rtol=1e-3,
    ),
    "2.3": _Exercise(
        title="number of channel pairs completing a full turn within L = 512 positions, "
              "d = 64, base 10000 (a number, or a function count(L, d, base))",
        confirm="Half of the 32 pairs never repeat during training.",
        hint="positions 0 .. L-1 sweep the angles 0 .. (L-1)·θ_i; count the pairs that reach 2π.",
        expected=lambda: _turning_pairs(512, 64, 10000.0),
        signature="count(L, d, base)", reference=_turning_pairs,
        inputs=lambda: [(512, 64, 10000.0), (100, 32, 10000.0), (2048, 128, 10000.0),
                        (1000, 64, 500000.0), (50, 8, 10.0), (4096, 128, 10000.0),
                        (512, 512, 10000.0), (7, 8, 10000.0), (100, 4, 10.0)],
    ),
    # Chapter 3: RoPE
    "3.1": _Exercise(
        title="RoPE pairs that never complete a turn in L = 8192 tokens, base 500000, d = 128 "
              "(a number, or a function slow_pairs(base, L, d))",
        confirm="A larger base slows every pair down, so more pairs stay within one turn.",
        hint="pair i has the wavelength 2π / θ_i, θ_i = base^(-2i/d); count those longer than L.",
        expected=lambda: _slow_pairs(500000.0, 8192, 128),
        signature="slow_pairs(base, L, d)", reference=_slow_pairs,
        inputs=lambda: [(500000.0, 8192, 128), (10000.0, 4096, 128), (10000.0, 512, 64),
                        (1e6, 32768, 128), (100.0, 50, 16), (10000.0, 2048, 32)],
    ),
    "3.2": _Exercise(
        title="value of the RoPE decay curve at distance 256 when every pair of d = 128 "
              "has the frequency 1/100",
        confirm="The curve stays flat at (d/2 + 1)/2: equal frequencies never cancel.",
        hint="pass inv_freq=torch.full((64,), 1 / 100) to pe.rope_decay_bound "
             "and look at the whole curve.",
        expected=lambda: rope_decay_bound(
            torch.tensor(256), 128, inv_freq=torch.full((64,), 0.01, dtype=torch.float64)).item(),
        rtol=1e-3,
    ),
    "3.3": _Exercise(
        title="a function to_inter(W) converting a half-split query or key weight "
              "(out, in) for interleaved RoPE",
        confirm="The converted weights give the same scores to rounding error.",
        hint="the pairs are output channels, the rows of an nn.Linear weight, "
             "and pe.half_split_to_interleaved permutes the last dimension.",
        signature="to_inter(W)", reference=lambda W: half_split_to_interleaved(W.T).T,
        inputs=_random_weights,
    ),
    "3.4": _Exercise(
        title="effective base of dynamic NTK scaling, d = 128, base 10000, L = 4096, at 10000 tokens",
        confirm="The slowest pair at position sL turns exactly as far as it did at L in training.",
        hint="s = (current length) / L; see how NTK-aware scaling (pe.rope_frequencies_ntk) changes the base.",
        expected=lambda: _ntk_base(128, 10000.0, 10000 / 4096), rtol=3e-5,  # rejects s = 9999 / 4096
    ),
    "3.5": _Exercise(
        title="YaRN's logit multiplier at s = 16 and at s = 64 (2 numbers)",
        confirm="The logits get sharper as the context grows, against the growing entropy.",
        hint="pe.yarn_attention_factor(s) multiplies q and k each, so the logits by its square.",
        expected=lambda: (yarn_attention_factor(16.0) ** 2, yarn_attention_factor(64.0) ** 2),
        atol=0.01,
    ),
    # Chapter 4: ALiBi
    "4.1": _Exercise(
        title="the slopes of a 12-head ALiBi model by the authors' rule, in head order "
              "(12 numbers, or a function alibi_slopes_for(H))",
        confirm="Extra heads take every other slope of twice as many.",
        hint="8 is the largest power of two below 12: 8 heads get the slopes of 8 heads, "
             "the other 4 come from the slopes of 16 heads.",
        expected=lambda: alibi_slopes(12, dtype=torch.float64), rtol=1e-4,
        signature="alibi_slopes_for(H)",
        reference=lambda H: alibi_slopes(H, dtype=torch.float64), fn_rtol=1e-6,
        inputs=lambda: [(n,) for n in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32)],
    ),
    "4.2": _Exercise(
        title="the distance at which each head of an 8-head ALiBi model halves its weight "
              "relative to the diagonal (8 numbers, unrounded)",
        confirm="The steepest head halves in under two tokens, the gentlest only after 177.",
        hint="with identical keys the weight ratio at distance δ is e^(-m_h δ).",
        expected=lambda: math.log(2) / alibi_slopes(8, dtype=torch.float64), rtol=1e-3, atol=5e-3,
    ),
    "4.3": _Exercise(
        title="how many of 8 heads see past 100 tokens (reach ln 100 / m): geometric slopes, "
              "then evenly spaced slopes 1, 7/8, ..., 1/8 (2 integers)",
        confirm="A geometric sequence spreads the heads evenly over scales.",
        hint="compute ln 100 / m for every slope of each set.",
        expected=_reach_100,
    ),
    "4.4": _Exercise(
        title="the slope of a 1-head ALiBi model, and the weight (relative to the diagonal) "
              "of a key 511 tokens back (2 numbers)",
        confirm="A single head is only mildly local.",
        hint="apply the slope rule with n = 1; with identical keys the weight ratio at "
             "distance δ is e^(-m δ).",
        expected=lambda: (alibi_slopes(1, dtype=torch.float64).item(),
                          math.exp(-511 * alibi_slopes(1, dtype=torch.float64).item())),
        rtol=1e-3,  # rejects the distances 510 and 512 (0.4 % away)
    ),
    "4.5": _Exercise(
        title="the mean distance each head of an 8-head ALiBi model looks back "
              "over an unbounded past of identical keys (8 numbers)",
        confirm="About 1/m - 1/2 tokens: close to 1/m for small slopes.",
        hint="the weights are (1 - r) r^δ with r = e^(-m); sum δ times the weight over δ >= 0.",
        expected=_mean_lookback, rtol=3e-3,
    ),
    # Chapter 5: KERPLE, Sandwich, T5
    "5.1": _Exercise(
        title="the last distance at which the log kernel (r1 = 1) is within 10 % of the line "
              "-r2 |m - n|, for r2 = 0.01 and r2 = 0.5 (2 integers, 0 if no distance qualifies)",
        confirm="The smaller r2, the longer the log kernel behaves like ALiBi before it bends.",
        hint="'within 10 %' means kernel / line >= 0.9; pe.kerple_log_bias(1.0, r2, 1, n) "
             "gives the kernel at distances n-1 .. 0.",
        expected=lambda: (_log_kernel_reach(0.01), _log_kernel_reach(0.5)),
    ),
    "5.2": _Exercise(
        title="keys in bucket 31 for the last query of a causal T5 model, with 512 keys "
              "and with 4096 keys (2 integers)",
        confirm="The table gives all of them the same bias: position cannot tell them apart.",
        hint="bucket 31 holds every distance from some threshold on; "
             "find it with pe.t5_relative_buckets.",
        expected=lambda: (_last_bucket_size(512), _last_bucket_size(4096)),
    ),
    "5.3": _Exercise(
        title="a function new_weight(w, c): the attention weight of a key that had weight w "
              "once c is added to its logit alone",
        confirm="A constant on every logit cancels; a constant on one key does not.",
        hint="the key's unnormalised weight is multiplied by e^c, those of the other keys (1 - w in all) are not.",
        signature="new_weight(w, c)", reference=_new_weight,
        inputs=lambda: [(0.5, 0.0), (0.5, math.log(3)), (0.1, 1.0), (0.9, -2.0), (0.01, 5.0),
                        (0.25, -0.5), (0.7, 30.0)],
    ),
    "5.4": _Exercise(
        title="(query, key) pairs of 12 tokens whose bias differs from that of (key, query): KERPLE, "
              "then the bidirectional T5 bias with 32 different table values (2 integers)",
        confirm="A bias of |i - j| is symmetric; T5's two sides use different buckets.",
        hint="count the entries where B differs from its transpose; pe.t5_relative_buckets(rel, "
             "bidirectional=True) gives the buckets, and different buckets mean different values here.",
        expected=_mirror_differences,
    ),
    "5.5": _Exercise(
        title="the limit, as the length grows, of the attention share of keys 128 or more positions back "
              "under the log kernel r1 = 2, r2 = 0.5, identical keys",
        confirm="For r1 > 1 the far keys keep a share below 1, however long the sequence.",
        hint="the weights are proportional to (1 + r2 t)^(-r1); sum them over t >= 128 and over t >= 0.",
        expected=lambda: _far_share(2.0, 0.5), rtol=3e-3,  # rejects 127 and 129 positions (0.8 % away)
    ),
    # Chapter 6: xPos
    "6.2": _Exercise(
        title="the smallest xPos scale base B (gamma = 0.4, centred) whose factors stay below "
              "the float16 maximum for 32,768 tokens",
        confirm="The paper's B = 512 overflows float16 at this length; B = 2048 fits.",
        hint="the largest factor is 1/ζ_0 raised to the largest exponent (pos - c)/B; "
             "set it equal to torch.finfo(torch.float16).max and solve for B.",
        expected=_xpos_float16_base, rtol=1e-3,
    ),
    "6.4": _Exercise(
        title="keys seen by each of 32 queries under BCA with w = 4, then under a causal "
              "window of 2w (2 sequences of 32 integers)",
        confirm="The window sees 2w keys once it is full; BCA restarts at every block boundary.",
        hint="count the allowed keys in each row of pe.blockwise_causal_mask and "
             "pe.sliding_window_mask.",
        expected=lambda: (blockwise_causal_mask(32, block=4).sum(-1),
                          sliding_window_mask(32, window=8).sum(-1)),
    ),
    # Chapter 7: local attention
    "7.4": _Exercise(
        title="the largest distance D at which an ALiBi key with logit s = 10 keeps half of "
              "the attention, m = 2^-8, n = D + 1 (a number, or a function reach(m, s))",
        confirm="Reach is a number of tokens set by the slope and the logit, not a multiple of L.",
        hint="write the key's weight against D other keys with logit 0 and ask when it is "
             "at least 1/2.",
        expected=lambda: _alibi_reach(2.0 ** -8, 10.0),
        signature="reach(m, s)", reference=_alibi_reach,
        inputs=lambda: [(2.0 ** -8, 10.0), (2.0 ** -4, 8.0), (0.5, 5.0),
                        (2.0 ** -6, 12.0), (2.0 ** -1, 1.0), (1e-4, 3.0)],
    ),
    # Chapter 8: stretching a trained model
    "8.1": _Exercise(
        title="the base of dynamic NTK scaling at n = 16384 for L = 4096, d = 128, base 10000, factor a = 2 "
              "(a number, or a function dynamic_base(n, L, d, base, a))",
        confirm="The base grows with the length; up to L it is the trained one.",
        hint="for n > L the scale is a n / L - (a - 1), raised to d / (d - 2); for n <= L nothing changes.",
        expected=lambda: _dynamic_base(16384, 4096, 128, 10000.0, 2.0), rtol=1e-5,
        signature="dynamic_base(n, L, d, base, a)", reference=_dynamic_base,
        inputs=lambda: [(16384, 4096, 128, 10000.0, 2.0), (16384, 4096, 128, 10000.0, 1.0),
                        (100, 4096, 128, 10000.0, 2.0), (512, 64, 16, 10000.0, 1.0), (96, 64, 16, 500.0, 4.0)],
    ),
    "8.2": _Exercise(
        title="pairs the Llama 3.1 rule leaves unchanged, divides by the factor and smooths, d = 128, "
              "base 500000, L = 8192 (3 integers, or a function llama3_pairs(d, base, L))",
        confirm="Only the pairs with wavelengths between L/4 and L are blended.",
        hint="pair i has the wavelength 2π / θ_i; compare it with L / high_freq_factor = L/4 and "
             "L / low_freq_factor = L.",
        expected=lambda: _llama3_pairs(128, 500000.0, 8192),
        signature="llama3_pairs(d, base, L)", reference=_llama3_pairs,
        inputs=lambda: [(128, 500000.0, 8192), (128, 10000.0, 4096), (16, 10000.0, 64), (64, 1e6, 32768)],
    ),
    "8.3": _Exercise(
        title="YaRN's temperature t at s = 8, from sqrt(1/t) = 0.1 ln s + 1 (a number, or a function t(s))",
        confirm="t < 1: the logits are divided by t, i.e. sharpened by (0.1 ln s + 1)^2.",
        hint="square both sides and invert.",
        expected=lambda: _yarn_temperature(8.0), rtol=1e-4,
        signature="t(s)", reference=_yarn_temperature,
        inputs=lambda: [(8.0,), (1.0,), (2.0,), (4.0,), (32.0,)],
    ),
    "8.4": _Exercise(
        title="RoPE pairs that complete less than one turn in L = 4096 tokens after position interpolation "
              "by s = 8, d = 128, base 10000 (a number, or a function slow_after_pi(d, base, L, s))",
        confirm="Interpolation slows every pair down: more of them never see a full turn.",
        hint="PI divides every θ_i by s, so it multiplies every wavelength 2π / θ_i by s; count those above L.",
        expected=lambda: _slow_after_pi(128, 10000.0, 4096, 8.0),
        signature="slow_after_pi(d, base, L, s)", reference=_slow_after_pi,
        inputs=lambda: [(128, 10000.0, 4096, 8.0), (128, 10000.0, 4096, 1.0), (16, 10000.0, 64, 4.0),
                        (64, 500000.0, 8192, 2.0)],
    ),
    # Chapter 9: training for length
    "9.1": _Exercise(
        title="mean gap between neighbouring position ids when randomized positions draw L = 64 ids from "
              "M = 1024 (a number, or a function gap(L, M))",
        confirm="The neighbour of a token sits about M / L ids away, and the gap varies from sequence to sequence.",
        hint="the k-th smallest of L distinct ids drawn from 0 .. M-1 has mean k (M + 1) / (L + 1) - 1.",
        expected=lambda: _random_gap(64, 1024), rtol=5e-4,
        signature="gap(L, M)", reference=_random_gap,
        inputs=lambda: [(64, 1024), (64, 64), (1, 10), (3, 7), (256, 4096)],
    ),
    "9.2": _Exercise(
        title="the smallest RoPE base whose sum of cos(m θ_i) stays >= 0 for every m up to 1024, head_dim 16 "
              "(a number to 1 %, or a function min_base(context_length, dim))",
        confirm="This is the base the chapter raises to for 16 L in the small mode: the bound grows quickly with the length.",
        hint="for a base b, compute B(m) = sum_i cos(m b^(-2i/d)) for m = 0 .. n; scan b upward (logarithmically) "
             "until no B(m) is negative, then narrow it down.",
        expected=lambda: rope_min_base(1024, 16), rtol=1e-2,
        signature="min_base(context_length, dim)", reference=rope_min_base,
        inputs=lambda: [(1024, 16), (64, 16), (256, 16), (1024, 64)],
    ),
    "9.3": _Exercise(
        title="p-RoPE with head_dim 16, base 10000, p = 0.75: pairs left unrotated, and the longest wavelength "
              "still rotating, in tokens (2 numbers, or a function p_rope_pairs(dim, base, p))",
        confirm="p-RoPE drops the slow end of the spectrum: what is left turns at least once every ~2000 tokens.",
        hint="the first int(p * dim / 2) pairs keep θ_i = base^(-2i/d); the wavelength of pair i is 2π / θ_i.",
        expected=lambda: _p_rope_pairs(16, 10000.0, 0.75), rtol=1e-3,
        signature="p_rope_pairs(dim, base, p)", reference=_p_rope_pairs,
        inputs=lambda: [(16, 10000.0, 0.75), (16, 10000.0, 0.5), (128, 10000.0, 0.75), (64, 500000.0, 0.25)],
    ),
    "9.4": _Exercise(
        title="a model that copies the value of a record picked at random among k = 2, each value drawn from "
              "n = 8 digits: how often is it right? (a number, or a function pick(k, n))",
        confirm="That is the baseline for the chapter's two-record test: about half, not one in eight.",
        hint="the picked record is the queried one with probability 1/k; else its value is right with probability 1/n.",
        expected=lambda: _random_pick(2, 8), rtol=1e-4,
        signature="pick(k, n)", reference=_random_pick,
        inputs=lambda: [(2, 8), (1, 10), (4, 8), (3, 2), (16, 10)],
    ),
    # Chapter 10: linear attention
    "10.1": _Exercise(
        title="gradient norm of normalised linear attention with respect to φ(q) at c = 1e-3, "
              "divided by the one at c = 1 (feature='relu', eps = 0)",
        confirm="The output ignores the scale of φ(q), so its gradient grows like 1/c.",
        hint="differentiate f(c x) = f(x) with respect to x.",
        expected=_gradient_ratio, rtol=1e-3,
    ),
    "10.2": _Exercise(
        title="numbers held by the linear-attention state (S and z) for d = e = 64, "
              "and by a key-value cache at n = 4096 (2 integers, per head)",
        confirm="The state has the same size at every length; the cache grows with n.",
        hint="S is d × e and z has d entries; a cache keeps a key and a value for every token.",
        # The state of the recurrence S_i = S_(i-1) + phi(k_i) v_i^T, z_i = z_(i-1) + phi(k_i).
        expected=lambda: (64 * 64 + 64, 4096 * (64 + 64)),
    ),
    "10.3": _Exercise(
        title="fraction of the n(n+1)/2 causal pairs that DiagAttention keeps, n = 1024, "
              "w = 16, 64, 256 (3 numbers, or a function kept(n, w))",
        confirm="DiagAttention keeps a fraction that grows like w / n: cheap, and only local.",
        hint="each of the n/w blocks keeps the causal pairs inside it.",
        expected=lambda: [_diag_fraction(1024, w) for w in (16, 64, 256)], rtol=3e-2,
        signature="kept(n, w)", reference=_diag_fraction,
        inputs=lambda: [(1024, 16), (1024, 64), (1024, 256), (12, 3), (8, 8), (6, 1), (100, 10)],
    ),
    # Chapter 11: positions from the content
    "11.1": _Exercise(
        title="the ALiBi slope m of a Forgetting Transformer head whose forget gate is held at f = 0.9 "
              "(a number, or a function slope(f))",
        confirm="A constant gate is ALiBi: every token passed costs log f of logit.",
        hint="the bias one step back is D_(i, i-1) = log f_i; ALiBi's is -m.",
        expected=lambda: _fox_slope(0.9), rtol=1e-4,
        signature="slope(f)", reference=_fox_slope,
        inputs=lambda: [(0.9,), (0.5,), (0.99,), (2.0 ** -0.5,), (1e-3,), (1.0,)],
    ),
    "11.2": _Exercise(
        title="the smallest logit gap that keeps half the weight on one key among n = 1024 (the others at 0), "
              "with plain softmax and with SSMax at s = 1 (2 numbers, or a function half_gaps(n, s))",
        confirm="Plain softmax needs a gap that grows like log n; SSMax's stays near 1 / s at every length.",
        hint="the key's weight is e^(c gap) / (e^(c gap) + n - 1), with c = 1 for softmax and c = s log n for SSMax; "
             "set it to 1/2.",
        expected=lambda: _half_weight_gaps(1024, 1.0), rtol=5e-5,
        signature="half_gaps(n, s)", reference=_half_weight_gaps,
        inputs=lambda: [(1024, 1.0), (2, 1.0), (16, 0.5), (4096, 2.0), (100, 0.3), (65536, 1.0)],
    ),
    # Chapter 12: summary
    "12.1": _Exercise(
        title="fraction of the n(n+1)/2 causal query-key pairs that a causal window of w = 512 keys "
              "computes at n = 4096 (a number to 5 digits, or a function window_share(n, w))",
        confirm="A window costs O(n w) instead of O(n^2 / 2): below 1 once n > w.",
        hint="query i sees min(i + 1, w) keys; add them up over i = 0 .. n - 1.",
        expected=lambda: _window_fraction(4096, 512), rtol=5e-5,
        signature="window_share(n, w)", reference=_window_fraction,
        inputs=lambda: [(4096, 512), (1024, 16), (8, 8), (8, 20), (100, 1), (37, 5), (2048, 2047)],
    ),
    "12.3": _Exercise(
        title="a PositionScheme subclass or object: ALiBi's bias -m_h (i - j), m_h learned, starting at ALiBi's",
        confirm="The slopes start as ALiBi's and now train with the model.",
        hint="create a torch.nn.Parameter of n_heads slopes in bind() (self.n_heads is known there), "
             "starting at pe.alibi_slopes(self.n_heads); distance_bias returns -slope[:, None] * d.",
        scheme=_learned_alibi,
    ),
}


def _lookup(exercise: Any) -> _Exercise:
    if not isinstance(exercise, str) or exercise not in _EXERCISES:
        raise ValueError(
            f"unknown exercise {exercise!r}: give 'chapter.number' as a string, "
            f"one of {', '.join(_EXERCISES)}"
        )
    return _EXERCISES[exercise]


def exercises(chapter: Optional[int] = None) -> Dict[str, str]:
    """The exercises that have a checker, with what each one expects.

    Args:
        chapter: only this chapter's exercises (default: all).

    Returns:
        dict from exercise id (``"chapter.number"``) to a one-line description,
        in reading order.

    >>> for key, title in exercises(chapter=10).items():
    ...     print(key, title[:40])
    10.1 gradient norm of normalised linear atten
    10.2 numbers held by the linear-attention sta
    10.3 fraction of the n(n+1)/2 causal pairs th
    """
    return {key: ex.title for key, ex in _EXERCISES.items()
            if chapter is None or key.split(".")[0] == str(chapter)}


def check(exercise: str, answer: Any) -> bool:
    """Check an answer to an exercise and print one line saying how it went.

    Args:
        exercise: ``"chapter.number"``, e.g. ``"3.1"`` (see :func:`exercises`).
        answer: a number, a tuple or list of numbers, a tensor, a function or a
            position scheme, as the exercise asks. ``...`` or ``None`` means "not answered yet".
            A function is called on several inputs and compared with the
            library; its exceptions are reported, not raised.

    Returns:
        ``True`` for a right answer, ``False`` otherwise (also when not answered).

    Raises:
        ValueError: for an unknown exercise id.

    >>> check("3.1", "many")
    ✗ 3.1: expected an integer, got the text 'many' (or a function slow_pairs(base, L, d))
    False
    >>> check("10.3", lambda n, w: w / n)
    ✗ 10.3: kept(1024, 16) is wrong (0.015625 is too small).
    Hint: each of the n/w blocks keeps the causal pairs inside it.
    False
    """
    ex = _lookup(exercise)
    if answer is None or answer is Ellipsis:
        print(f"{exercise}: not answered yet (replace ... by your answer).")
        return False
    try:
        if ex.scheme is not None:
            ok, message = ex.scheme(answer)
        elif callable(answer) and not isinstance(answer, torch.Tensor):
            if ex.signature is None:
                ok, message = False, f"expected {_expected_in_words(ex)}, got a function"
            else:
                ok, message = _check_function(ex, answer)
        elif ex.expected is None:
            ok, message = False, f"expected {_expected_in_words(ex)}, got {_describe(_plain(answer))}"
        else:
            problem = _compare(_plain(answer), _plain(ex.expected()), ex.rtol, ex.atol)
            if problem is None:
                ok, message = True, ""
            elif problem[0]:  # not the right kind of answer
                ok, message = False, problem[1]
                if ex.signature is not None and message.startswith("expected"):
                    message += f" (or a function {ex.signature})"
            else:
                ok, message = False, f"{problem[1]}. Hint: {ex.hint}"
    except OverflowError:  # an integer beyond any float (10**400): math.isclose cannot take it
        ok, message = False, f"an integer beyond any float (over 1.8e308) is far from the answer. Hint: {ex.hint}"
    print(f"✓ {exercise}: correct{message}. {ex.confirm}" if ok else f"✗ {exercise}: {message}")
    return ok
