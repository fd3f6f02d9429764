"""Exercise checkers: right answers pass, wrong ones fail, unanswered ones say so.

The right answers are computed here as the chapters' solution cells compute
them, independently of the checkers.
"""

import math

import numpy as np
import pytest
import torch

import posenc as pe
from posenc.exercises import check, exercises


def _first_bfloat16_collision():
    stored = (1 / torch.arange(1, 2000, dtype=torch.float64)).to(torch.bfloat16)
    return (stored[1:] == stored[:-1]).nonzero()[0].item()


def _slow_pairs(base, L, d=128):
    return (2 * torch.pi / pe.rope_frequencies(d, base) > L).sum().item()


def _llama3_counts(d, base, L):
    """(unchanged, divided, smoothed) pairs of the Llama 3.1 rule, from the wavelengths written out."""
    wavelength = [2 * math.pi * base ** (2 * i / d) for i in range(d // 2)]
    fast, slow = sum(w < L / 4 for w in wavelength), sum(w > L for w in wavelength)
    return fast, slow, d // 2 - fast - slow


def _to_inter(W):
    return pe.half_split_to_interleaved(W.T).T


def _log_kernel_last(r2, n_keys=200):
    log_k = pe.kerple_log_bias(1.0, r2, 1, n_keys)[0, 0].flip(0)[1:]
    ok = log_k / (-r2 * torch.arange(1, n_keys)) >= 0.9
    return int(ok.nonzero().max()) + 1 if ok.any() else 0


def _bucket_31(n_keys):
    b = pe.t5_relative_buckets(-torch.arange(n_keys), bidirectional=False)
    return (b == 31).sum().item()


def _reach(m, s):
    return max(d for d in range(1, 100_000) if m * d + math.log(d) <= s)


def _gradient_ratio():
    q, k, v = torch.randn(3, 1, 1, 8, 4, dtype=torch.float64)
    g = torch.randn(1, 1, 8, 4, dtype=torch.float64)
    norms = []
    for c in (1.0, 1e-3):
        qc = (c * q.abs()).requires_grad_()
        (pe.linear_attention(qc, k.abs(), v, feature="relu", eps=0.0) * g).sum().backward()
        norms.append(qc.grad.norm().item())
    return norms[1] / norms[0]


def _authors_slopes(n):
    """ALiBi slopes written from the paper's rule, as a student would."""
    def power_of_two(p):
        return [2 ** (-8 * (h + 1) / p) for h in range(p)]
    p = 2 ** math.floor(math.log2(n))
    return power_of_two(p) + power_of_two(2 * p)[0::2][: n - p]


def _turning_pairs(L, d, base):
    return min(d // 2, max(0, math.floor(d / 2 * math.log((L - 1) / (2 * math.pi), base)) + 1))


def _yarn2(s):
    return pe.yarn_attention_factor(float(s)) ** 2


_slopes8 = pe.alibi_slopes(8, dtype=torch.float64)
_geometric_reach = math.log(100) / _slopes8
_linear_reach = math.log(100) / torch.arange(8, 0, -1, dtype=torch.float64) * 8
_m1 = pe.alibi_slopes(1, dtype=torch.float64).item()
_bca = pe.blockwise_causal_mask(32, block=4).sum(-1)
_window = pe.sliding_window_mask(32, window=8).sum(-1)
_xpos_limit = 32768 / 2 * math.log(1.4 / 0.4) / math.log(torch.finfo(torch.float16).max)
_ntk_s = 10000 / 4096
_zeta = lambda x, q: torch.special.zeta(torch.tensor(x, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)).item()
# Share of the keys t >= a back under weights (1 + t/2)^-2: sum_(t >= a) (t + 2)^-2 over sum_(t >= 0) (t + 2)^-2.
_far_share = lambda a: _zeta(2.0, a + 2.0) / _zeta(2.0, 2.0)

#: exercise -> (right value answers, wrong value answers)
VALUES = {
    "1.2": ([_first_bfloat16_collision()], [_first_bfloat16_collision() + 1, 188]),
    "1.3": ([(2048 - 512) * (2048 - 512 + 1) / 2048 ** 2,
             (pe.relative_positions(2048).abs() >= 512).double().mean().item(), 0.5628, 0.5629],
            [(1 - 512 / 2048) ** 2, 1536 * 1536 / 2048 ** 2,
             1537 * 1538 / 2048 ** 2, 1535 * 1536 / 2048 ** 2]),                    # off by one in L
    "2.2": ([pe.sinusoidal_wavelengths(512, 10000.0).max(), 2 * math.pi * 1e4 ** (510 / 512), 60611],
            [2 * math.pi * 1e4, 2 * math.pi * 1e4 ** (508 / 512)]),
    "2.3": ([_turning_pairs(512, 64, 10000.0),
             int((pe.sinusoidal_period_coverage(512, 64, 10000.0) == 1).sum())], [15, 17]),
    "3.1": ([_slow_pairs(500000.0, 8192), torch.tensor(29), np.int64(29)], [28, 30, 18]),
    "3.2": ([pe.rope_decay_bound(torch.arange(257), 128,
                                 inv_freq=torch.full((64,), 1 / 100, dtype=torch.float64))[256],
             (128 / 2 + 1) / 2], [32.0, 33.0, 0.0]),
    "3.4": ([10000.0 * _ntk_s ** (128 / 126), 24762],
            [10000.0 * _ntk_s, 10000.0 * _ntk_s ** 2, 24760,
             10000.0 * (9999 / 4096) ** (128 / 126), 10000.0 * (10001 / 4096) ** (128 / 126)]),  # length off by one
    "3.5": ([(_yarn2(16), _yarn2(64)), [1.63, 2.0], torch.tensor([1.631, 2.005])],
            [(pe.yarn_attention_factor(16.0), pe.yarn_attention_factor(64.0)), (_yarn2(64), _yarn2(16)),
             (_yarn2(16),)]),
    "4.1": ([pe.alibi_slopes(12, dtype=torch.float64), _authors_slopes(12)],
            [[2 ** (-8 * h / 12) for h in range(1, 13)], sorted(_authors_slopes(12), reverse=True)]),
    "4.2": ([math.log(2) / _slopes8, [1.39, 2.77, 5.55, 11.1, 22.2, 44.4, 88.7, 177.4],
             [1.39, 2.77, 5.55, 11.09, 22.18, 44.36, 88.72, 177.45]],
            [(math.log(2) / _slopes8).ceil(), 1 / _slopes8, [1, 3, 6, 11, 22, 44, 89, 177],
             math.log(2) * 2 ** torch.arange(8.0),                                   # heads counted from 0
             [math.log(2)] + (math.log(2) / _slopes8)[1:].tolist()]),                # ln 2 for one head
    "4.3": ([((_geometric_reach > 100).sum().item(), (_linear_reach > 100).sum().item())],
            [(4, 1), (3, 0), (5, 0)]),
    "4.4": ([(_m1, math.exp(-511 * _m1)), (1 / 256, 0.136)],
            [(1 / 16, math.exp(-511 / 16)), (1 / 256, math.exp(-512 / 16)),
             (1 / 256, math.exp(-510 / 256)), (1 / 256, math.exp(-512 / 256))]),    # off by one in the distance
    "4.5": ([1 / torch.expm1(_slopes8), [1.54, 3.52, 7.51, 15.51, 31.5, 63.5, 127.5, 255.5]],
            [1 / _slopes8, 1 / _slopes8 - 1, 1 / torch.expm1(_slopes8) + 1]),
    "5.1": ([(_log_kernel_last(0.01), _log_kernel_last(0.5)), [23, 0]], [(22, 0), (23, 1), (24, 0)]),
    "5.2": ([(_bucket_31(512), _bucket_31(4096))], [(400, 3984), (3983, 399)]),
    "5.4": ([(0, 132), [0, 12 * 11], torch.tensor([0, 132])], [(0, 66), (0, 144), (132, 0), (1, 132)]),
    "5.5": ([_far_share(128), 0.012, 0.01197], [_far_share(127), _far_share(129), 0.011, _far_share(0)]),
    "6.2": ([_xpos_limit, 1851], [2048, 512, 1900]),
    "6.4": ([(_bca, _window), (_bca.tolist(), _window.tolist())],
            [(_window, _bca), (_bca, _bca), (_bca[:-1], _window)]),
    "7.4": ([_reach(2 ** -8, 10.0)], [_reach(2 ** -8, 10.0) + 1, _reach(2 ** -8, 10.0) - 1]),
    "8.1": ([10000 * 7 ** (128 / 126), 72195.86, 72196],
            [10000 * 4 ** (128 / 126), 70000, 10000 * 8 ** (128 / 126), 72190,
             10000 * (2 * 16383 / 4096 - 1) ** (128 / 126)]),                                  # n off by one
    "8.2": ([(29, 29, 6), [29, 29, 6]], [(29, 6, 29), (30, 28, 6), (28, 29, 7)]),
    "8.3": ([1 / (0.1 * math.log(8) + 1) ** 2, 0.6853], [0.1 * math.log(8) + 1, 1.459, 1 / (0.1 * math.log(8) + 1)]),
    "8.4": ([33], [18, 32, 34]),
    "9.1": ([1025 / 65, 15.769], [1024 / 64, 1024 / 65, 1025 / 64]),
    "9.2": ([pe.rope_min_base(1024, 16), 4.6e5], [pe.rope_min_base(512, 16), pe.rope_min_base(1024, 64), 1e4, 5e5]),
    "9.3": ([(2, 2 * math.pi * 10000 ** (10 / 16)), (2, 1987)],
            [(6, 2 * math.pi * 10000 ** (10 / 16)), (2, 2 * math.pi * 10000 ** (12 / 16)), (2, 316.2)]),
    "9.4": ([0.5625, 1 / 2 + 1 / 16], [0.5, 1 / 8, 1 / 16, 0.625]),      # only the queried record; a guess; 1/2 + 1/8
    "10.1": ([_gradient_ratio(), 1000], [1e-3, 1e6, 100]),
    "10.2": ([(64 * 64 + 64, 4096 * 2 * 64)], [(64 * 64, 4096 * 2 * 64), (64 * 64 + 64, 4096 * 64)]),
    "10.3": ([[pe.block_diagonal_mask(1024, w).sum().item() / (1024 * 1025 / 2) for w in (16, 64, 256)],
             [0.0166, 0.0634, 0.2507], [0.017, 0.063, 0.25]],
            [[w / 1024 for w in (16, 64, 256)], [1.7, 6.3, 25.1]]),
    "11.1": ([-math.log(0.9), 0.10536], [0.1, 0.9, math.log(0.9), 1 / 0.9]),        # 1 - f; f; the sign; 1/f
    "11.2": ([(math.log(1023), math.log(1023) / math.log(1024)), (6.9305, 0.99986)],
             [(math.log(1024), 1.0), (math.log(1023), 1.0), (0.99986, math.log(1023)), (6.9305, 0.5)]),
    "12.1": ([(512 * 513 / 2 + 3584 * 512) / (4096 * 4097 / 2), 0.23435],
            [512 / 4096, (512 * 511 / 2 + 3584 * 512) / (4096 * 4097 / 2), 0.2343, 0.38]),   # w/n; off by one
}

def _window_share(n, w):
    """Queries 0 .. w-1 see i + 1 keys, the later ones w: written out, not read from the library."""
    w = min(w, n)
    return (w * (w + 1) / 2 + (n - w) * w) / (n * (n + 1) / 2)


#: exercise -> (right function answers, wrong function answers)
FUNCTIONS = {
    "1.3": ([lambda L, n: (n - L) * (n - L + 1) / n ** 2],
            [lambda L, n: (1 - L / n) ** 2, lambda L, n: (n - L) ** 2 / n ** 2]),
    "1.5": ([lambda n, a: math.exp(a) / (math.exp(a) + n - 1),
             lambda n, a: torch.tensor([a] + [0.0] * (n - 1)).softmax(0)[0]],
            [lambda n, a: math.exp(a) / (math.exp(a) + n), lambda n, a: 1 / n]),
    "2.3": ([_turning_pairs], [lambda L, d, base: _turning_pairs(L, d, base) - 1,
                               lambda L, d, base: math.floor(d / 2 * math.log(L / (2 * math.pi), base))]),
    "3.1": ([_slow_pairs, lambda base, L, d: int((2 * math.pi * base ** (torch.arange(0, d, 2) / d) > L).sum())],
            [lambda base, L, d: _slow_pairs(base, L, d) + 1,
             lambda base, L, d: int((2 * math.pi * base ** (torch.arange(d // 2) / d) > L).sum())]),
    "3.3": ([_to_inter], [lambda W: pe.interleaved_to_half_split(W.T).T, lambda W: W]),
    "4.1": ([_authors_slopes, lambda n: pe.alibi_slopes(n)],
            [lambda n: [2 ** (-8 * h / n) for h in range(1, n + 1)],
             lambda n: _authors_slopes(n + 1)[:n]]),
    "5.3": ([lambda w, c: w * math.exp(c) / (1 - w + w * math.exp(c)),
             lambda w, c: torch.tensor([math.log(w) + c, math.log(1 - w)]).double().softmax(0)[0]],
            [lambda w, c: w * math.exp(c), lambda w, c: w, lambda w, c: w * math.exp(c) / (1 + w * math.exp(c))]),
    "7.4": ([_reach], [lambda m, s: _reach(m, s) + 1, lambda m, s: int(s / m)]),
    "8.1": ([lambda n, L, d, base, a: base if n <= L else base * (a * n / L - (a - 1)) ** (d / (d - 2))],
            [lambda n, L, d, base, a: base * max(1, n / L) ** (d / (d - 2)),
             lambda n, L, d, base, a: base * (a * n / L - (a - 1)) ** (d / (d - 2))]),
    "8.2": ([_llama3_counts], [lambda d, base, L: _llama3_counts(d, base, 4 * L),
                               lambda d, base, L: tuple(reversed(_llama3_counts(d, base, L)))]),
    "8.3": ([lambda s: (0.1 * math.log(s) + 1) ** -2], [lambda s: 0.1 * math.log(s) + 1, lambda s: 1 / (0.1 * math.log(s) + 1)]),
    "8.4": ([lambda d, base, L, s: int((2 * math.pi * s * base ** (torch.arange(0, d, 2) / d) > L).sum())],
            [lambda d, base, L, s: _slow_pairs(base, L, d), lambda d, base, L, s: _slow_pairs(base, L * s, d)]),
    "9.1": ([lambda L, M: (M + 1) / (L + 1)], [lambda L, M: M / L, lambda L, M: (M - 1) / (L - 1) if L > 1 else M]),
    "9.2": ([pe.rope_min_base], [lambda n, d: pe.rope_min_base(n, d) * 1.05, lambda n, d: pe.rope_min_base(2 * n, d)]),
    "9.3": ([lambda d, base, p: (d // 2 - int(p * d // 2), 2 * math.pi * base ** (2 * (int(p * d // 2) - 1) / d))],
            [lambda d, base, p: (int(p * d // 2), 2 * math.pi * base ** (2 * (int(p * d // 2) - 1) / d)),
             lambda d, base, p: (d // 2 - int(p * d // 2), 2 * math.pi * base ** (2 * int(p * d // 2) / d))]),
    "9.4": ([lambda k, n: 1 / k + (1 - 1 / k) / n, lambda k, n: (n + k - 1) / (k * n)],
            [lambda k, n: 1 / k, lambda k, n: 1 / k + 1 / n, lambda k, n: 1 / n]),
    "10.3": ([lambda n, w: (w + 1) / (n + 1)], [lambda n, w: w / n, lambda n, w: (w + 1) / n]),
    "11.1": ([lambda f: -math.log(f), lambda f: math.log(1 / f)], [lambda f: 1 - f, lambda f: math.log(f)]),
    "11.2": ([lambda n, s: (math.log(n - 1), math.log(n - 1) / (s * math.log(n)))],
             [lambda n, s: (math.log(n), 1 / s), lambda n, s: (math.log(n - 1), math.log(n - 1) / math.log(n)),
              lambda n, s: (math.log(n - 1), s * math.log(n - 1) / math.log(n))]),
    "12.1": ([_window_share], [lambda n, w: min(w, n) / n, lambda n, w: _window_share(n, w - 1) if w > 1 else 1.0]),
}


class _LearnedALiBi(pe.PositionScheme):
    """ALiBi with learned slopes, as the solution of chapter 12 writes it."""

    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.slope = torch.nn.Parameter(pe.alibi_slopes(n_heads))

    def distance_bias(self, length, *, device, dtype):
        return -self.slope.to(device, dtype)[:, None] * torch.arange(length, device=device, dtype=dtype)


class _LogSlopes(pe.PositionScheme):
    """The same bias with positive slopes learned through their logarithm, one table per layer."""

    def bind(self, *, d_model, n_heads, n_layers):
        super().bind(d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        self.log_slope = torch.nn.Parameter(pe.alibi_slopes(n_heads).log().repeat(n_layers, 1))

    def distance_bias(self, length, *, device, dtype):
        return -self.log_slope.exp()[..., None] * torch.arange(length, device=device, dtype=dtype)


class _FrozenSlopes(_LearnedALiBi):
    def bind(self, **sizes):
        super().bind(**sizes)
        self.slope.requires_grad_(False)


class _WrongSign(_LearnedALiBi):
    def distance_bias(self, length, *, device, dtype):
        return -super().distance_bias(length, device=device, dtype=dtype)


class _EvenSlopes(_LearnedALiBi):
    def bind(self, **sizes):
        super().bind(**sizes)
        self.slope = torch.nn.Parameter(torch.linspace(1, 1 / self.n_heads, self.n_heads))


class _NoBias(pe.PositionScheme):
    def distance_bias(self, length, *, device, dtype):
        return None


#: exercise -> (right position schemes, wrong ones): classes, or objects
SCHEMES = {
    "12.3": ([_LearnedALiBi, _LearnedALiBi(), _LogSlopes],
            [pe.alibi.ALiBi, pe.alibi.ALiBi(), _FrozenSlopes, _WrongSign, _EvenSlopes, _NoBias, pe.TinyLM]),
}


def _ids(table):
    return [(key, i) for key, (answers, _) in table.items() for i in range(len(answers))]


def test_every_exercise_is_tested():
    assert set(exercises()) == set(VALUES) | set(FUNCTIONS) | set(SCHEMES)


def test_exercises_lists_one_line_each_in_order():
    listing = exercises()
    assert list(listing) == sorted(listing, key=lambda k: tuple(map(int, k.split("."))))
    assert all(title and "\n" not in title for title in listing.values())
    assert list(exercises(chapter=3)) == ["3.1", "3.2", "3.3", "3.4", "3.5"]
    assert list(exercises(chapter=8)) == ["8.1", "8.2", "8.3", "8.4"]
    assert list(exercises(chapter=9)) == ["9.1", "9.2", "9.3", "9.4"]
    assert list(exercises(chapter=12)) == ["12.1", "12.3"]


def test_published_alibi_slopes():
    # Press et al.: 8 heads get exactly 1/2, 1/4, ..., 1/256.
    assert check("4.1", lambda n: pe.alibi_slopes(n))
    assert pe.alibi_slopes(8, dtype=torch.float64).tolist() == [2.0 ** -h for h in range(1, 9)]


@pytest.mark.parametrize("key", sorted(VALUES))
def test_right_values_pass(key, capsys):
    for answer in VALUES[key][0]:
        assert check(key, answer) is True, answer
        out = capsys.readouterr().out
        assert out.startswith(f"✓ {key}: correct") and out.count("\n") == 1


@pytest.mark.parametrize("key", sorted(VALUES))
def test_wrong_values_fail(key, capsys):
    for answer in VALUES[key][1]:
        assert check(key, answer) is False, answer
        out = capsys.readouterr().out
        assert out.startswith(f"✗ {key}:") and out.count("\n") == 1


@pytest.mark.parametrize("key", sorted(FUNCTIONS))
def test_right_functions_pass(key, capsys):
    for answer in FUNCTIONS[key][0]:
        assert check(key, answer) is True
        assert "test inputs" in capsys.readouterr().out


@pytest.mark.parametrize("key", sorted(FUNCTIONS))
def test_wrong_functions_fail(key, capsys):
    for answer in FUNCTIONS[key][1]:
        assert check(key, answer) is False
        assert capsys.readouterr().out.startswith(f"✗ {key}:")


@pytest.mark.parametrize("key", sorted(SCHEMES))
def test_right_schemes_pass(key, capsys):
    for answer in SCHEMES[key][0]:
        assert check(key, answer) is True, answer
        out = capsys.readouterr().out
        assert out.startswith(f"✓ {key}: correct for ") and out.count("\n") == 1


@pytest.mark.parametrize("key", sorted(SCHEMES))
def test_wrong_schemes_fail_with_a_hint(key, capsys):
    for answer in SCHEMES[key][1]:
        assert check(key, answer) is False, answer
        out = capsys.readouterr().out
        assert out.startswith(f"✗ {key}:") and out.count("\n") == 1
        assert "Hint:" in out or "expected a posenc.PositionScheme" in out, out


def test_scheme_checker_names_the_wrong_entry_and_leaves_the_readers_object_alone(capsys):
    assert not check("12.3", _WrongSign)
    out = capsys.readouterr().out
    assert "head 0 at distance 1" in out and "too large" in out and "0.5" not in out
    assert not check("12.3", _FrozenSlopes)
    assert "does not depend on a learned torch.nn.Parameter" in capsys.readouterr().out
    model = pe.TinyLM(8, 48, 1, 6, position=_LearnedALiBi())    # an object already in a model: its own sizes
    with torch.no_grad():
        model.position.slope.mul_(2)                           # "trained"
    trained = model.position.slope.detach().clone()
    assert check("12.3", model.position)
    assert "correct for 1 model size." in capsys.readouterr().out
    assert torch.equal(model.position.slope, trained) and model.position.n_heads == 6


@pytest.mark.parametrize("key", sorted(exercises()))
@pytest.mark.parametrize("answer", [..., None])
def test_not_answered_yet(key, answer, capsys):
    assert check(key, answer) is False
    assert capsys.readouterr().out == f"{key}: not answered yet (replace ... by your answer).\n"


@pytest.mark.parametrize("key", sorted(exercises()))
def test_answers_of_the_wrong_kind_fail_without_raising(key, capsys):
    for answer in ["29", True, {"a": 1}, [1, 2, 3, 4, 5]]:
        assert check(key, answer) is False
        assert "expected" in capsys.readouterr().out


def test_integers_are_exact_and_kinds_are_named(capsys):
    right = _slow_pairs(500000.0, 8192)
    assert check("3.1", float(right))
    assert not check("3.1", right + 0.5)
    assert not check("3.1", right + 1e-9)
    capsys.readouterr()
    assert not check("3.1", "29")
    assert "expected an integer" in capsys.readouterr().out
    assert not check("6.4", ([1] * 32, [1] * 31))
    assert "32 integers" in capsys.readouterr().out
    assert not check("3.3", 29)
    assert "a function to_inter(W)" in capsys.readouterr().out


def test_wrong_answers_do_not_reveal_the_expected_value(capsys):
    for key, wrong in [("3.1", 30), ("5.2", (400, 3984)), ("7.4", 1000), ("1.2", 100)]:
        check(key, wrong)
        out = capsys.readouterr().out
        right = VALUES[key][0][0]
        for value in (right if isinstance(right, tuple) else (right,)):
            assert str(value) not in out, out
        assert "Hint:" in out and ("too large" in out or "too small" in out)


def test_functions_that_raise_or_return_nonsense_fail_without_raising(capsys):
    def broken(base, L, d):
        raise RuntimeError("not yet")
    assert not check("3.1", broken)
    assert "raised RuntimeError: not yet" in capsys.readouterr().out
    assert not check("3.1", lambda base: 0)                     # wrong number of arguments
    assert "raised TypeError" in capsys.readouterr().out
    assert not check("3.3", lambda W: pe.half_split_to_interleaved(W))  # odd input width raises
    assert not check("10.3", lambda n, w: None)
    assert not check("10.3", lambda n, w: float("nan"))
    assert not check("2.2", lambda: 60611)                      # a number was asked for
    assert not check("1.5", 0.5)                                # a function was asked for


def test_nan_and_infinity_fail():
    assert not check("2.2", float("nan"))
    assert not check("2.2", float("inf"))
    assert not check("3.5", (float("nan"), 2.0))


def test_integers_beyond_any_float_fail_without_raising(capsys):
    """10**400 cannot become a float (an OverflowError in the comparison before): a wrong answer, said so."""
    for key, huge in [("3.1", 10 ** 400), ("3.1", -10 ** 400), ("2.2", 10 ** 400), ("5.1", (10 ** 400, 1)),
                      ("3.1", lambda base, L, d: 10 ** 400), ("10.3", lambda n, w: 10 ** 400)]:
        assert check(key, huge) is False
        out = capsys.readouterr().out
        assert out.startswith(f"✗ {key}: an integer beyond any float") and "Hint:" in out, out


@pytest.mark.parametrize("bad", ["11.9", "3", "3.10", "", 3.1, None])
def test_unknown_exercise_raises(bad):
    with pytest.raises(ValueError, match=r"unknown exercise .*1\.2, 1\.3"):
        check(bad, 1)


def test_registered_as_submodule():
    assert pe.exercises.check is check
    assert "exercises" in pe.__all__ and "check" not in pe.__all__


def test_the_learned_alibi_checker_gives_its_own_hint(capsys):
    """A wrong scheme for 12.3 is told 12.3's hint, not another exercise's."""
    assert not check("12.3", _WrongSign)
    out = capsys.readouterr().out
    assert pe.exercises._EXERCISES["12.3"].hint in out
    assert all(pe.exercises._EXERCISES[other].hint not in out for other in pe.exercises._EXERCISES if other != "12.3")
